"""The sampler chain (logit bias, penalties, top-k, typical, top-p, min-p, temperature) under speculation.

Greedy speculation with penalties and a logit bias commits what plain
decoding does, in every mode; sampled generations with every sampler on
resume exactly in another process, from a boundary after a change of
sampling parameters; ``set_sampling`` checks everything before anything
changes. (The chain's formulas and the distribution rejection sampling keeps
are checked in Rust: ``cargo test --lib sampling``.)
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from generator_worker import resume_elsewhere
from specstate import inspect_checkpoint
from specstate_testkit.generator_support import MODES, tiny_generator

TESTS = Path(__file__).resolve().parent
TEXT = "abc abc abd. abc abc"


def chain(paths: dict[str, Path]) -> dict[str, Any]:
    """Penalties and a logit bias that change what greedy decoding on the tiny models commits.

    The tiny models map each token to a fixed successor, so the text cycles;
    the bias bans two tokens of the greedy text, and the penalties (their
    window longer than the cycle) steer it off the cycle that drafts propose.
    """
    probe = tiny_generator("none", paths)
    probe.generate(probe.model.tokenize(TEXT), max_tokens=21)
    return {
        "repeat_penalty": 3.0,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repeat_last_n": 40,
        "logit_bias": {probe.tokens[10]: -50.0, probe.tokens[20]: -50.0},
    }


#: Every sampler on, sampled.
SAMPLED: dict[str, Any] = {
    "temperature": 1.2,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.02,
    "typical_p": 0.97,
    "seed": 99,
}


@pytest.mark.parametrize("mode", MODES)
def test_greedy_speculation_with_penalties_and_bias_equals_plain_decoding(tiny_map: dict[str, Path], mode: str) -> None:
    neutral = tiny_generator("none", tiny_map)
    settings = chain(tiny_map)
    prompt = neutral.model.tokenize(TEXT)
    neutral.generate(prompt, max_tokens=80)
    plain = tiny_generator("none", tiny_map, **settings)
    plain.generate(prompt, max_tokens=80)
    assert plain.tokens != neutral.tokens  # the chain changes the text
    speculative = tiny_generator(mode, tiny_map, **settings)
    speculative.generate(prompt, max_tokens=80)
    assert speculative.tokens == plain.tokens


@pytest.mark.parametrize("mode", MODES)
def test_sampled_generation_with_every_sampler_resumes_in_another_process(
    tiny_map: dict[str, Path], mode: str, tmp_path: Path
) -> None:
    boundary = random.Random(f"chain-{mode}").randint(12, 40)
    runs = []
    for _ in range(2):
        generator = tiny_generator(mode, tiny_map, **SAMPLED)
        settings = chain(tiny_map)
        prompt = generator.model.tokenize(TEXT)
        generator.generate(prompt, max_tokens=8)
        generator.set_sampling(**settings)  # the RNG goes on: the seed is unchanged
        runs.append(generator)
    reference, generator = runs
    reference.generate(max_tokens=80 - len(reference.tokens))
    generator.generate(max_tokens=boundary - len(generator.tokens))
    path = tmp_path / "chain.ckpt"
    generator.save(path)
    config = inspect_checkpoint(path.read_bytes())["config"]
    assert config["repeat_penalty"] == settings["repeat_penalty"] and config["logit_bias"] == settings["logit_bias"]
    assert resume_elsewhere(tiny_map, mode, path, 80) == reference.tokens


def test_set_sampling_checks_everything_first(tiny_map: dict[str, Path]) -> None:
    generator = tiny_generator("ngram", tiny_map, **SAMPLED)
    generator.generate(generator.model.tokenize(TEXT), max_tokens=5)
    before, config = generator.checkpoint(), generator.config
    n_vocab = generator.model.n_vocab
    bad: list[tuple[dict[str, Any], str]] = [
        ({"min_p": 1.5}, "min_p"),
        ({"typical_p": 0.0}, "typical_p"),
        ({"repeat_penalty": -1.0}, "repeat_penalty"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"presence_penalty": float("nan")}, "presence_penalty"),
        ({"frequency_penalty": 1e9}, "frequency_penalty"),
        ({"logit_bias": {n_vocab: 1.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {3: float("inf")}}, "logit_bias"),
        ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
    ]
    for params, field in bad:
        with pytest.raises(ValueError, match=f"^{field} "):
            generator.set_sampling(**params)
        assert generator.checkpoint() == before and generator.config == config
    generator.set_sampling(min_p=0.1, logit_bias={5: -1.0})
    assert generator.config == {**config, "min_p": pytest.approx(0.1), "logit_bias": {5: -1.0}}


def test_a_new_seed_restarts_the_rng(tiny_map: dict[str, Path]) -> None:
    prompt_text = "hello there"
    fresh = tiny_generator("none", tiny_map, **{**SAMPLED, "seed": 5})
    fresh.generate(fresh.model.tokenize(prompt_text), max_tokens=20)
    reseeded = tiny_generator("none", tiny_map, **SAMPLED)
    reseeded.set_sampling(seed=5)
    reseeded.generate(reseeded.model.tokenize(prompt_text), max_tokens=20)
    assert reseeded.tokens == fresh.tokens


def test_load_takes_the_checkpoints_sampling(tiny_map: dict[str, Path]) -> None:
    source = tiny_generator("mtp", tiny_map, **SAMPLED)
    settings = chain(tiny_map)
    source.set_sampling(**settings)
    source.generate(source.model.tokenize(TEXT), max_tokens=10)
    data = source.checkpoint()
    other = tiny_generator("mtp", tiny_map)  # greedy, neutral chain
    other.load(data)
    assert other.config == source.config
    source.generate(max_tokens=30)
    other.generate(max_tokens=30)
    assert other.tokens == source.tokens
