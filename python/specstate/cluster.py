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
fingerprint), on the CPU backend. The thread count does not matter: a verified
row gets its single-token decode's logits bit for bit at any count
(specstate's llama.cpp patch), so a generation moves between workers with
different counts and continues token for token.

Misuse and failures raise the pool's errors (:class:`PoolError` and its
subclasses, each with its fields as attributes, and picklable); an error that a
worker's own code raised (such as
:class:`~specstate.errors.ModelMismatchError`) reaches the caller as itself.
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
from typing import Any, ClassVar, NoReturn

try:
    import ray
    import ray._private.worker as ray_worker
    from ray.exceptions import ObjectLostError, RayActorError, RayTaskError
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(f"specstate.cluster needs Ray: pip install 'specstate[ray]' ({error})") from error

from specstate import Generator, Model, model_fingerprint
from specstate._typing import GeneratorSettings

__all__ = [
    "GenerationPreempted",
    "GenerationStateError",
    "GenerationStats",
    "Handle",
    "PlacementError",
    "Pool",
    "PoolError",
    "UnknownGenerationError",
    "UnknownWorkerError",
    "WorkerLost",
]

logger = logging.getLogger(__name__)


class PoolError(RuntimeError):
    """Base of the errors of :class:`Pool`. Each is built from its fields (attributes of the same names),
    its ``str()`` is made from them, and it pickles."""

    _fields: ClassVar[tuple[str, ...]] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), tuple(getattr(self, name) for name in self._fields))


class PlacementError(PoolError):
    """No live worker can run the generation exactly (its model files), or the one named cannot.

    Attributes:
        reason: what was refused, and why.
        worker: the worker named by the caller (``None`` when the pool was to choose).
    """

    _fields = ("reason", "worker")

    def __init__(self, reason: str, worker: int | None = None) -> None:
        super().__init__(reason, worker)
        self.reason = reason
        self.worker = worker

    def __str__(self) -> str:
        return self.reason


class WorkerLost(PoolError):
    """A worker died and generations on it have no surviving worker to resume on. They are left preempted,
    with their latest checkpoints: :meth:`Pool.resume` them once a worker that can run them is added.

    Attributes:
        worker: the worker that died.
        generations: the ids (:attr:`Handle.id`) of the generations left preempted.
    """

    _fields = ("worker", "generations")

    def __init__(self, worker: int, generations: list[str]) -> None:
        super().__init__(worker, generations)
        self.worker = worker
        self.generations = generations

    def __str__(self) -> str:
        return (
            f"worker {self.worker} died and no live worker can run generation(s) {', '.join(self.generations)}: "
            "they are preempted with their latest checkpoints (resume them after add_worker())"
        )


class UnknownWorkerError(PoolError, LookupError):
    """No worker of the pool has this id.

    Attributes:
        worker: the id given.
    """

    _fields = ("worker",)

    def __init__(self, worker: int) -> None:
        super().__init__(worker)
        self.worker = worker

    def __str__(self) -> str:
        return f"the pool has no worker {self.worker!r}"


class UnknownGenerationError(PoolError, LookupError):
    """The handle is not one of the pool's generations (another pool's, or the pool is closed).

    Attributes:
        generation: the handle's id.
    """

    _fields = ("generation",)

    def __init__(self, generation: str) -> None:
        super().__init__(generation)
        self.generation = generation

    def __str__(self) -> str:
        return f"the pool has no generation {self.generation!r}"


class GenerationStateError(PoolError):
    """A call that the generation's state does not allow: resuming one that is not preempted, migrating
    one that is finished.

    Attributes:
        generation: the generation's id.
        state: ``"running"``, ``"preempted"`` or ``"finished"``.
        operation: the method called.
    """

    _fields: ClassVar[tuple[str, ...]] = ("generation", "state", "operation")

    def __init__(self, generation: str, state: str, operation: str) -> None:
        super().__init__(generation, state, operation)
        self.generation = generation
        self.state = state
        self.operation = operation

    def __str__(self) -> str:
        return f"cannot {self.operation} generation {self.generation}: it is {self.state}"


class GenerationPreempted(GenerationStateError):
    """:meth:`Pool.stream` or :meth:`Pool.result` reached a preemption: every token produced before it
    has been handed out. After :meth:`Pool.resume`, :meth:`Pool.stream` continues where it stopped.

    Attributes:
        generation: the generation's id.
        operation: ``"stream"`` or ``"result"``.
    """

    _fields = ("generation", "operation")

    def __init__(self, generation: str, operation: str) -> None:
        super().__init__(generation, "preempted", operation)

    def __str__(self) -> str:
        return (
            f"generation {self.generation} is preempted: resume() it, then {self.operation}() goes on where it stopped"
        )


def _raise_cause(error: RayTaskError) -> NoReturn:
    """Raise what a worker's code raised, as itself: Ray wraps it in a RayTaskError whose text is the
    worker's whole traceback."""
    raise error.cause from None


def _get(reference: Any) -> Any:
    """``ray.get``, with an error raised by the worker's code given as itself."""
    try:
        return ray.get(reference)
    except RayTaskError as error:
        _raise_cause(error)


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

    def ping(self) -> None:
        """Nothing: a call that completes only while the worker's process lives."""

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


def _utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


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
    worker: int | None = None
    tokens: list[int] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=list)
    handed: int = 0  # pieces that the caller's streams have taken
    decoder: codecs.IncrementalDecoder = field(default_factory=_utf8_decoder)  # of the caller's streams
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


@dataclass
class _WorkerEntry:
    actor: Any
    pid: int
    n_threads: int
    models: dict[str, str]
    alive: bool = True


def _quiet_raylet(quiet: bool) -> None:
    """Whether the driver prints the raylet's notices: Ray's driver prints them (a dozen lines, such as
    "A worker died or was killed ..." for a worker killed from outside) on its standard output even with
    ``log_to_driver=False``. This module switch of Ray's, the one its debugger uses, is the only one that
    stops them; the pool reports a dead worker on its own logger."""
    ray_worker._worker_logs_enabled = not quiet


class Pool:
    """Ray actor workers running generations; see the module docstring.

    Args:
        models: model files by name (``{"target": path, "draft": path}``); each worker loads them once.
        workers: how many workers to start.
        n_threads: threads each worker decodes with.
        address: an existing Ray cluster (``ray.init(address=...)``); by default a local instance is
            started (or the one this process already joined is used). A Ray instance that the pool starts
            prints nothing on the driver's output; one that the caller started keeps its own settings.
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
            _quiet_raylet(True)
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
            _quiet_raylet(False)

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
        """The ids of the workers not known to be dead (one killed from outside counts as dead once
        a call to it has failed)."""
        return [worker for worker, entry in self._workers.items() if entry.alive]

    def worker_pid(self, worker: int) -> int:
        """The process id of a worker (:class:`UnknownWorkerError` for an id the pool never gave)."""
        return self._entry(worker).pid

    def kill(self, worker: int) -> None:
        """Kill a worker's process (as a crash would); its generations recover when their calls fail.
        Killing a dead worker does nothing; an id the pool never gave raises :class:`UnknownWorkerError`."""
        entry = self._entry(worker)
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
            fingerprints = self._models_of(self._home, target, draft)
            candidates = self._candidates(fingerprints)
        else:
            fingerprints = self._models_of(self._live(worker).models, target, draft)
            candidates = [worker]
        generation = _Generation(
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
        if not generation.done and not self._launch(generation, candidates):
            self._unplaced(worker, fingerprints)
        self._generations[generation.handle.id] = generation
        return generation.handle

    def stream(self, handle: Handle) -> Iterator[str]:
        """Yield the generation's text as it is committed, running the pool meanwhile.

        The caller's streams of a generation share one position: a stream starts where the previous one
        stopped (at the start the first time), so joining every stream's pieces gives the text once. At a
        preemption, once everything produced before it is handed out, the stream raises
        :class:`GenerationPreempted`; after :meth:`resume`, a new stream (or one that was waiting at a
        piece when the generation was preempted) continues where it stopped."""
        return self._stream(self._generation(handle))

    def _stream(self, generation: _Generation) -> Iterator[str]:
        while True:
            while generation.handed < len(generation.pieces):
                piece = generation.pieces[generation.handed]
                generation.handed += 1
                text = generation.decoder.decode(piece)
                if text:
                    yield text
            if generation.done:
                break
            if generation.pending is None:
                raise GenerationPreempted(generation.handle.id, "stream")
            self.pump()
        tail = generation.decoder.decode(b"", final=True)
        if tail:
            yield tail

    def take_text(self, handle: Handle) -> str:
        """The text produced and not yet handed out, without running the pool (a driver that serves several
        generations pumps itself); it moves the streams' position, as :meth:`stream` does."""
        return self._take_text(self._generation(handle))

    def _take_text(self, generation: _Generation) -> str:
        pieces = generation.pieces[generation.handed :]
        generation.handed += len(pieces)
        text = "".join(generation.decoder.decode(piece) for piece in pieces)
        return text + (generation.decoder.decode(b"", final=True) if generation.done else "")

    def result(self, handle: Handle) -> str:
        """The whole text, from its start (runs the pool until the generation is over; raises
        :class:`GenerationPreempted` if it is preempted first). The streams' position does not move."""
        generation = self._generation(handle)
        while not generation.done:
            if generation.pending is None:
                raise GenerationPreempted(generation.handle.id, "result")
            self.pump()
        return b"".join(generation.pieces).decode("utf-8", errors="replace")

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
        while any(g.pending is not None for g in self._generations.values()):
            self.pump()

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
        actor = self._workers[generation.worker].actor
        reference = actor.checkpoint_and_release.remote(generation.handle.id)
        try:
            ray.wait([reference], fetch_local=False)
            ray.get(actor.ping.remote())  # the actor is alive, so the checkpoint call succeeded
        except RayActorError:
            self._lost(generation.worker)
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
            candidates = self._candidates(generation.fingerprints)
        else:
            self._placeable(worker)
            candidates = [worker]
        started = time.perf_counter()
        if not self._launch(generation, candidates):
            self._unplaced(worker, generation.fingerprints)
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
        chosen = self._migration_target(generation, worker)
        self.preempt(handle)
        if generation.done:  # its outstanding call finished it: nothing to move
            assert source is not None
            return source
        started = time.perf_counter()
        try:
            moved = self._launch(generation, [chosen])
        except Exception:
            self._fall_back(generation, source, chosen)
            raise
        if not moved:
            self._fall_back(generation, source, chosen)
            raise self._not_alive(chosen)
        generation.preempted = False
        generation.stats.resumed_seconds.append(time.perf_counter() - started)
        generation.stats.migrations += 1
        return chosen

    def _migration_target(self, generation: _Generation, worker: int | None) -> int:
        """The worker a migration goes to, checked before the generation is touched: ``worker`` if it can
        run the generation, else the least loaded live one other than its own (its own when no other is)."""
        if worker is not None:
            self._placeable(worker, generation.fingerprints)
            if not self._responds(worker):
                raise self._not_alive(worker)
            return worker
        fits = self._least_loaded(generation.fingerprints)
        for other in sorted(fits, key=lambda w: w == generation.worker):  # its own worker last
            if self._responds(other):
                return other
        self._unplaced(None, generation.fingerprints)

    def _fall_back(self, generation: _Generation, source: int | None, target: int) -> None:
        """After a failed migration: resume the generation on ``source``, or (dead too) on another live
        worker than ``target``; none, or no ``source`` (it was preempted): it stays preempted."""
        if source is None:
            return
        others = [w for w in self._least_loaded(generation.fingerprints) if w != target]
        if self._launch(generation, [source, *others]):
            generation.preempted = False

    # --- the driver loop -------------------------------------------------------------------------

    def pump(self, timeout: float | None = None) -> None:
        """Wait for one outstanding worker call and handle it (recovering from a dead worker). An error
        that a generation's worker raised ends the generation and is raised here, as itself."""
        pending = {g.pending: g for g in self._generations.values() if g.pending is not None}
        if not pending:
            return
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        for reference in ready:
            generation = pending[reference]
            if generation.pending is not reference:  # relaunched meanwhile (its worker died)
                continue
            generation.pending = None
            assert generation.worker is not None
            try:
                tokens, pieces, over = ray.get(reference)
            except RayActorError:
                self._lost(generation.worker)
                continue
            except RayTaskError as error:
                self._end(generation)
                _raise_cause(error)
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
            self._end(generation)
            return
        if generation.preempted:
            return
        self._maybe_checkpoint(generation)
        self._advance(generation)

    def _end(self, generation: _Generation) -> None:
        """The generation is over: its worker drops it."""
        generation.done, generation.preempted = True, False
        if generation.worker is not None:
            self._workers[generation.worker].actor.release.remote(generation.handle.id)
        generation.worker = None

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

    def _generation(self, handle: Handle) -> _Generation:
        generation = self._generations.get(handle.id)
        if generation is None:
            raise UnknownGenerationError(handle.id)
        return generation

    def _entry(self, worker: int) -> _WorkerEntry:
        entry = self._workers.get(worker)
        if entry is None:
            raise UnknownWorkerError(worker)
        return entry

    @staticmethod
    def _models_of(models: Mapping[str, str], target: str, draft: str | None) -> dict[str, str]:
        """The fingerprints, among ``models``, of the files a generation of ``target``/``draft`` runs on."""
        names = [target] if draft is None else [target, draft]
        missing = [name for name in names if name not in models]
        if missing:
            raise PlacementError(f"no model named {missing[0]!r}")
        return {name: models[name] for name in names}

    @staticmethod
    def _not_alive(worker: int) -> PlacementError:
        return PlacementError(f"worker {worker} is not alive", worker)

    def _live(self, worker: int) -> _WorkerEntry:
        entry = self._entry(worker)
        if not entry.alive:
            raise self._not_alive(worker)
        return entry

    def _responds(self, worker: int) -> bool:
        """Whether the worker's process is alive (a round trip to it); a dead one is marked so."""
        try:
            ray.get(self._workers[worker].actor.ping.remote())
        except RayActorError:
            self._died(worker)
            return False
        return True

    def _died(self, worker: int) -> None:
        """A call to the worker failed: it is dead (its generations recover when their own calls fail)."""
        entry = self._workers[worker]
        if entry.alive:
            entry.alive = False
            logger.info("worker %d (pid %d) died", worker, entry.pid)

    def _least_loaded(self, fingerprints: Mapping[str, str]) -> list[int]:
        """Live workers holding these model files, the least loaded first."""
        load = {w: 0 for w in self.workers()}
        for other in self._generations.values():
            if other.worker in load and not other.done:
                load[other.worker] += 1
        fits = [w for w in load if all(self._workers[w].models.get(name) == sha for name, sha in fingerprints.items())]
        return sorted(fits, key=lambda w: (load[w], w))

    def _candidates(self, fingerprints: Mapping[str, str]) -> list[int]:
        """The workers to try, in order, for a generation of these model files."""
        fits = self._least_loaded(fingerprints)
        if not fits:
            self._unplaced(None, fingerprints)
        return fits

    def _unplaced(self, worker: int | None, fingerprints: Mapping[str, str]) -> NoReturn:
        """No worker took the generation: ``worker`` (named by the caller) is dead, or none fits."""
        if worker is not None:
            raise self._not_alive(worker)
        raise PlacementError(f"no live worker has the model files {sorted(fingerprints)}")

    def _placeable(self, worker: int, fingerprints: Mapping[str, str] | None = None) -> None:
        """Refuse ``worker`` if it is not alive or (when given) does not hold these model files."""
        entry = self._live(worker)
        other = sorted(name for name, sha in (fingerprints or {}).items() if entry.models.get(name) != sha)
        if other:
            raise PlacementError(
                f"worker {worker} does not hold the generation's model files {other}: it would refuse its checkpoint",
                worker,
            )

    def _launch(self, generation: _Generation, workers: list[int]) -> bool:
        """Start the generation (from its latest checkpoint, or its prompt) on the first of ``workers``
        that is alive, and ask it for tokens; returns whether one was. A dead worker is marked so and the
        next one tried; an error that the worker's code raised (a refused checkpoint) is raised as itself."""
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
                    _get(call)
                    produced = 0
                else:
                    call = actor.restore.remote(
                        generation.handle.id, generation.checkpoint, generation.target, generation.draft
                    )
                    produced = _get(call)
            except RayActorError:
                self._died(worker)
                continue
            except ObjectLostError:  # the node holding the checkpoint is gone: start again from the prompt
                generation.checkpoint, generation.checkpoint_tokens = None, 0
                return self._launch(generation, workers)
            if produced != generation.checkpoint_tokens and generation.checkpoint is not None:
                raise RuntimeError("a restored generation does not continue where its checkpoint was taken")
            generation.worker, generation.produced, generation.unconfirmed = worker, produced, None
            self._advance(generation)
            return True
        return False

    def _lost(self, worker: int) -> None:
        """A worker died: resume each of its generations on a survivor from its latest checkpoint. Those
        that no survivor can run are left preempted (:class:`WorkerLost`)."""
        self._died(worker)
        stranded = []
        for generation in list(self._generations.values()):
            if generation.worker != worker or generation.done:
                continue
            generation.worker, generation.pending, generation.unconfirmed = None, None, None
            generation.stats.recoveries += 1
            if generation.preempted:  # resumed from its latest checkpoint when asked
                continue
            generation.preempted = True  # until it runs again
            if self._launch(generation, self._least_loaded(generation.fingerprints)):
                generation.preempted = False
            else:
                stranded.append(generation.handle.id)
        if stranded:
            raise WorkerLost(worker, stranded)
