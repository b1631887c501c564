"""The bounded queue the slots take jobs from, with priorities and preemption without loss."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from specstate import _files
from specstate.llama import (
    ParkedChat,
)
from specstate.serve.jobs import Job
from specstate.serve.request import RequestError


class Scheduler:
    """The bounded queue the slots take jobs from: the highest priority first, then a chat that extends the
    slot's conversation, then the oldest. A job that finds every slot busy with a chat of lower
    priority has the lowest of them parked (checkpointed between two chunks); a parked job waits in the queue
    with its checkpoint (up to ``parked_bytes`` of them) and resumes token for token in the next free slot."""

    def __init__(self, capacity: int, slots: int, parked_bytes: int = 1 << 30, spill: str | None = None) -> None:
        self.capacity, self.slots, self.parked_bytes = capacity, slots, parked_bytes
        self.spill = None if spill is None else Path(spill)
        if self.spill is not None:
            self.spill.mkdir(parents=True, exist_ok=True)
        self._jobs: list[Job] = []
        self._running: list[Job] = []
        self._ready = threading.Condition()
        self._submitted = 0
        self.closed = False

    @property
    def busy(self) -> int:
        with self._ready:
            return len(self._running)

    def submit(self, job: Job) -> None:
        with self._ready:
            idle = self.slots - len(self._running)
            if sum(j.parked is None for j in self._jobs) >= self.capacity + idle:
                raise RequestError(429, "the server is busy: every slot is taken and the queue is full", "rate_limit")
            self._submitted += 1
            job.order = self._submitted
            self._jobs.append(job)
            if idle <= 0:
                self._make_room(job.priority)
            self._ready.notify_all()

    def _make_room(self, priority: int) -> None:
        """Ask the lowest-priority streamed chat running below ``priority`` (the newest of them) to park."""
        if self.spill is None and self.parked() >= self.parked_bytes:
            return
        below = [j for j in self._running if j.preemptible() and j.priority < priority and not j.preempt.is_set()]
        if below:
            min(below, key=lambda j: (j.priority, -j.order)).preempt.set()

    def park(self, job: Job, parked: ParkedChat) -> None:
        """A running job paused: back in the queue with its checkpoint (in the spill directory beyond the budget)."""
        if self.spill is not None and self.parked() + len(parked.checkpoint) > self.parked_bytes:
            job.spilled = self.spill / f"parked-{os.getpid()}-{job.order}.ckpt"
            _files.replace_atomically(job.spilled, parked.checkpoint, 0o600)
            parked = dataclasses.replace(parked, checkpoint=b"")
        with self._ready:
            job.parked, job.parked_since = parked, time.monotonic()
            job.preempt.clear()
            self._running.remove(job)
            self._jobs.append(job)
            self._ready.notify_all()

    def parked(self) -> int:
        """Bytes of the parked jobs' checkpoints."""
        with self._ready:
            return sum(len(j.parked.checkpoint) for j in self._jobs if j.parked is not None)

    def take(self, holds: Callable[[Job], bool]) -> Job | None:
        """The next job for a slot (``holds``: whether the slot holds that job's conversation); None once closed."""
        with self._ready:
            while not self._jobs and not self.closed:
                self._ready.wait()
            if self.closed:
                return None
            job = min(self._jobs, key=lambda j: (-j.priority, not holds(j), j.order))
            self._jobs.remove(job)
            self._running.append(job)
            return job

    def finished(self, job: Job) -> None:
        with self._ready:
            if job in self._running:
                self._running.remove(job)

    def depth(self) -> int:
        with self._ready:
            return len(self._jobs)

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify_all()


def unspilled(job: Job) -> ParkedChat:
    """The job's parked reply, its checkpoint read back (and the file removed) if it was spilled."""
    assert job.parked is not None
    if job.spilled is None:
        return job.parked
    path, job.spilled = job.spilled, None
    try:
        return dataclasses.replace(job.parked, checkpoint=_files.read_checkpoint(path))
    finally:
        path.unlink(missing_ok=True)
