"""Recovery: generations whose worker died, or whose migration failed, resume elsewhere from their latest checkpoint.

The tokens a resumed generation regenerates after its checkpoint are compared with those already streamed
(:meth:`Generation.record <specstate.cluster._records.Generation.record>`): a difference is counted, never streamed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from specstate.cluster._placement import Placement
from specstate.cluster._records import Generation
from specstate.cluster.errors import WorkerLost

#: Start a generation on the first of these workers that is alive; whether one was.
Launch = Callable[[Generation, list[int]], bool]


class Recovery:
    """Resumes generations after a worker died or a migration failed, through the driver's ``launch``."""

    def __init__(self, placement: Placement, generations: Mapping[str, Generation], launch: Launch) -> None:
        self._placement = placement
        self._generations = generations
        self._launch = launch

    def lost(self, worker: int) -> None:
        """A worker died: resume each of its generations on a survivor from its latest checkpoint. Those
        that no survivor can run are left preempted (:class:`WorkerLost`)."""
        self._placement.died(worker)
        stranded = []
        for generation in list(self._generations.values()):
            if generation.worker != worker or generation.done:
                continue
            generation.worker, generation.pending, generation.unconfirmed = None, None, None
            generation.stats.recoveries += 1
            if generation.preempted:  # resumed from its latest checkpoint when asked
                continue
            generation.preempted = True  # until it runs again
            if self._launch(generation, self._placement.least_loaded(generation.fingerprints)):
                generation.preempted = False
            else:
                stranded.append(generation.handle.id)
        if stranded:
            raise WorkerLost(worker, stranded)

    def fall_back(self, generation: Generation, source: int | None, target: int) -> None:
        """After a failed migration: resume the generation on ``source``, or (dead too) on another live
        worker than ``target``; none, or no ``source`` (it was preempted): it stays preempted."""
        if source is None:
            return
        others = [w for w in self._placement.least_loaded(generation.fingerprints) if w != target]
        if self._launch(generation, [source, *others]):
            generation.preempted = False
