"""Shared test helpers: plain greedy reference runs, near-tie checks, thread checks."""

from __future__ import annotations

import threading
from collections.abc import Callable

from specstate import Context, Model

#: Largest top-two logit gap at which a speculative run may part from plain
#: decoding: batched and single-token kernels differ by up to ~0.16 there
#: (shared/notes/numerics.md), against a median gap near 1.
NEAR_TIE = 0.25


def plain_greedy(model: Model, prompt: list[int], n_tokens: int, **context: int) -> tuple[list[int], list[float]]:
    """Plain greedy decoding, one token per decode, with the top-two logit gap at each step."""
    ctx = Context(model, n_threads=1, **context)  # type: ignore[arg-type]
    ctx.decode(prompt, 0)
    tokens: list[int] = []
    gaps: list[float] = []
    pos = len(prompt)
    while True:
        (first, top), (_, second) = ctx.top_logits(k=2)
        tokens.append(first)
        gaps.append(top - second)
        if len(tokens) == n_tokens:
            return tokens, gaps
        ctx.decode([first], pos)
        pos += 1


def agreement(tokens: list[int], reference: list[int], gaps: list[float]) -> int:
    """Tokens equal to the plain reference; where the runs part, the plain run
    must have been at a near-tie (the gap is printed, so the test log reports it)."""
    for index, (mine, theirs) in enumerate(zip(tokens, reference)):
        if mine != theirs:
            assert gaps[index] < NEAR_TIE, (
                f"parted from plain greedy at token {index} with a top-two gap of {gaps[index]:.3f} (not a near-tie)"
            )
            print(f"parted at token {index} at a near-tie (top-two gap {gaps[index]:.4f})")
            return index
    return min(len(tokens), len(reference))


def error_from_another_thread(call: Callable[[], object]) -> BaseException | None:
    """What `call` raises when run on another thread (None if nothing)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:
            errors.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return errors[0] if errors else None
