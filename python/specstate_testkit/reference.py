"""Shared test helpers: plain greedy reference runs, near-tie checks (for the GPU check), thread checks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from specstate import Context, Model

#: Largest top-two logit gap at which a speculative run may part from plain decoding where verification is not
#: exact: on a GPU (scripts/gpu_check.py). On the CPU specstate's llama.cpp patch makes it exact (tests compare
#: token streams); stock kernels differed by up to ~0.16 (shared/notes/numerics.md), against a median gap near 1.
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


def outcomes_during(
    owner_call: Callable[[], object], calls: dict[str, Callable[[], object]]
) -> tuple[dict[str, set[str]], int]:
    """Run every one of `calls` over and over on a second thread while `owner_call` runs on this one.

    Returns, per call, the outcomes seen ("value", or the class name of what it raised), and how many
    rounds of calls started before `owner_call` returned.
    """
    running = threading.Event()
    done = threading.Event()
    seen: dict[str, set[str]] = {name: set() for name in calls}
    rounds = 0

    def probe() -> None:
        nonlocal rounds
        running.wait()
        time.sleep(0.01)  # let the owner's call get under way
        while not done.is_set():
            rounds += 1
            for name, call in calls.items():
                try:
                    call()
                    seen[name].add("value")
                except BaseException as error:  # a panic too (PanicException)
                    seen[name].add(type(error).__name__)

    prober = threading.Thread(target=probe)
    prober.start()
    running.set()
    try:
        owner_call()
    finally:
        done.set()
        prober.join()
    return seen, rounds
