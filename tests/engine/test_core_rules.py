"""The core's rules and lists, read once from Rust: ``check_sampling`` refuses exactly what ``Generator(...)``
refuses, with the same exception and message; the mode and draft-policy lists are the core's."""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, get_args

import pytest

from specstate import Model, _native
from specstate._typing import DraftPolicy, Mode, SamplingSettings
from specstate.llama.options import _Sampling

#: Small sizes, so that only the sampling settings can be refused.
SIZES: dict[str, Any] = {"n_ctx": 64, "n_batch": 8, "n_threads": 1}

#: Sampling settings the core refuses without a model (ranges, narrowing, the bias's entries, the grammar's text)
#: and wrong types.
BAD: list[dict[str, Any]] = [
    {"temperature": math.inf},
    {"temperature": -0.5},
    {"temperature": math.nan},
    {"temperature": "hot"},
    {"top_k": -1},
    {"top_k": 2**32},
    {"top_k": True},
    {"top_p": 0.0},
    {"top_p": 2},
    {"min_p": -0.1},
    {"min_p": math.nan},
    {"typical_p": 0.0},
    {"repeat_penalty": 0.0},
    {"repeat_penalty": 101.0},
    {"presence_penalty": 1000.0},
    {"frequency_penalty": -math.inf},
    {"repeat_last_n": -2},
    {"repeat_last_n": 2**31},
    {"seed": -1},
    {"seed": 2**64},
    {"logit_bias": {1: math.nan}},
    {"logit_bias": {1: 1e5}},
    {"logit_bias": {-1: 1.0}},
    {"logit_bias": {2**40: 1.0}},
    {"grammar": "   "},
    {"grammar": 'root ::= "a"\0'},
    {"grammar": "x" * (_native.MAX_GRAMMAR_BYTES + 1)},
    {"temperature": -1.0, "top_p": 2.0},
]


def _refusal(call: Any, **settings: Any) -> tuple[type[BaseException], str]:
    with pytest.raises((ValueError, TypeError)) as refused:
        call(**settings)
    return refused.type, str(refused.value)


@pytest.mark.parametrize("bad", BAD, ids=lambda bad: ",".join(f"{k}={str(v)[:12]}" for k, v in bad.items()))
def test_check_sampling_refuses_what_the_generator_refuses_with_its_message(
    llama_model: Model, bad: dict[str, Any]
) -> None:
    def construct(**settings: Any) -> None:
        _native.Generator(llama_model, **SIZES, **settings)

    expected = _refusal(construct, **bad)
    assert _refusal(_native.check_sampling, **bad) == expected
    if expected[0] is ValueError:
        generator = _native.Generator(llama_model, **SIZES)
        assert _refusal(generator.set_sampling, **bad) == expected


def test_check_sampling_passes_what_the_generator_takes(llama_model: Model) -> None:
    good: dict[str, Any] = {
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "typical_p": 0.9,
        "repeat_penalty": 1.1,
        "repeat_last_n": -1,
        "presence_penalty": -2,
        "frequency_penalty": 2.0,
        "logit_bias": {3: 1.0, 1: -1.0},
        "seed": 2**64 - 1,
        "grammar": "",
    }
    _native.check_sampling()
    _native.check_sampling(**good)
    _native.Generator(llama_model, **SIZES, **good)


def test_check_sampling_takes_the_sampling_settings_with_the_constructors_defaults() -> None:
    parameters = inspect.signature(_native.check_sampling).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
    assert set(parameters) == SamplingSettings.__optional_keys__
    assert {name: p.default for name, p in parameters.items()} == {
        name: _native.GENERATOR_DEFAULTS[name] for name in parameters
    }


def test_the_llama_apis_sampling_holds_the_sampling_settings() -> None:
    """``Llama``'s call settings name each sampling setting, and pass nothing else to the generator."""
    assert {field.name for field in dataclasses.fields(_Sampling)} == SamplingSettings.__optional_keys__


def test_the_mode_and_draft_policy_lists_are_the_cores() -> None:
    assert get_args(Mode) == _native.MODES
    assert get_args(DraftPolicy) == _native.DRAFT_POLICIES
    assert _native.GENERATOR_DEFAULTS["mode"] == _native.MODES[0]
    assert _native.GENERATOR_DEFAULTS["draft_policy"] in _native.DRAFT_POLICIES
