"""Placement: which workers are alive, which hold a generation's model files, and which of them is least loaded."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NoReturn

import ray
from ray.exceptions import RayActorError

from specstate.cluster._records import Generation, WorkerEntry
from specstate.cluster.errors import PlacementError, UnknownWorkerError

logger = logging.getLogger("specstate.cluster")


def models_of(models: Mapping[str, str], target: str, draft: str | None) -> dict[str, str]:
    """The fingerprints, among ``models``, of the files a generation of ``target``/``draft`` runs on."""
    names = [target] if draft is None else [target, draft]
    missing = [name for name in names if name not in models]
    if missing:
        raise PlacementError(f"no model named {missing[0]!r}")
    return {name: models[name] for name in names}


def not_alive(worker: int) -> PlacementError:
    return PlacementError(f"worker {worker} is not alive", worker)


def unplaced(worker: int | None, fingerprints: Mapping[str, str]) -> NoReturn:
    """No worker took the generation: ``worker`` (named by the caller) is dead, or none fits."""
    if worker is not None:
        raise not_alive(worker)
    raise PlacementError(f"no live worker has the model files {sorted(fingerprints)}")


class Placement:
    """The pool's workers by id and the load its generations put on them."""

    def __init__(self, generations: Mapping[str, Generation]) -> None:
        self.workers: dict[int, WorkerEntry] = {}
        self._generations = generations

    def entry(self, worker: int) -> WorkerEntry:
        """A worker of the pool, alive or not (:class:`UnknownWorkerError` for an id the pool never gave)."""
        entry = self.workers.get(worker)
        if entry is None:
            raise UnknownWorkerError(worker)
        return entry

    def live(self, worker: int) -> WorkerEntry:
        """A worker not known to be dead (:class:`PlacementError` otherwise)."""
        entry = self.entry(worker)
        if not entry.alive:
            raise not_alive(worker)
        return entry

    def alive(self) -> list[int]:
        """The ids of the workers not known to be dead."""
        return [worker for worker, entry in self.workers.items() if entry.alive]

    def responds(self, worker: int) -> bool:
        """Whether the worker's process is alive (a round trip to it); a dead one is marked so."""
        try:
            ray.get(self.workers[worker].actor.ping.remote())
        except RayActorError:
            self.died(worker)
            return False
        return True

    def died(self, worker: int) -> None:
        """A call to the worker failed: it is dead (its generations recover when their own calls fail)."""
        entry = self.workers[worker]
        if entry.alive:
            entry.alive = False
            logger.info("worker %d (pid %d) died", worker, entry.pid)

    def least_loaded(self, fingerprints: Mapping[str, str]) -> list[int]:
        """Live workers holding these model files, the least loaded first."""
        load = {w: 0 for w in self.alive()}
        for other in self._generations.values():
            if other.worker in load and not other.done:
                load[other.worker] += 1
        fits = [w for w in load if all(self.workers[w].models.get(name) == sha for name, sha in fingerprints.items())]
        return sorted(fits, key=lambda w: (load[w], w))

    def candidates(self, fingerprints: Mapping[str, str]) -> list[int]:
        """The workers to try, in order, for a generation of these model files (:class:`PlacementError`: none)."""
        fits = self.least_loaded(fingerprints)
        if not fits:
            unplaced(None, fingerprints)
        return fits

    def check(self, worker: int, fingerprints: Mapping[str, str] | None = None) -> None:
        """Refuse ``worker`` if it is not alive or (when given) does not hold these model files."""
        entry = self.live(worker)
        other = sorted(name for name, sha in (fingerprints or {}).items() if entry.models.get(name) != sha)
        if other:
            raise PlacementError(
                f"worker {worker} does not hold the generation's model files {other}: it would refuse its checkpoint",
                worker,
            )

    def migration_target(self, generation: Generation, worker: int | None) -> int:
        """The worker a migration goes to, checked before the generation is touched: ``worker`` if it can
        run the generation, else the least loaded live one other than its own (its own when no other is)."""
        if worker is not None:
            self.check(worker, generation.fingerprints)
            if not self.responds(worker):
                raise not_alive(worker)
            return worker
        fits = self.least_loaded(generation.fingerprints)
        for other in sorted(fits, key=lambda w: w == generation.worker):  # its own worker last
            if self.responds(other):
                return other
        unplaced(None, generation.fingerprints)
