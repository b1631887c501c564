"""The one round engine's rules, seen from both Python entry points.

``Generator`` and ``GreedyGeneration`` drive the same prefill and round
(``src/engine``). Given contexts built alike they commit the same tokens; a
full context or a committed end-of-generation token ends a generation with
no error; a round never drafts past what the context can still hold.
"""

from __future__ import annotations

from typing import Literal

import pytest

from specstate import Context, Eagle3Session, Generator, GreedyGeneration, Model, MtpSession

N_CTX = 256
SESSION_MODES: list[Literal["mtp", "eagle3"]] = ["mtp", "eagle3"]
N_DRAFT = 3
N_BATCH = 8


def greedy_generation(
    kind: str, target_model: Model, draft_model: Model | None, n_ctx: int = N_CTX
) -> GreedyGeneration:
    """A session built with the contexts ``Generator`` builds for the same settings."""
    rows = dict(n_ctx=n_ctx, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=1)
    slots = dict(n_rs_seq=N_DRAFT) if target_model.is_hybrid else {}
    target = Context(target_model, **rows, **slots)  # type: ignore[arg-type]
    if kind == "mtp":
        draft = Context(target_model, kind="mtp", **rows, **slots)  # type: ignore[arg-type]
        return GreedyGeneration(MtpSession(target, draft, n_draft_max=N_DRAFT))
    assert draft_model is not None
    draft = Context(draft_model, other=target, **rows)  # type: ignore[arg-type]
    return GreedyGeneration(Eagle3Session(target, draft, n_draft_max=N_DRAFT))


def models(kind: str, qwen35_model: Model, eagle3_draft_model: Model) -> tuple[Model, Model | None]:
    return (qwen35_model, None) if kind == "mtp" else (qwen35_model, eagle3_draft_model)


@pytest.mark.parametrize("kind", SESSION_MODES)
def test_both_entry_points_commit_the_same_tokens(
    qwen35_model: Model, eagle3_draft_model: Model, kind: Literal["mtp", "eagle3"]
) -> None:
    target, draft = models(kind, qwen35_model, eagle3_draft_model)
    prompt = target.tokenize("one engine, two entry points")
    generation = greedy_generation(kind, target, draft)
    generation.prefill(prompt)
    generation.generate(60)
    generator = Generator(
        target,
        mode=kind,
        draft_model=draft,
        n_draft=N_DRAFT,
        n_ctx=N_CTX,
        n_batch=N_BATCH,
        n_threads=1,
        draft_policy="fixed",
    )
    generator.generate(prompt, max_tokens=len(generation.tokens))
    assert generator.tokens == generation.tokens
    assert (generator.rounds, generator.drafted, generator.accepted) == (
        generation.rounds,
        generation.n_drafted,
        generation.n_accepted,
    )


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_a_full_context_ends_a_greedy_generation_without_an_error(
    qwen35_model: Model, eagle3_draft_model: Model, kind: str
) -> None:
    target, draft = models(kind, qwen35_model, eagle3_draft_model)
    prompt = target.tokenize("fill the context")
    generation = greedy_generation(kind, target, draft, n_ctx=N_CTX)
    generation.prefill(prompt)
    tokens = generation.generate(10 * N_CTX)
    assert len(prompt) + len(tokens) == N_CTX  # every committed token fits, the last included
    assert generation.n_past == N_CTX - 1
    rounds = generation.rounds
    assert generation.step() == []
    assert generation.rounds == rounds and generation.tokens == tokens


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_a_generation_that_ended_commits_nothing_more(
    qwen35_model: Model, eagle3_draft_model: Model, kind: str
) -> None:
    target, draft = models(kind, qwen35_model, eagle3_draft_model)
    prompt = target.tokenize("an ending")
    generation = greedy_generation(kind, target, draft)
    generation.prefill(prompt)
    generation.step()
    assert not generation.finished
    ended = greedy_generation(kind, target, draft)
    ended.resume(len(prompt), target.eos, [target.eos])
    assert ended.finished
    assert ended.step() == [] and ended.generate(50) == [target.eos] and ended.rounds == 0


def test_resume_refuses_tokens_that_do_not_end_with_the_last_token(qwen35_model: Model) -> None:
    generation = greedy_generation("mtp", qwen35_model, None)
    with pytest.raises(ValueError, match="end with id_last"):
        generation.resume(3, 5, [1, 2, 3])
    with pytest.raises(ValueError, match="n_past"):
        generation.resume(-1, 5)


@pytest.mark.parametrize("prompt", [[], [-1], [10**6]])
def test_a_bad_prompt_is_a_value_error_for_both(qwen35_model: Model, prompt: list[int]) -> None:
    with pytest.raises(ValueError):
        greedy_generation("mtp", qwen35_model, None).prefill(prompt)
    with pytest.raises(ValueError):
        Generator(qwen35_model, mode="mtp", n_draft=N_DRAFT, n_ctx=N_CTX, n_batch=N_BATCH).generate(
            prompt, max_tokens=1
        )
