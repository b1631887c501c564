"""The adaptive draft policy: each round's draft length from a cost curve and the recent acceptance.

The choices are a pure function of state that checkpoints carry, so an
adaptive generation resumes token for token like any other; hypothesis draws
the cost curve (and with it the choices), the checkpoint boundary and the
draft limit. Two curves pin the policy to known behaviour: free verification
rows make it draft like the fixed policy, and unaffordable ones make `ngram`
decode exactly as `none` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import checkpoint_codec as codec
from conftest import examples
from specstate import ConfigMismatchError, Generator, GeneratorSettings, Model, inspect_checkpoint
from specstate_testkit.generator_support import sampling, tiny_generator, tiny_resume_matches

TESTS = Path(__file__).resolve().parent.parent / "support"  # the worker scripts
SPECULATIVE = ("ngram", "draft", "mtp", "eagle3")
#: Text that repeats, so that prompt lookup drafts and is often right (on the tiny models, whose greedy
#: output cycles through 131 tokens, generations of 150 tokens repeat themselves).
REPEATING = "one two three four five six. one two three four five six. one two three"
#: Larger than any round could gain: drafting never pays.
UNAFFORDABLE = 60_000_000


def flat(n_draft: int) -> list[int]:
    """Every batch size costs the same: verification rows are free."""
    return [1000] * (n_draft + 1)


def unaffordable(n_draft: int) -> list[int]:
    """A plain decode is cheap and any verify batch costs a minute."""
    return [1000] + [UNAFFORDABLE] * n_draft


def paying_only_when_sure(n_draft: int) -> list[int]:
    """Verify batches cheaper than a plain decode: the tiny draft model's decode costs 0.73 of the target's (their
    file sizes), so a draft pays at 90% acceptance (a draft model is probed) but not at the prior's two in three."""
    return [1000] + [900] * n_draft


@st.composite
def curves(draw: st.DrawFn, n_draft: int) -> list[int]:
    """A cost curve for `n_draft`: increasing costs with random steps, so choices vary."""
    steps = draw(st.lists(st.integers(0, 20_000), min_size=n_draft + 1, max_size=n_draft + 1))
    costs, total = [], 0
    for step in steps:
        total += max(step, 1)
        costs.append(total)
    return costs


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", SPECULATIVE)
@given(rounds=st.integers(0, 12), n_draft=st.integers(1, 6), data=st.data())
@settings(max_examples=examples(ci=8, dev=3), deadline=None)
def test_adaptive_resume_is_exact_in_every_mode(
    tiny_map: dict[str, Path], mode: str, sampled: bool, rounds: int, n_draft: int, data: st.DataObject
) -> None:
    costs = data.draw(curves(n_draft))

    resumed, uninterrupted = tiny_resume_matches(
        tiny_map,
        mode,
        REPEATING,
        rounds,
        150,
        sampled=sampled,
        n_draft=n_draft,
        draft_policy="adaptive",
        cost_curve=costs,
    )
    assert resumed == uninterrupted


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_free_rows_draft_like_the_fixed_policy(tiny_map: dict[str, Path], sampled: bool) -> None:
    runs = {}
    for policy in ("fixed", "adaptive"):
        extra: dict[str, Any] = {"cost_curve": flat(4)} if policy == "adaptive" else {}
        generator = tiny_generator("ngram", tiny_map, sampled=sampled, draft_policy=policy, **extra)
        generator.generate(REPEATING, max_tokens=150)
        runs[policy] = (generator.tokens, generator.rounds, generator.drafted, generator.accepted)
    assert runs["adaptive"] == runs["fixed"]
    assert runs["fixed"][2] > 0


def test_when_drafts_never_pay_ngram_decodes_exactly_as_none(smollm2: Model) -> None:
    plain = Generator(smollm2, n_ctx=512, n_threads=1)
    plain.generate(REPEATING, max_tokens=48)
    adaptive = Generator(
        smollm2, mode="ngram", draft_policy="adaptive", cost_curve=unaffordable(8), n_ctx=512, n_threads=1
    )
    adaptive.generate(REPEATING, max_tokens=48)
    # One token per round, decoded alone: the same kernels as plain decoding, so the same tokens.
    assert adaptive.tokens == plain.tokens
    assert (adaptive.drafted, adaptive.rounds) == (0, len(adaptive.tokens) - 1)
    # The free proposals it compared along the way taught it that they are right here.
    assert adaptive.draft_acceptance is not None and adaptive.draft_acceptance > 0.5


def test_a_draft_model_is_probed_only_where_drafts_could_pay(tiny_map: dict[str, Path]) -> None:
    probed = tiny_generator("draft", tiny_map, draft_policy="adaptive", cost_curve=paying_only_when_sure(4))
    probed.generate(REPEATING, max_tokens=150)
    # The tiny pair agrees on nearly every token: the probe's evidence makes drafting pay.
    assert probed.drafted > 0 and probed.accepted > 0
    # Where no draft would pay even at 90% acceptance, its catch-up on the prompt is never paid for.
    never = tiny_generator("draft", tiny_map, draft_policy="adaptive", cost_curve=unaffordable(4))
    never.generate(REPEATING, max_tokens=150)
    assert never.drafted == 0 and never.tokens == probed.tokens


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_probe_after_a_long_pause_skips_it_and_resumes_exactly(tiny_map: dict[str, Path], sampled: bool) -> None:
    """A draft model catching up on a pause decodes only its last tokens, its memory moved up past the rest; the
    checkpoint carries the gap, so a restored generation drafts as the uninterrupted one does."""

    def make() -> Generator:
        return tiny_generator(
            "draft", tiny_map, sampled=sampled, draft_policy="adaptive", cost_curve=paying_only_when_sure(4)
        )

    def draft_pause_draft(generator: Generator, first_max_tokens: int) -> None:
        generator.generate(REPEATING, max_tokens=first_max_tokens)
        for _ in range(40):  # rounds of one committed token draft nothing: a pause the draft model sits out
            generator._native.take(1, max_commit=1)
        generator.generate(max_tokens=10)

    first = make()
    draft_pause_draft(first, 30)
    target, draft = first._native.memory_positions
    assert draft is not None and draft[0] > 0 and draft[1] <= target[1]
    restored = Generator.restore(
        first.checkpoint(), Model(tiny_map["qwen35"]), draft_model=Model(tiny_map["llama"]), n_threads=1
    )
    assert restored._native.memory_positions == first._native.memory_positions
    for generator in (first, restored):
        generator.generate(max_tokens=60)
    uninterrupted = make()
    draft_pause_draft(uninterrupted, 30)
    uninterrupted.generate(max_tokens=60)
    runs = [(g.tokens, g.rounds, g.drafted, g.accepted) for g in (first, restored, uninterrupted)]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][2] > 0


def test_a_measured_curve_leaves_no_trace(smollm2: Model) -> None:
    measured = Generator(smollm2, mode="ngram", draft_policy="adaptive", n_ctx=512, n_threads=1)
    assert measured.cost_curve is None
    measured.generate(REPEATING, max_tokens=48)
    curve = measured.cost_curve
    assert curve is not None and len(curve) == 9 and all(cost >= 1 for cost in curve)
    assert curve[-1] > curve[0], "verifying nine rows costs more than decoding one"
    pinned = Generator(smollm2, mode="ngram", draft_policy="adaptive", cost_curve=curve, n_ctx=512, n_threads=1)
    pinned.generate(REPEATING, max_tokens=48)
    assert pinned.cost_curve == curve  # a pinned curve never moves
    assert pinned.tokens == measured.tokens  # greedy: the same text, whatever the draft lengths


@pytest.mark.parametrize(
    ("mode", "sampled"),
    [("ngram", False), ("ngram", True), ("draft", True)],
    ids=["greedy", "sampled", "sampled-draft"],
)
def test_a_curve_follows_the_rounds_timings_unless_the_text_depends_on_draft_lengths(
    smollm2: Model, mode: str, sampled: bool
) -> None:
    """A curve moves toward each round's own verify time where the text does not depend on draft lengths (greedy
    choices, or prompt lookup's drafts, which carry no distributions); a sampled draft model's never does (rejection
    sampling draws against its draft's distributions). A curve of one-minute costs, forged into a checkpoint as
    live, shows it: the entries the rounds used come down, or stay."""
    settings: GeneratorSettings = {"mode": mode, "draft_policy": "adaptive", "n_ctx": 512, "n_threads": 1}  # type: ignore[typeddict-item]
    settings.update(sampling(sampled))  # type: ignore[typeddict-item]
    draft = {"draft_model": smollm2} if mode == "draft" else {}
    generator = Generator(smollm2, **settings, **draft)
    generator.generate(REPEATING, max_tokens=4)
    adaptive = codec.meta(generator.checkpoint())["adaptive"]
    slow = [UNAFFORDABLE] * len(adaptive["cost_us"])
    forged = codec.rewrite_meta(
        generator.checkpoint(), adaptive={**adaptive, "cost_us": slow, "live": True, "estimated": [], "draft_us": 1}
    )
    restored = Generator.restore(forged, smollm2, n_threads=1, **draft)  # type: ignore[arg-type]
    restored.generate(max_tokens=40)
    curve = restored.cost_curve
    assert curve is not None and len(curve) == len(slow)
    if mode == "draft":
        assert curve == slow
    else:
        assert min(curve) < UNAFFORDABLE and restored.rounds > 0


def test_the_policy_travels_in_checkpoints(smollm2: Model, smollm2_file: Path, tmp_path: Path) -> None:
    settings: GeneratorSettings = {"mode": "ngram", "draft_policy": "adaptive", "n_ctx": 512, "n_threads": 1}
    settings.update(sampling(True))  # type: ignore[typeddict-item]
    generator = Generator(smollm2, **settings)
    generator.generate(REPEATING, max_tokens=20)
    curve = generator.cost_curve
    assert curve is not None
    pinned: GeneratorSettings = {**settings, "cost_curve": curve}
    reference = Generator(smollm2, **pinned)
    reference.generate(REPEATING, max_tokens=64)
    data = generator.checkpoint()
    info = inspect_checkpoint(data)
    assert (info["format_version"], info["config"]["draft_policy"], info["cost_curve"]) == (5, "adaptive", curve)
    restored = Generator.restore(data, smollm2, n_threads=1)
    assert (restored.cost_curve, restored.draft_acceptance) == (curve, generator.draft_acceptance)
    assert restored.config["draft_policy"] == "adaptive"
    fixed_settings: GeneratorSettings = {**settings, "draft_policy": "fixed"}
    fixed = Generator(smollm2, **fixed_settings)
    with pytest.raises(ConfigMismatchError) as refused:
        fixed.load(data)
    assert refused.value.field == "draft_policy"
    path = tmp_path / "adaptive.ckpt"
    generator.save(path)
    worker = [sys.executable, str(TESTS / "generator_worker.py"), "ngram", "-", "-", "-", str(path), "64"]
    result = subprocess.run([*worker, str(smollm2_file)], capture_output=True, text=True, check=True, cwd=TESTS)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == reference.tokens


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(mode="ngram", draft_policy="sometimes"), "draft_policy must be one of fixed, adaptive"),
        (dict(mode="none", draft_policy="adaptive"), "needs a speculative mode"),
        (dict(mode="ngram", cost_curve=[1] * 9), "only an adaptive draft policy"),
        (dict(mode="ngram", draft_policy="adaptive", cost_curve=[1] * 8), "needs 9"),
        (dict(mode="ngram", draft_policy="adaptive", cost_curve=[1] * 8 + [0]), "between 1 and 60000000"),
        (dict(mode="ngram", draft_policy="adaptive", cost_curve=[1] * 8 + [-5]), "cost_curve"),
        (dict(mode="ngram", draft_policy="adaptive", cost_curve=[1] * 8 + [2**40]), "cost_curve"),
    ],
)
def test_bad_policy_settings_are_refused(llama_model: Model, settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Generator(llama_model, n_ctx=64, n_batch=16, **settings)  # type: ignore[arg-type]
