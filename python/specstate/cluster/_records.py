"""What the driver keeps of each generation and each worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specstate._text import Utf8Decoder


@dataclass
class GenerationStats:
    """What happened to one generation."""

    migrations: int = 0
    recoveries: int = 0
    replayed: int = 0  # tokens regenerated after a recovery and found equal to those streamed
    divergences: int = 0  # regenerated tokens that differed (exactness broken; never streamed)
    preempted_seconds: list[float] = field(default_factory=list)  # checkpoint + release, per preemption
    resumed_seconds: list[float] = field(default_factory=list)  # transfer + restore, per resume


@dataclass(frozen=True)
class Handle:
    """A generation submitted to a :class:`~specstate.cluster.Pool`."""

    id: str


@dataclass
class Generation:
    """One generation: how to start it, where it runs, what it produced and what the caller took."""

    handle: Handle
    prompt: str | list[int]
    settings: dict[str, Any]
    target: str
    draft: str | None
    max_tokens: int
    checkpoint_every: int | None
    fingerprints: dict[str, str]
    worker: int | None = None
    tokens: list[int] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=list)
    handed: int = 0  # pieces that the caller's streams have taken
    decoder: Utf8Decoder = field(default_factory=Utf8Decoder)  # of the caller's streams
    produced: int = 0  # tokens the current worker run has produced (streamed or replayed)
    pending: Any = None  # the outstanding advance
    checkpoint: Any = None  # latest confirmed checkpoint (an ObjectRef) and the tokens handed out at it
    checkpoint_tokens: int = 0
    unconfirmed: Any = None  # a checkpoint requested, confirmed by the next advance that completes
    unconfirmed_tokens: int = 0
    done: bool = False
    preempted: bool = False  # parked: not running until resumed (also after its worker died without a survivor)
    stats: GenerationStats = field(default_factory=GenerationStats)

    @property
    def state(self) -> str:
        return "finished" if self.done else "preempted" if self.preempted else "running"

    def record(self, token: int, piece: bytes) -> None:
        """A token the current worker run produced: a new one is kept for the caller; one regenerated after a
        recovery is compared with the token streamed at its place (replayed, or a divergence never streamed)."""
        index = self.produced
        self.produced += 1
        if index < len(self.tokens):
            if self.tokens[index] == token:
                self.stats.replayed += 1
            else:
                self.stats.divergences += 1
            return
        self.tokens.append(token)
        self.pieces.append(piece)


@dataclass
class WorkerEntry:
    """A worker as the driver knows it: its actor, process, thread count and model fingerprints."""

    actor: Any
    pid: int
    n_threads: int
    models: dict[str, str]
    alive: bool = True
