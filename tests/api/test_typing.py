"""The dictionaries the native module returns have exactly the keys and value types of their TypedDicts."""

from __future__ import annotations

import inspect
import types
from pathlib import Path
from typing import Literal, Union, get_args, get_origin, get_type_hints

import pytest

import specstate
from specstate import (
    CheckpointInfo,
    GeneratorConfig,
    GeneratorSettings,
    ModelFingerprint,
    NativeInfo,
    SamplingSettings,
    inspect_checkpoint,
    native_info,
)
from specstate.cli import NATIVE_DEFAULTS, _generator_settings, build_parser
from specstate_testkit.generator_support import MODES, tiny_generator


def assert_keys(value: dict[str, object], shape: type) -> None:
    """``value`` has every required key of the TypedDict ``shape`` and no key it does not declare."""
    required: frozenset[str] = shape.__required_keys__  # type: ignore[attr-defined]
    optional: frozenset[str] = shape.__optional_keys__  # type: ignore[attr-defined]
    assert required <= set(value), f"{shape.__name__}: missing {sorted(required - set(value))}"
    assert set(value) <= required | optional, f"{shape.__name__}: undeclared {sorted(set(value) - required - optional)}"


def assert_conforms(value: object, hint: object, where: str) -> None:
    """``value`` is of the type ``hint`` (the subset of typing these TypedDicts use), recursively."""
    origin, args = get_origin(hint), get_args(hint)
    if isinstance(hint, type) and hasattr(hint, "__required_keys__"):  # a TypedDict
        assert isinstance(value, dict), where
        assert_keys(value, hint)
        for key, key_hint in get_type_hints(hint).items():
            if key in value:
                assert_conforms(value[key], key_hint, f"{where}.{key}")
    elif origin in (Union, types.UnionType):
        failures = []
        for option in args:
            try:
                assert_conforms(value, option, where)
                return
            except AssertionError as error:
                failures.append(str(error))
        raise AssertionError(f"{where}: {value!r} is none of {args}: {failures}")
    elif origin is Literal:
        assert value in args, f"{where}: {value!r} not in {args}"
    elif origin is dict:
        assert isinstance(value, dict), f"{where}: {value!r} is not a dict"
        for key, item in value.items():
            assert_conforms(key, args[0], f"{where} key")
            assert_conforms(item, args[1], f"{where}[{key!r}]")
    elif origin is list:
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for index, item in enumerate(value):
            assert_conforms(item, args[0], f"{where}[{index}]")
    elif origin is tuple:
        assert isinstance(value, tuple) and len(value) == len(args), f"{where}: {value!r} is not a {hint}"
        for index, (item, item_hint) in enumerate(zip(value, args)):
            assert_conforms(item, item_hint, f"{where}[{index}]")
    elif hint is int:  # bool is an int subclass, but not an int field
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: {value!r} is not an int"
    elif hint is type(None):
        assert value is None, f"{where}: {value!r} is not None"
    else:
        assert isinstance(hint, type) and isinstance(value, hint), f"{where}: {value!r} is not a {hint}"


def expected_config_keys(mode: str) -> frozenset[str]:
    """A configuration's keys: the n-gram lengths only in ``ngram`` mode."""
    optional = GeneratorConfig.__optional_keys__ if mode == "ngram" else frozenset()
    return GeneratorConfig.__required_keys__ | optional


def test_ngram_lengths_are_the_only_optional_config_keys() -> None:
    assert GeneratorConfig.__optional_keys__ == {"ngram_max", "ngram_min"}
    assert ModelFingerprint.__required_keys__ == {"file", "size", "sha256"}
    assert not CheckpointInfo.__optional_keys__ and not ModelFingerprint.__optional_keys__


def test_a_config_records_every_sampling_setting_with_its_type() -> None:
    """The configuration's sampling part is :class:`SamplingSettings`, every key present: the scalars of the same
    type, the bias as the dict it is read back as, the grammar as given."""
    settings = get_type_hints(SamplingSettings)
    config = get_type_hints(GeneratorConfig)
    run = {"mode", "n_draft", "n_ctx", "n_batch", "draft_policy"}
    assert GeneratorConfig.__required_keys__ - run == SamplingSettings.__optional_keys__
    read_back = {"logit_bias": dict[int, float]}
    assert {name: config[name] for name in settings} == {**settings, **read_back}


@pytest.mark.parametrize("mode", MODES)
def test_generator_config_has_exactly_the_typed_keys(mode: str, tiny_map: dict[str, Path]) -> None:
    config = tiny_generator(mode, tiny_map).config
    assert set(config) == expected_config_keys(mode)
    assert_conforms(config, GeneratorConfig, "config")
    assert config["mode"] == mode


@pytest.mark.parametrize("mode", MODES)
def test_inspect_checkpoint_has_exactly_the_typed_keys(mode: str, tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator(mode, tiny_map)
    generator.generate("typed", max_tokens=6)
    data = generator.checkpoint()
    info = inspect_checkpoint(data)
    assert set(info) == CheckpointInfo.__required_keys__
    assert set(info["config"]) == expected_config_keys(mode)
    assert set(info["target_model"]) == ModelFingerprint.__required_keys__
    draft = info["draft_model"]
    assert (draft is not None) == (mode in ("draft", "eagle3"))
    assert draft is None or set(draft) == ModelFingerprint.__required_keys__
    assert_conforms(info, CheckpointInfo, "info")
    assert info["config"] == generator.config and info["size"] == len(data)


def test_native_info_has_exactly_the_typed_keys() -> None:
    info = native_info()
    assert set(info) == NativeInfo.__required_keys__
    assert_conforms(info, NativeInfo, "native_info")


def test_generator_settings_are_the_native_keyword_arguments_with_their_defaults() -> None:
    parameters = inspect.signature(specstate._native.Generator).parameters
    keyword = {name: p.default for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(keyword) == GeneratorSettings.__optional_keys__ and not GeneratorSettings.__required_keys__
    assert keyword == {
        "mode": "none",
        "draft_model": None,
        "n_draft": 8,
        "n_ctx": 2048,
        "n_batch": 17,
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "seed": 0,
        "min_p": 0.0,
        "typical_p": 1.0,
        "repeat_penalty": 1.0,
        "repeat_last_n": 64,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logit_bias": None,
        "grammar": None,
        "ngram_max": 4,
        "ngram_min": 3,
        "n_threads": 0,
        "draft_policy": "fixed",
        "cost_curve": None,
        "engine": None,
        "grammar_drafts": True,
    }


def test_the_command_line_passes_the_settings_it_has_options_for() -> None:
    args = build_parser().parse_args(
        [
            "generate",
            "hi",
            "--model",
            "m.gguf",
            "--draft-model",
            "d.gguf",
            "--mode",
            "ngram",
            "--n-draft",
            "5",
            "--n-ctx",
            "99",
            "--temperature",
            "0.5",
            "--top-k",
            "7",
            "--top-p",
            "0.9",
            "--seed",
            "11",
            "--threads",
            "3",
        ]
    )
    assert _generator_settings(args) == {
        "mode": "ngram",
        "n_draft": 5,
        "n_ctx": 99,
        "temperature": 0.5,
        "top_k": 7,
        "top_p": 0.9,
        "seed": 11,
        "n_threads": 3,
    }
    # An option left out is left to the native generator: its default is written once, in Rust (and shown in
    # --help from the native signature); without --threads, all CPUs, or a checkpoint's recorded count.
    assert _generator_settings(build_parser().parse_args(["generate", "hi", "--model", "m.gguf"])) == {}
    native = inspect.signature(specstate._native.Generator).parameters
    assert {n: p.default for n, p in native.items() if p.default is not inspect.Parameter.empty} == NATIVE_DEFAULTS
    assert {"mode", "n_draft", "n_ctx", "temperature", "min_p", "repeat_penalty"} <= set(NATIVE_DEFAULTS)
