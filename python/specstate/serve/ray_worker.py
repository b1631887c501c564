"""A Ray worker of ``specstate serve --ray-workers``: the slot backend of the server, in a process of its own.

Each worker runs what the server runs without Ray: a :class:`~specstate.serve.scheduler.Scheduler` and
``slots`` :class:`~specstate.serve.slots.Slot` threads (their generations batched on one engine where the mode
batches), a conversation cache and the tenants' lookup corpora. The driver (:mod:`specstate.serve.ray`) hands it
each request as the :class:`~specstate.serve.request.ServerRequest` the request reader made, and takes back what
its slot delivers (:meth:`ServeWorker.poll`): the chunks, an error or the end, each finished conversation's
checkpoint, and the worker's counters. This module does not import Ray: the driver makes the class an actor.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from specstate._native import default_threads
from specstate.llama import ParkedChat
from specstate.serve.cache import ConversationCache, Pairs
from specstate.serve.config import ServerConfig
from specstate.serve.jobs import DONE, Job, Metrics, engine_counters
from specstate.serve.request import RequestError, ServerRequest
from specstate.serve.scheduler import Scheduler
from specstate.serve.slots import lookup_corpora, start_slots

__all__ = ["Finished", "Report", "ServeWorker", "worker_config"]


@dataclass(frozen=True)
class Finished:
    """A request's end, as the worker reports it: its slot delivered everything (the stop string that ended a
    chat's reply, if one did)."""

    stop_sequence: str | None = None


#: A conversation a worker finished a turn of: its messages, the reply included, its checkpoint, its tenant.
Conversation = tuple[tuple[tuple[str, str], ...], bytes, str]


@dataclass
class Report:
    """What a worker delivered since the last report: ``(request id, item)`` in order (a chunk, a
    :class:`RequestError` or :class:`Finished`), the conversations it finished, its counters' increase, and its
    batched engine's counters so far (None: its slots are separate)."""

    items: list[tuple[str, object]]
    conversations: list[Conversation]
    counts: dict[str, int]
    engine: dict[str, int] | None = None


def worker_config(config: ServerConfig, sharing: int) -> ServerConfig:
    """``config`` as a worker runs it, one of ``sharing`` workers on its node: when the thread count is the
    default (0), the default thread count of ``sharing`` workers' generations decoding at once (a batched
    engine's one each, or each of their separate slots) (docs/threads.md)."""
    if config.n_threads:
        return config
    decoding = sharing * (1 if config.batched() else config.slots)
    return dataclasses.replace(config, n_threads=default_threads(decoding))


class _Outbox(ConversationCache):
    """The worker's conversation cache (in memory): a slot's finished turn is kept here and reported to the
    driver, which keeps every worker's conversations (:meth:`keep`: one the driver gives, not reported back)."""

    def __init__(self, memory_bytes: int) -> None:
        super().__init__(memory_bytes)
        self.finished: list[Conversation] = []

    def put(self, messages: Pairs, checkpoint: bytes, tenant: str = "") -> None:
        super().put(messages, checkpoint, tenant)
        with self._lock:
            self.finished.append((tuple(messages), checkpoint, tenant))

    def keep(self, messages: Pairs, checkpoint: bytes, tenant: str) -> None:
        """Keep a conversation the driver gives (a turn another worker finished)."""
        super().put(messages, checkpoint, tenant)

    def take(self) -> list[Conversation]:
        with self._lock:
            finished, self.finished = self.finished, []
        return finished


class ServeWorker:
    """The slot backend in a Ray worker: requests run by its slots, results taken by the driver.

    ``config``: the server's, its thread count resolved (:func:`worker_config`); ``cost_curve``: the adaptive
    draft policy's, measured by the first worker and pinned in every other (None: measured here), so that each
    reply drafts alike on every worker."""

    def __init__(self, config: ServerConfig, cost_curve: list[int] | None = None) -> None:
        self.metrics = Metrics()
        self.scheduler = Scheduler(config.queue + config.slots, config.slots, config.parked_bytes, config.spill_dir)
        self.cache = _Outbox(config.cache_bytes)
        self.corpora = lookup_corpora(config)
        self.slots, self.engine = start_slots(
            config, self.scheduler, self.metrics, self.cache, self.corpora, cost_curve
        )
        self._jobs: dict[str, Job] = {}
        self._items: list[tuple[str, object]] = []
        self._ready = threading.Condition()
        self._reported: Counter[str] = Counter()

    def describe(self) -> dict[str, Any]:
        """The worker's process id, the cost curve its slots draft with (None: the fixed policy), and the documents
        of each tenant's lookup corpus (None: its requests keep none)."""
        documents = None if self.corpora is None else self.corpora.documents()
        return {"pid": os.getpid(), "cost_curve": self.slots[0].cost_curve, "corpora": documents}

    def submit(
        self,
        ident: str,
        request: ServerRequest,
        conversation: Conversation | None = None,
        resume: ParkedChat | None = None,
        snapshot_every: int = 0,
    ) -> None:
        """Run ``request`` (its results reported under ``ident``), after keeping ``conversation``, a checkpoint of
        the conversation it continues that another worker finished (its slot restores it); or, with ``resume``,
        the rest of its reply from that snapshot of it. ``snapshot_every``: chunks of a streamed chat between two
        :class:`~specstate.serve.jobs.Snapshot` s reported (0: none)."""
        if conversation is not None:
            self.cache.keep(*conversation)
        job = Job(request, lambda item: self._deliver(ident, item), snapshot_every=snapshot_every)
        if resume is not None:
            job.parked, job.parked_since = resume, time.monotonic()
        with self._ready:
            self._jobs[ident] = job
        try:
            self.scheduler.submit(job)
        except RequestError as error:
            self._deliver(ident, error)
        except Exception as error:  # the worker outlives any request: its client hears what failed
            self._deliver(ident, RequestError.unforeseen(error))

    def cancel(self, ident: str) -> None:
        """Stop a request whose client left (its slot stops it before its next token; nothing more is reported)."""
        with self._ready:
            job = self._jobs.pop(ident, None)
        if job is not None:
            job.cancelled.set()

    def poll(self, timeout: float) -> Report:
        """What was delivered since the last call, waiting up to ``timeout`` seconds for something."""
        with self._ready:
            if not self._items:
                self._ready.wait(timeout)
            items, self._items = self._items, []
        counts = self.metrics.snapshot()
        increase = {
            name: value - self._reported[name] for name, value in counts.items() if value != self._reported[name]
        }
        self._reported = counts
        return Report(items, self.cache.take(), increase, engine_counters(self.engine))

    def _deliver(self, ident: str, item: object) -> None:
        """A slot's delivery for request ``ident`` (from the slot's thread)."""
        with self._ready:
            job = self._jobs.get(ident)
            if job is None:  # cancelled
                return
            if item is DONE:
                item = Finished(job.stop_sequence)
            if isinstance(item, (Finished, RequestError)):
                del self._jobs[ident]
            self._items.append((ident, item))
            self._ready.notify_all()
