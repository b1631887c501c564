"""Generators of every mode over the tiny models, shared by tests and subprocesses.

The target is the hybrid qwen35 model (so rollback of recurrent state is
exercised); the `draft` mode drafts with the tiny llama model of the same seed
(same vocabulary and successor map, so drafts are often right); `eagle3`
drafts with the EAGLE-3 model built for that target.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast, get_args

from specstate import Generator, Model
from specstate.errors import CheckpointError
from specstate.generator import Mode

MODES = get_args(Mode)
TINY_CTX = 256


def tiny_generator(
    mode: str, paths: dict[str, Path], *, sampled: bool = False, n_draft: int = 4, n_threads: int = 1, **settings: Any
) -> Generator:
    """A generator of `mode` over the tiny models (`paths`: qwen35, llama, eagle3_draft)."""
    target = Model(paths["qwen35"])
    draft: Model | None = None
    if mode == "draft":
        draft = Model(paths["llama"])
    elif mode == "eagle3":
        draft = Model(paths["eagle3_draft"])
    return Generator(
        target,
        mode=cast(Mode, mode),
        draft_model=draft,
        n_ctx=TINY_CTX,
        n_batch=64,
        n_draft=n_draft,
        n_threads=n_threads,
        **sampling(sampled),
        **settings,
    )


def sampling(sampled: bool) -> dict[str, Any]:
    """Seeded stochastic sampling, or greedy."""
    return dict(temperature=1.5, top_k=40, top_p=0.95, seed=1234) if sampled else {}


def draft_for(mode: str, paths: dict[str, Path]) -> Model | None:
    """The draft model a restore of `mode` needs."""
    return {"draft": Model(paths["llama"]), "eagle3": Model(paths["eagle3_draft"])}.get(mode)


def assert_refused_and_unchanged(generator: Generator, data: bytes) -> CheckpointError:
    """`load` refuses `data` with a CheckpointError and leaves `generator` exactly as it was."""
    before = generator.checkpoint()
    try:
        generator.load(data)
    except CheckpointError as error:
        assert generator.checkpoint() == before
        return error
    raise AssertionError("the checkpoint was loaded, not refused")


def resume_matches(
    make: Callable[[], Generator], prompt: list[int], rounds: int, n_tokens: int, restore: Callable[[bytes], Generator]
) -> tuple[list[int], list[int]]:
    """Tokens of a run checkpointed after `rounds` rounds and resumed, and of an uninterrupted run."""
    first = make()
    first.generate(prompt, max_tokens=1)
    for _ in range(rounds):  # each take() with nothing waiting runs exactly one round
        first._native.take()
    saved = first.checkpoint()
    total = max(n_tokens, len(first.tokens) + 20)
    resumed = restore(saved)
    assert resumed.tokens == first.tokens
    resumed.generate(max_tokens=total - len(resumed.tokens))
    uninterrupted = make()
    uninterrupted.generate(prompt, max_tokens=total)
    return resumed.tokens, uninterrupted.tokens


def tiny_resume_matches(
    paths: dict[str, Path], mode: str, text: str, rounds: int, n_tokens: int, **settings: Any
) -> tuple[list[int], list[int]]:
    """:func:`resume_matches` for ``tiny_generator(mode, paths, **settings)`` on `text`, restored on the tiny target."""
    target = Model(paths["qwen35"])
    return resume_matches(
        lambda: tiny_generator(mode, paths, **settings),
        target.tokenize(text),
        rounds,
        n_tokens,
        lambda data: Generator.restore(data, target, draft_model=draft_for(mode, paths), n_threads=1),
    )
