"""Speculative generations on a pool of Ray workers that preempt, migrate and recover bit for bit.

``pip install 'specstate[ray]'``. The core package never imports Ray; this
module does.

A :class:`Pool` starts Ray actor workers (a local Ray instance by default, or
an existing cluster by ``address``), each loading its model files once, and
runs :class:`~specstate.Generator`\\ s on them. The driver owns every
generation's stream: tokens are handed to the caller by their position in
the generation, so none is ever given twice or skipped.

* :meth:`Pool.preempt` stops a generation at its next round boundary, puts
  its checkpoint in Ray's object store (no file system in between) and frees
  the worker's contexts; :meth:`Pool.resume` continues it on any worker whose
  models have the same fingerprints and whose thread count is the one the
  generation decodes with; :meth:`Pool.migrate` is the two together.
* With ``checkpoint_every=N``, a checkpoint is taken every N tokens and the
  latest one lives in the object store. When a worker process dies, each of
  its generations resumes on a surviving worker from its latest checkpoint (or
  from its prompt). The tokens regenerated after the checkpoint are compared
  with those already streamed; a difference is counted in
  :attr:`GenerationStats.divergences` and never streamed.
* A worker refuses a checkpoint whose model fingerprints it does not hold
  (:class:`~specstate.errors.ModelMismatchError`); the generation keeps its
  checkpoint and can be resumed elsewhere.

What exactness needs from a worker: the same model files (checked by
fingerprint) and the same thread count (llama.cpp sums batched verification in
an order that depends on it), on the same backend. The pool places a
generation only on workers that decode with its thread count; ``exact=False``
lets :meth:`Pool.resume` place it elsewhere, exact only up to near-ties.
"""

from __future__ import annotations

import codecs
import itertools
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import ray
    from ray.exceptions import ObjectLostError, RayActorError
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(f"specstate.cluster needs Ray: pip install 'specstate[ray]' ({error})") from error

from specstate import Generator, Model, model_fingerprint
from specstate._typing import GeneratorSettings

__all__ = ["GenerationStats", "Handle", "PlacementError", "Pool", "WorkerLost"]


class PlacementError(RuntimeError):
    """No live worker can run the generation exactly (models or thread count), or the one named cannot."""


class WorkerLost(RuntimeError):
    """A worker died and a generation on it has no surviving worker to resume on."""


class _Worker:
    """The Ray actor: loaded models and the generations running on them."""

    def __init__(self, models: Mapping[str, str], n_threads: int) -> None:
        self.models = {name: Model(path) for name, path in models.items()}
        self.n_threads = n_threads
        self.generators: dict[str, Generator] = {}

    def describe(self) -> dict[str, Any]:
        """The worker's process, thread count and model fingerprints (SHA-256 by name)."""
        fingerprints = {name: model_fingerprint(model)[0] for name, model in self.models.items()}
        return {"pid": os.getpid(), "n_threads": self.n_threads, "models": fingerprints}

    def _draft(self, draft: str | None) -> Model | None:
        return None if draft is None else self.models[draft]

    def start(
        self, gid: str, prompt: str | list[int], settings: dict[str, Any], target: str, draft: str | None
    ) -> None:
        """Begin a generation: decode its prompt."""
        model = self.models[target]
        generator = Generator(model, draft_model=self._draft(draft), n_threads=self.n_threads, **settings)
        tokens = model.tokenize(prompt, add_special=True, parse_special=True) if isinstance(prompt, str) else prompt
        generator._native.prefill(tokens)
        self.generators[gid] = generator

    def restore(self, gid: str, checkpoint: bytes, target: str, draft: str | None) -> int:
        """Continue a generation from its checkpoint; returns the tokens it had handed out."""
        generator = Generator.restore(
            checkpoint, self.models[target], draft_model=self._draft(draft), n_threads=self.n_threads
        )
        self.generators[gid] = generator
        return generator._native.delivered

    def advance(self, gid: str, n: int) -> tuple[list[int], list[bytes], bool]:
        """Up to ``n`` more tokens, their bytes, and whether the generation is over."""
        native = self.generators[gid]._native
        tokens = native.take(n)
        pieces = [native.target.token_to_piece(token) for token in tokens]
        over = not tokens or (native.finished and native.undelivered == 0)
        return tokens, pieces, over

    def checkpoint(self, gid: str) -> bytes:
        return self.generators[gid].checkpoint()

    def release(self, gid: str) -> None:
        self.generators.pop(gid, None)

    def checkpoint_and_release(self, gid: str) -> bytes:
        data = self.generators[gid].checkpoint()
        del self.generators[gid]
        return data


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
    """A generation submitted to a :class:`Pool`."""

    id: str


@dataclass
class _Generation:
    handle: Handle
    prompt: str | list[int]
    settings: dict[str, Any]
    target: str
    draft: str | None
    max_tokens: int
    checkpoint_every: int | None
    fingerprints: dict[str, str]
    n_threads: int
    worker: int | None = None
    tokens: list[int] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=list)
    produced: int = 0  # tokens the current worker run has produced (streamed or replayed)
    pending: Any = None  # the outstanding advance
    checkpoint: Any = None  # latest confirmed checkpoint (an ObjectRef) and the tokens handed out at it
    checkpoint_tokens: int = 0
    unconfirmed: Any = None  # a checkpoint requested, confirmed by the next advance that completes
    unconfirmed_tokens: int = 0
    done: bool = False
    preempted: bool = False
    stats: GenerationStats = field(default_factory=GenerationStats)


@dataclass
class _WorkerEntry:
    actor: Any
    pid: int
    n_threads: int
    models: dict[str, str]
    alive: bool = True


class Pool:
    """Ray actor workers running generations; see the module docstring.

    Args:
        models: model files by name (``{"target": path, "draft": path}``); each worker loads them once.
        workers: how many workers to start.
        n_threads: threads each worker decodes with.
        address: an existing Ray cluster (``ray.init(address=...)``); by default a local instance is
            started (or the one this process already joined is used).
        chunk: tokens asked of a worker per call (a generation's tokens do not depend on it).
    """

    def __init__(
        self,
        models: Mapping[str, str | os.PathLike[str]],
        *,
        workers: int = 2,
        n_threads: int = 1,
        address: str | None = None,
        chunk: int = 16,
    ) -> None:
        if workers < 1 or chunk < 1 or n_threads < 1:
            raise ValueError("workers, chunk and n_threads must be at least 1")
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        # Workers spread over the cluster's nodes; a dead one is not restarted (the pool recovers its generations).
        self._actor_class = ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")(_Worker)
        self._models = {name: str(Path(path).resolve()) for name, path in models.items()}
        self._workers: dict[int, _WorkerEntry] = {}
        self._generations: dict[str, _Generation] = {}
        self._ids = itertools.count()
        self.chunk = chunk
        self.n_threads = n_threads
        for _ in range(workers):
            self.add_worker(n_threads=n_threads)
        self._home = self._workers[0].models  # the fingerprints of the pool's own model files

    def close(self) -> None:
        """Stop every worker (their generations and checkpoints are dropped), and the local Ray
        instance if this pool started it. Also what leaving a ``with Pool(...)`` block does."""
        for entry in self._workers.values():
            if entry.alive:
                ray.kill(entry.actor, no_restart=True)
                entry.alive = False
        self._generations.clear()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- workers ---------------------------------------------------------------------------------

    def add_worker(self, models: Mapping[str, str | os.PathLike[str]] | None = None, *, n_threads: int = 1) -> int:
        """Start one more worker (with other model files if given); returns its id."""
        files = self._models if models is None else {name: str(Path(p).resolve()) for name, p in models.items()}
        actor: Any = self._actor_class.remote(files, n_threads)
        info: dict[str, Any] = ray.get(actor.describe.remote())
        worker = len(self._workers)
        self._workers[worker] = _WorkerEntry(actor, info["pid"], info["n_threads"], info["models"])
        return worker

    def workers(self) -> list[int]:
        """The live workers' ids."""
        return [worker for worker, entry in self._workers.items() if entry.alive]

    def worker_pid(self, worker: int) -> int:
        """The process id of a worker."""
        return self._workers[worker].pid

    def kill(self, worker: int) -> None:
        """Kill a worker's process (as a crash would); its generations recover when their calls fail."""
        ray.kill(self._workers[worker].actor, no_restart=True)
        self._workers[worker].alive = False

    def worker_of(self, handle: Handle) -> int | None:
        """The worker a generation runs on (``None`` while preempted or finished)."""
        return self._generations[handle.id].worker

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
        them, but ``n_threads``: the worker's); ``target``/``draft`` name the pool's models."""
        if max_tokens < 0 or (checkpoint_every is not None and checkpoint_every < 1):
            raise ValueError("max_tokens must not be negative and checkpoint_every must be at least 1")
        allowed = set(GeneratorSettings.__optional_keys__) - {"n_threads", "draft_model"}
        unknown = set(settings) - allowed
        if unknown:
            raise ValueError(
                f"unknown or pool-owned settings (n_threads and the models are the workers'): {sorted(unknown)}"
            )
        if worker is None:  # on the pool's own model files and thread count, the least loaded worker
            fingerprints, n_threads = self._models_of(self._home, target, draft), self.n_threads
            chosen = self._place(None, fingerprints, n_threads)
        else:
            entry = self._live(worker)
            fingerprints, n_threads = self._models_of(entry.models, target, draft), entry.n_threads
            chosen = worker
        generation = _Generation(
            handle=Handle(f"g{next(self._ids)}"),
            prompt=prompt,
            settings=settings,
            target=target,
            draft=draft,
            max_tokens=max_tokens,
            checkpoint_every=checkpoint_every,
            fingerprints=fingerprints,
            n_threads=n_threads,
        )
        self._generations[generation.handle.id] = generation
        if max_tokens == 0:
            generation.done = True
            return generation.handle
        self._launch(generation, [chosen])
        return generation.handle

    def stream(self, handle: Handle) -> Iterator[str]:
        """Yield the generation's text as it is committed, from its start (each token once)."""
        generation = self._generations[handle.id]
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        seen = 0
        while True:
            while seen < len(generation.pieces):
                text = decoder.decode(generation.pieces[seen])
                seen += 1
                if text:
                    yield text
            if generation.done or generation.pending is None:
                break
            self.pump()
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail

    def result(self, handle: Handle) -> str:
        """The whole text (runs the pool until the generation is over or preempted)."""
        return "".join(self.stream(handle))

    def tokens(self, handle: Handle) -> list[int]:
        """The tokens streamed so far."""
        return list(self._generations[handle.id].tokens)

    def stats(self, handle: Handle) -> GenerationStats:
        """Migrations, recoveries, replayed and divergent tokens, timings."""
        return self._generations[handle.id].stats

    def done(self, handle: Handle) -> bool:
        return self._generations[handle.id].done

    def run(self) -> None:
        """Pump until every generation that is not preempted is over."""
        while any(g.pending is not None for g in self._generations.values()):
            self.pump()

    # --- preemption and migration ------------------------------------------------------------------

    def preempt(self, handle: Handle) -> None:
        """Stop the generation at its next round boundary, put its checkpoint in the object store,
        and free the worker's contexts."""
        generation = self._generations[handle.id]
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
        actor = self._workers[generation.worker].actor
        reference = actor.checkpoint_and_release.remote(generation.handle.id)
        try:
            ray.wait([reference], fetch_local=False)
            ray.get(actor.describe.remote())  # the actor is alive, so the checkpoint call succeeded
        except RayActorError:
            self._lost(generation.worker)
            return
        # What the worker had produced: fewer than were streamed while it regenerates after a recovery.
        generation.checkpoint, generation.checkpoint_tokens = reference, generation.produced
        generation.unconfirmed = None
        generation.worker = None
        generation.stats.preempted_seconds.append(time.perf_counter() - started)

    def resume(self, handle: Handle, worker: int | None = None, *, exact: bool = True) -> int:
        """Continue a preempted generation on ``worker`` (by default the least loaded one that can
        run it exactly); returns the worker. A worker without the generation's model files refuses
        (:class:`~specstate.errors.ModelMismatchError`) and the generation stays preempted."""
        generation = self._generations[handle.id]
        if not generation.preempted or generation.done:
            raise RuntimeError("the generation is not preempted")
        chosen = self._place(worker, generation.fingerprints, generation.n_threads if exact else None)
        started = time.perf_counter()
        self._launch(generation, [chosen])
        generation.preempted = False
        generation.stats.resumed_seconds.append(time.perf_counter() - started)
        return chosen

    def migrate(self, handle: Handle, worker: int | None = None, *, exact: bool = True) -> int:
        """Preempt, then resume on ``worker`` (by default another one that can run it exactly)."""
        generation = self._generations[handle.id]
        source = generation.worker
        self.preempt(handle)
        if generation.done:
            return source if source is not None else -1
        if worker is None:
            fits = self._least_loaded(generation.fingerprints, generation.n_threads if exact else None)
            others = [w for w in fits if w != source]
            worker = others[0] if others else None
        chosen = self.resume(handle, worker, exact=exact)
        generation.stats.migrations += 1
        return chosen

    # --- the driver loop -------------------------------------------------------------------------

    def pump(self, timeout: float | None = None) -> None:
        """Wait for one outstanding worker call and handle it (recovering from a dead worker)."""
        pending = {g.pending: g for g in self._generations.values() if g.pending is not None}
        if not pending:
            return
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        for reference in ready:
            generation = pending[reference]
            if generation.pending is not reference:  # relaunched meanwhile (its worker died)
                continue
            generation.pending = None
            try:
                tokens, pieces, over = ray.get(reference)
            except RayActorError:
                assert generation.worker is not None
                self._lost(generation.worker)
                continue
            self._accept(generation, tokens, pieces, over)

    def _accept(self, generation: _Generation, tokens: list[int], pieces: list[bytes], over: bool) -> None:
        if generation.unconfirmed is not None:  # the actor ran the checkpoint call before this advance
            generation.checkpoint, generation.checkpoint_tokens = generation.unconfirmed, generation.unconfirmed_tokens
            generation.unconfirmed = None
        for token, piece in zip(tokens, pieces):
            index = generation.produced
            generation.produced += 1
            if index < len(generation.tokens):  # regenerated after a recovery: must be what was streamed
                if generation.tokens[index] == token:
                    generation.stats.replayed += 1
                else:
                    generation.stats.divergences += 1
                continue
            generation.tokens.append(token)
            generation.pieces.append(piece)
        if over or len(generation.tokens) >= generation.max_tokens:
            generation.done = True
            self._workers[generation.worker].actor.release.remote(generation.handle.id)  # type: ignore[index]
            generation.worker = None
            return
        if generation.preempted:
            return
        self._maybe_checkpoint(generation)
        self._advance(generation)

    def _maybe_checkpoint(self, generation: _Generation) -> None:
        every = generation.checkpoint_every
        if every is None or generation.worker is None or generation.produced < len(generation.tokens):
            return
        if len(generation.tokens) - max(generation.checkpoint_tokens, generation.unconfirmed_tokens) < every:
            return
        actor = self._workers[generation.worker].actor
        generation.unconfirmed = actor.checkpoint.remote(generation.handle.id)
        generation.unconfirmed_tokens = len(generation.tokens)

    def _advance(self, generation: _Generation) -> None:
        assert generation.worker is not None
        if not self._workers[generation.worker].alive:  # killed by the pool: recover now
            self._lost(generation.worker)
            return
        wanted = generation.max_tokens - generation.produced
        if generation.produced < len(generation.tokens):
            wanted = max(wanted, len(generation.tokens) - generation.produced)
        actor = self._workers[generation.worker].actor
        generation.pending = actor.advance.remote(generation.handle.id, min(self.chunk, max(wanted, 1)))

    # --- placement and recovery ------------------------------------------------------------------

    @staticmethod
    def _models_of(models: Mapping[str, str], target: str, draft: str | None) -> dict[str, str]:
        """The fingerprints, among ``models``, of the files a generation of ``target``/``draft`` runs on."""
        names = [target] if draft is None else [target, draft]
        missing = [name for name in names if name not in models]
        if missing:
            raise PlacementError(f"no model named {missing[0]!r}")
        return {name: models[name] for name in names}

    def _live(self, worker: int) -> _WorkerEntry:
        entry = self._workers.get(worker)
        if entry is None or not entry.alive:
            raise PlacementError(f"worker {worker} is not alive")
        return entry

    def _least_loaded(self, fingerprints: Mapping[str, str], n_threads: int | None) -> list[int]:
        """Live workers holding these model files (and decoding with ``n_threads``, unless None),
        the least loaded first."""
        load = {w: 0 for w in self.workers()}
        for other in self._generations.values():
            if other.worker in load and not other.done:
                load[other.worker] += 1
        fits = [
            w
            for w in load
            if all(self._workers[w].models.get(name) == sha for name, sha in fingerprints.items())
            and (n_threads is None or self._workers[w].n_threads == n_threads)
        ]
        return sorted(fits, key=lambda w: (load[w], w))

    def _place(self, worker: int | None, fingerprints: Mapping[str, str], n_threads: int | None) -> int:
        """``worker`` if it is alive and decodes with ``n_threads`` (None: any count); without one,
        the least loaded worker that can run these model files with that count."""
        if worker is not None:
            entry = self._live(worker)
            if n_threads is not None and entry.n_threads != n_threads:
                raise PlacementError(
                    f"worker {worker} decodes with {entry.n_threads} threads and the generation with "
                    f"{n_threads}: not exact (pass exact=False to allow it)"
                )
            return worker
        fits = self._least_loaded(fingerprints, n_threads)
        if not fits:
            raise PlacementError(f"no live worker has the model files {sorted(fingerprints)} and {n_threads} threads")
        return fits[0]

    def _launch(self, generation: _Generation, workers: list[int]) -> None:
        """Start the generation (from its latest checkpoint, or its prompt) on the first of ``workers``
        that is alive, and ask it for tokens. A dead worker is marked so and the next one tried."""
        for worker in workers:
            actor = self._workers[worker].actor
            try:
                if generation.checkpoint is None:
                    call = actor.start.remote(
                        generation.handle.id,
                        generation.prompt,
                        generation.settings,
                        generation.target,
                        generation.draft,
                    )
                    ray.get(call)
                    produced = 0
                else:
                    call = actor.restore.remote(
                        generation.handle.id, generation.checkpoint, generation.target, generation.draft
                    )
                    produced = ray.get(call)
            except RayActorError:
                self._workers[worker].alive = False  # its own generations recover when their calls fail
                continue
            except ObjectLostError:  # the node holding the checkpoint is gone: start again from the prompt
                generation.checkpoint, generation.checkpoint_tokens = None, 0
                return self._launch(generation, workers)
            if produced != generation.checkpoint_tokens and generation.checkpoint is not None:
                raise RuntimeError("a restored generation does not continue where its checkpoint was taken")
            generation.worker, generation.produced, generation.unconfirmed = worker, produced, None
            self._advance(generation)
            return
        raise WorkerLost(f"generation {generation.handle.id} has no live worker to run on")

    def _lost(self, worker: int) -> None:
        """A worker died: resume each of its generations on a survivor from its latest checkpoint."""
        self._workers[worker].alive = False
        for generation in self._generations.values():
            if generation.worker != worker or generation.done:
                continue
            generation.worker, generation.pending, generation.unconfirmed = None, None, None
            generation.stats.recoveries += 1
            if generation.preempted:  # resumed from its latest checkpoint when asked
                continue
            candidates = self._least_loaded(generation.fingerprints, generation.n_threads)
            if not candidates:
                raise WorkerLost(f"generation {generation.handle.id} has no surviving worker to resume on")
            self._launch(generation, candidates)
