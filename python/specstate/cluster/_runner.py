"""The driver loop: generations started or restored on workers, their tokens asked for a chunk at a time and taken
in, their periodic checkpoints and their end; a dead worker's generations go to :class:`Recovery`."""

from __future__ import annotations

from collections.abc import Mapping

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError

from specstate import _defaults
from specstate.cluster._placement import Placement
from specstate.cluster._records import Generation
from specstate.cluster._recovery import Recovery
from specstate.cluster._worker import get, raise_cause


class Runner:
    """Runs the pool's generations on its workers (``chunk``: tokens asked of a worker per call)."""

    def __init__(self, placement: Placement, generations: Mapping[str, Generation], chunk: int) -> None:
        self._placement = placement
        self._generations = generations
        self.chunk = chunk
        self.recovery = Recovery(placement, generations, self.launch)

    def launch(self, generation: Generation, workers: list[int]) -> bool:
        """Start the generation (from its latest checkpoint, or its prompt) on the first of ``workers``
        that is alive, and ask it for tokens; returns whether one was. A dead worker is marked so and the
        next one tried; an error that the worker's code raised (a refused checkpoint) is raised as itself."""
        for worker in workers:
            actor = self._placement.workers[worker].actor
            try:
                if generation.checkpoint is None:
                    call = actor.start.remote(
                        generation.handle.id,
                        generation.prompt,
                        generation.settings,
                        generation.target,
                        generation.draft,
                    )
                    get(call)
                    produced = 0
                else:
                    call = actor.restore.remote(
                        generation.handle.id,
                        generation.checkpoint,
                        generation.target,
                        generation.draft,
                        generation.settings.get("grammar_drafts", _defaults.GRAMMAR_DRAFTS),
                    )
                    produced = get(call)
            except RayActorError:
                self._placement.died(worker)
                continue
            except ObjectLostError:  # the node holding the checkpoint is gone: start again from the prompt
                generation.checkpoint, generation.checkpoint_tokens = None, 0
                return self.launch(generation, workers)
            if produced != generation.checkpoint_tokens and generation.checkpoint is not None:
                raise RuntimeError("a restored generation does not continue where its checkpoint was taken")
            generation.worker, generation.produced, generation.unconfirmed = worker, produced, None
            self._advance(generation)
            return True
        return False

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
                self.recovery.lost(generation.worker)
                continue
            except RayTaskError as error:
                self.end(generation)
                raise_cause(error)
            self._accept(generation, tokens, pieces, over)

    def run(self) -> None:
        """Pump until every generation that is not preempted is over."""
        while any(g.pending is not None for g in self._generations.values()):
            self.pump()

    def end(self, generation: Generation) -> None:
        """The generation is over: its worker drops it."""
        generation.done, generation.preempted = True, False
        if generation.worker is not None:
            self._placement.workers[generation.worker].actor.release.remote(generation.handle.id)
        generation.worker = None

    def _accept(self, generation: Generation, tokens: list[int], pieces: list[bytes], over: bool) -> None:
        if generation.unconfirmed is not None:  # the actor ran the checkpoint call before this advance
            generation.checkpoint, generation.checkpoint_tokens = generation.unconfirmed, generation.unconfirmed_tokens
            generation.unconfirmed = None
        for token, piece in zip(tokens, pieces):
            generation.record(token, piece)
        if over or len(generation.tokens) >= generation.max_tokens:
            self.end(generation)
            return
        if generation.preempted:
            return
        self._maybe_checkpoint(generation)
        self._advance(generation)

    def _maybe_checkpoint(self, generation: Generation) -> None:
        every = generation.checkpoint_every
        if every is None or generation.worker is None or generation.produced < len(generation.tokens):
            return
        if len(generation.tokens) - max(generation.checkpoint_tokens, generation.unconfirmed_tokens) < every:
            return
        actor = self._placement.workers[generation.worker].actor
        generation.unconfirmed = actor.checkpoint.remote(generation.handle.id)
        generation.unconfirmed_tokens = len(generation.tokens)

    def _advance(self, generation: Generation) -> None:
        assert generation.worker is not None
        if not self._placement.workers[generation.worker].alive:  # killed by the pool: recover now
            self.recovery.lost(generation.worker)
            return
        wanted = generation.max_tokens - generation.produced
        if generation.produced < len(generation.tokens):
            wanted = max(wanted, len(generation.tokens) - generation.produced)
        actor = self._placement.workers[generation.worker].actor
        generation.pending = actor.advance.remote(generation.handle.id, min(self.chunk, max(wanted, 1)))
