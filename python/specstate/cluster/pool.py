"""The :class:`Pool`: Ray workers, the generations submitted to them, and what a caller does with those.

Its parts: :mod:`~specstate.cluster._placement` (which worker a generation may run on),
:mod:`~specstate.cluster._runner` (the driver loop), :mod:`~specstate.cluster._recovery` (a dead worker's
generations resumed elsewhere), :mod:`~specstate.cluster._streaming` (the caller's text, by position).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import ray
import ray._private.worker as ray_worker
from ray.exceptions import RayActorError

from specstate._native import MAX_SEQUENCES
from specstate._typing import GeneratorSettings
from specstate.cluster import _streaming
from specstate.cluster._placement import Placement, models_of, not_alive, unplaced
from specstate.cluster._records import Generation, GenerationStats, Handle, WorkerEntry
from specstate.cluster._runner import Runner
from specstate.cluster._worker import Worker
from specstate.cluster.errors import GenerationStateError, UnknownGenerationError


def _quiet_raylet(quiet: bool) -> None:
    """Whether the driver prints the raylet's notices: Ray's driver prints them (a dozen lines, such as
    "A worker died or was killed ..." for a worker killed from outside) on its standard output even with
    ``log_to_driver=False``. This module switch of Ray's, the one its debugger uses, is the only one that
    stops them; the pool reports a dead worker on its own logger."""
    ray_worker._worker_logs_enabled = not quiet


class Pool:
    """Ray actor workers running generations; see the :mod:`specstate.cluster` docstring.

    Args:
        models: model files by name (``{"target": path, "draft": path}``); each worker loads them once.
        workers: how many workers to start.
        n_threads: threads each worker decodes with; 0, the default: the default thread count of one of the
            pool's workers on each node (:func:`specstate.default_threads` with the workers spread over the
            cluster's live nodes as slots of one process, docs/threads.md).
        address: an existing Ray cluster (``ray.init(address=...)``); by default a local instance is
            started (or the one this process already joined is used). A Ray instance that the pool starts
            prints nothing on the driver's output; one that the caller started keeps its own settings.
        chunk: tokens asked of a worker per call (a generation's tokens do not depend on it).
        batch: generations each worker decodes together in ``none`` and ``ngram`` mode (one
            :class:`~specstate.BatchEngine` per target model and context length; 0: each generation alone). A
            generation's tokens do not depend on it either.
    """

    def __init__(
        self,
        models: Mapping[str, str | os.PathLike[str]],
        *,
        workers: int = 2,
        n_threads: int = 0,
        address: str | None = None,
        chunk: int = 16,
        batch: int = 4,
    ) -> None:
        if workers < 1 or chunk < 1 or n_threads < 0 or not 0 <= batch <= MAX_SEQUENCES:
            raise ValueError(
                f"workers and chunk must be at least 1, n_threads at least 0, and batch between 0 and {MAX_SEQUENCES}"
            )
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            _quiet_raylet(True)
        # Workers spread over the cluster's nodes; a dead one is not restarted (the pool recovers its generations).
        self._actor_class = ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")(Worker)
        self._models = {name: str(Path(path).resolve()) for name, path in models.items()}
        self._generations: dict[str, Generation] = {}
        self._placement = Placement(self._generations)
        self._runner = Runner(self._placement, self._generations, chunk)
        self._ids = itertools.count()
        self.n_threads = n_threads
        self._batch = batch
        nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]  # unannotated in Ray
        alive = len([node for node in nodes if node.get("Alive")])
        self._sharing = -(-workers // max(alive, 1))  # the pool's workers on one node (SPREAD)
        for _ in range(workers):
            self.add_worker(n_threads=n_threads)
        self._home = self._placement.workers[0].models  # the fingerprints of the pool's own model files

    @property
    def chunk(self) -> int:
        """Tokens asked of a worker per call."""
        return self._runner.chunk

    @chunk.setter
    def chunk(self, value: int) -> None:
        self._runner.chunk = value

    def close(self) -> None:
        """Stop every worker (their generations and checkpoints are dropped), and the local Ray
        instance if this pool started it. Also what leaving a ``with Pool(...)`` block does."""
        for entry in self._placement.workers.values():
            if entry.alive:
                ray.kill(entry.actor, no_restart=True)
                entry.alive = False
        self._generations.clear()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            _quiet_raylet(False)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- workers ---------------------------------------------------------------------------------

    def add_worker(self, models: Mapping[str, str | os.PathLike[str]] | None = None, *, n_threads: int = 0) -> int:
        """Start one more worker (with other model files if given); returns its id. ``n_threads`` 0: the
        default thread count of one of the pool's workers on a node, as for the pool's own."""
        files = self._models if models is None else {name: str(Path(p).resolve()) for name, p in models.items()}
        actor: Any = self._actor_class.remote(files, n_threads, self._sharing, self._batch)
        info: dict[str, Any] = ray.get(actor.describe.remote())
        worker = len(self._placement.workers)
        self._placement.workers[worker] = WorkerEntry(actor, info["pid"], info["n_threads"], info["models"])
        return worker

    def workers(self) -> list[int]:
        """The ids of the workers not known to be dead (one killed from outside counts as dead once
        a call to it has failed)."""
        return self._placement.alive()

    def worker_pid(self, worker: int) -> int:
        """The process id of a worker (:class:`UnknownWorkerError` for an id the pool never gave)."""
        return self._placement.entry(worker).pid

    def kill(self, worker: int) -> None:
        """Kill a worker's process (as a crash would); its generations recover when their calls fail.
        Killing a dead worker does nothing; an id the pool never gave raises :class:`UnknownWorkerError`."""
        entry = self._placement.entry(worker)
        ray.kill(entry.actor, no_restart=True)
        entry.alive = False

    def worker_of(self, handle: Handle) -> int | None:
        """The worker a generation runs on (``None`` while preempted or finished)."""
        return self._generation(handle).worker

    # --- generations -----------------------------------------------------------------------------

    def submit(
        self,
        prompt: str | list[int],
        *,
        max_tokens: int,
        target: str = "target",
        draft: str | None = None,
        checkpoint_every: int | None = None,
        worker: int | None = None,
        **settings: Any,
    ) -> Handle:
        """Start a generation of up to ``max_tokens`` tokens (settings as :class:`~specstate.Generator` takes
        them, but ``n_threads``: the worker's); ``target``/``draft`` name the pool's models. Placed on
        ``worker``, or by default on the least loaded worker with the pool's model files (a dead one is
        passed over). When it cannot start, nothing is registered."""
        if max_tokens < 0 or (checkpoint_every is not None and checkpoint_every < 1):
            raise ValueError("max_tokens must not be negative and checkpoint_every must be at least 1")
        allowed = set(GeneratorSettings.__optional_keys__) - {"n_threads", "draft_model"}
        unknown = set(settings) - allowed
        if unknown:
            raise ValueError(
                f"unknown or pool-owned settings (n_threads and the models are the workers'): {sorted(unknown)}"
            )
        if worker is None:  # on the pool's own model files, the least loaded worker
            fingerprints = models_of(self._home, target, draft)
            candidates = self._placement.candidates(fingerprints)
        else:
            fingerprints = models_of(self._placement.live(worker).models, target, draft)
            candidates = [worker]
        generation = Generation(
            handle=Handle(f"g{next(self._ids)}"),
            prompt=prompt,
            settings=settings,
            target=target,
            draft=draft,
            max_tokens=max_tokens,
            checkpoint_every=checkpoint_every,
            fingerprints=fingerprints,
            done=max_tokens == 0,
        )
        if not generation.done and not self._runner.launch(generation, candidates):
            unplaced(worker, fingerprints)
        self._generations[generation.handle.id] = generation
        return generation.handle

    def stream(self, handle: Handle) -> Iterator[str]:
        """Yield the generation's text as it is committed, running the pool meanwhile.

        The caller's streams of a generation share one position: a stream starts where the previous one
        stopped (at the start the first time), so joining every stream's pieces gives the text once. At a
        preemption, once everything produced before it is handed out, the stream raises
        :class:`GenerationPreempted`; after :meth:`resume`, a new stream (or one that was waiting at a
        piece when the generation was preempted) continues where it stopped."""
        return _streaming.stream(self._generation(handle), self.pump)

    def take_text(self, handle: Handle) -> str:
        """The text produced and not yet handed out, without running the pool (a driver that serves several
        generations pumps itself); it moves the streams' position, as :meth:`stream` does."""
        return _streaming.take_text(self._generation(handle))

    def result(self, handle: Handle) -> str:
        """The whole text, from its start (runs the pool until the generation is over; raises
        :class:`GenerationPreempted` if it is preempted first). The streams' position does not move."""
        return _streaming.result(self._generation(handle), self.pump)

    def tokens(self, handle: Handle) -> list[int]:
        """The tokens streamed so far."""
        return list(self._generation(handle).tokens)

    def stats(self, handle: Handle) -> GenerationStats:
        """Migrations, recoveries, replayed and divergent tokens, timings."""
        return self._generation(handle).stats

    def done(self, handle: Handle) -> bool:
        """Whether the generation is over."""
        return self._generation(handle).done

    def run(self) -> None:
        """Pump until every generation that is not preempted is over."""
        self._runner.run()

    def pump(self, timeout: float | None = None) -> None:
        """Wait for one outstanding worker call and handle it (recovering from a dead worker). An error
        that a generation's worker raised ends the generation and is raised here, as itself."""
        self._runner.pump(timeout)

    # --- preemption and migration ------------------------------------------------------------------

    def preempt(self, handle: Handle) -> None:
        """Stop the generation at its next round boundary, put its checkpoint in the object store,
        and free the worker's contexts. Does nothing to a generation that is preempted or finished
        (also when its last outstanding call finishes it)."""
        generation = self._generation(handle)
        if generation.done or generation.preempted:
            return
        generation.preempted = True
        while generation.pending is not None:
            self.pump()
        if generation.done:  # its last call finished it
            generation.preempted = False
            return
        if generation.worker is None:  # its worker died meanwhile: it keeps its latest checkpoint
            return
        started = time.perf_counter()
        actor = self._placement.workers[generation.worker].actor
        reference = actor.checkpoint_and_release.remote(generation.handle.id)
        try:
            ray.wait([reference], fetch_local=False)
            ray.get(actor.ping.remote())  # the actor is alive, so the checkpoint call succeeded
        except RayActorError:
            self._runner.recovery.lost(generation.worker)
            return
        # What the worker had produced: fewer than were streamed while it regenerates after a recovery.
        generation.checkpoint, generation.checkpoint_tokens = reference, generation.produced
        generation.unconfirmed = None
        generation.worker = None
        generation.stats.preempted_seconds.append(time.perf_counter() - started)

    def resume(self, handle: Handle, worker: int | None = None) -> int:
        """Continue a preempted generation on ``worker`` (by default the least loaded one with its
        model files, a dead one passed over), exactly, whatever the worker's thread count; returns the
        worker. A worker without the generation's model files refuses
        (:class:`~specstate.errors.ModelMismatchError`) and the generation stays preempted, as it does
        on any other error. :class:`GenerationStateError` if it is not preempted."""
        generation = self._generation(handle)
        if not generation.preempted or generation.done:
            raise GenerationStateError(generation.handle.id, generation.state, "resume")
        if worker is None:
            candidates = self._placement.candidates(generation.fingerprints)
        else:
            self._placement.check(worker)
            candidates = [worker]
        started = time.perf_counter()
        if not self._runner.launch(generation, candidates):
            unplaced(worker, generation.fingerprints)
        generation.preempted = False
        generation.stats.resumed_seconds.append(time.perf_counter() - started)
        assert generation.worker is not None
        return generation.worker

    def migrate(self, handle: Handle, worker: int | None = None) -> int:
        """Preempt, then resume on ``worker`` (by default another one with its model files, or its own
        when no other has them); returns the worker it runs on.

        The target is checked first (alive, the generation's model files): :class:`PlacementError`
        leaves the generation running where it was. If the target fails after the checkpoint was taken
        (it died, or refused it), the generation resumes where it was (or, that worker dead too, on
        another one) and the error is raised. A generation whose outstanding call finishes it is not
        moved (the worker it finished on is returned); :class:`GenerationStateError` for one that was
        finished already."""
        generation = self._generation(handle)
        if generation.done:
            raise GenerationStateError(generation.handle.id, generation.state, "migrate")
        source = generation.worker  # None when it was preempted: then it stays so if the migration fails
        chosen = self._placement.migration_target(generation, worker)
        self.preempt(handle)
        if generation.done:  # its outstanding call finished it: nothing to move
            assert source is not None
            return source
        started = time.perf_counter()
        try:
            moved = self._runner.launch(generation, [chosen])
        except Exception:
            self._runner.recovery.fall_back(generation, source, chosen)
            raise
        if not moved:
            self._runner.recovery.fall_back(generation, source, chosen)
            raise not_alive(chosen)
        generation.preempted = False
        generation.stats.resumed_seconds.append(time.perf_counter() - started)
        generation.stats.migrations += 1
        return chosen

    def _generation(self, handle: Handle) -> Generation:
        generation = self._generations.get(handle.id)
        if generation is None:
            raise UnknownGenerationError(handle.id)
        return generation
