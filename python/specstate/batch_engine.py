"""Many generations over one model: continuous batching with replies that never depend on their neighbours.

:class:`BatchEngine` holds one target context with a KV stream per sequence and runs every sequence's round in one
decode per step (``none`` and ``ngram`` modes). Each reply is, token for token, the reply the same
:class:`~specstate.Generator` gives alone, whatever the other sequences are doing: prompts are decoded in decodes of
their own, a step's rows are decoded in decodes of at most 17 rows (where specstate's llama.cpp patch gives every row
its single decode's bits), and attention reads only the sequence's own stream. Sequences join from a generator
(new, or restored from a checkpoint) and leave into one, so a sequence parks, saves and migrates as a generator does.

Example::

    engine = BatchEngine(model, n_seq=4)
    seqs = [engine.join(Generator(model, mode="ngram")) for _ in prompts]
    for seq, prompt in zip(seqs, prompts):
        engine.prefill(seq, encode_prompt(model, prompt))
    while not all(engine.done(seq) for seq in seqs):
        engine.step()
        for seq in seqs:
            print(seq, engine.take(seq))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from specstate import _defaults, _native
from specstate._native import Model
from specstate.generator import Generator, encode_prompt

__all__ = ["BATCHED_MODES", "BatchEngine", "SharedEngine", "StepReport"]

#: The modes whose generations a batch holds (they draft from the history); the others are refused.
BATCHED_MODES = ("none", "ngram")

SharedEngine = _native.SharedEngine
"""One target context shared by generators used from several threads (``Generator(model, engine=shared)``, or
``generator.attach(shared)``): each generator takes one of its sequences and runs its rounds as usual, on its own
thread, and the rounds of all attached generators asking at about the same time are decoded together (the first
waits at most 2 ms for the others). Each reply is token for token the one the generator gives alone. ``stats`` is
``(decodes, rows, sequences)`` so far. Modes ``none`` and ``ngram``; a generator's ``n_ctx`` must be the engine's."""


class StepReport(NamedTuple):
    """What one :meth:`BatchEngine.step` did."""

    sequences: int
    """Sequences that ran a round."""
    rows: int
    """Rows decoded (each sequence's last token and draft)."""
    decodes: int
    """Decodes run (rows are packed into decodes of at most 17)."""
    committed: int
    """Tokens committed."""


class BatchEngine:
    """Many generations over one target context (see the module documentation).

    Args:
        model: the target model, shared by every sequence.
        n_seq: sequences held at once.
        n_ctx: context length of every sequence (a generator joins only with the same ``n_ctx``).
        n_batch: the most rows of one prompt chunk (a joining generator's ``n_batch`` may be smaller).
        n_threads: threads of the one decode per step (0: the default thread count, docs/threads.md).
    """

    def __init__(
        self,
        model: Model,
        *,
        n_seq: int = 4,
        n_ctx: int = _defaults.N_CTX,
        n_batch: int = _native.LLAMA_N_BATCH,
        n_threads: int = 0,
    ) -> None:
        self._native = _native.BatchEngine(model, n_seq=n_seq, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)

    def join(self, generator: Generator) -> int:
        """A copy of ``generator``'s generation (new, or prefilled, or restored from a checkpoint) as a new
        sequence, which goes on exactly as the generator would; the generator is left as it was. Returns the
        sequence's id. Modes other than ``none`` and ``ngram``, another model, another ``n_ctx`` or a full batch
        raise (nothing changes)."""
        return self._native.join(generator._native)

    def snapshot(self, seq: int) -> Generator:
        """A copy of sequence ``seq`` as a generator of its own (checkpoint it to park or migrate the sequence);
        the sequence stays."""
        return Generator._wrap(self._native.snapshot(seq))

    def leave(self, seq: int) -> Generator:
        """Sequence ``seq`` taken out of the batch as a generator of its own; its place is free."""
        return Generator._wrap(self._native.leave(seq))

    def remove(self, seq: int) -> None:
        """Drop sequence ``seq``; its place is free."""
        self._native.remove(seq)

    def prefill(self, seq: int, prompt: str | Sequence[int]) -> None:
        """Decode the prompt of sequence ``seq`` (text is tokenized as :func:`~specstate.encode_prompt` does) in
        decodes of its own, and commit the first generated token."""
        tokens = encode_prompt(self._native.target, prompt) if isinstance(prompt, str) else list(prompt)
        self._native.prefill(seq, tokens)

    def set_budget(self, seq: int, max_commit: int | None) -> None:
        """The most tokens the next round of ``seq`` may commit (``None``: no bound), as
        ``Generator.take(max_commit=...)`` bounds a lone round: a reply that must end at a length sets it."""
        self._native.set_budget(seq, max_commit)

    def set_lead(self, seq: int, lead: int) -> None:
        """Let the rounds of ``seq`` run while it holds fewer than ``lead`` committed tokens not yet handed out
        (1, the default: a round only once every token is handed out). A caller that takes a sequence's tokens
        later (a server answering its clients in turn) sets it to run ahead with the others' steps; the tokens
        are the same, only when they are decoded changes. Values below 1 count as 1."""
        self._native.set_lead(seq, lead)

    def step(self) -> StepReport:
        """One round for every sequence that has handed out its tokens (see :meth:`set_lead`) and is not done, all their
        rows decoded together. A sequence whose round fails raises at its next :meth:`take`; the others go on."""
        return StepReport(*self._native.step())

    def take(self, seq: int, max_n: int | None = None) -> list[int]:
        """Up to ``max_n`` (default: all) committed tokens of ``seq`` not yet handed out; never runs a round."""
        return self._native.take(seq) if max_n is None else self._native.take(seq, max_n)

    def done(self, seq: int) -> bool:
        """Whether ``seq`` is finished (or its context is full) with every token handed out."""
        return self._native.done(seq)

    def history(self, seq: int) -> list[int]:
        """The prompt and committed tokens of ``seq``."""
        return self._native.history(seq)

    def __len__(self) -> int:
        return len(self._native)

    @property
    def n_seq(self) -> int:
        """Sequences held at most."""
        return self._native.n_seq

    @property
    def n_ctx(self) -> int:
        """Context length of every sequence."""
        return self._native.n_ctx

    @property
    def n_threads(self) -> int:
        """Threads of the one decode per step."""
        return self._native.n_threads
