"""The errors of :class:`specstate.cluster.Pool`: each is built from its fields, made of them, and pickles."""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "GenerationPreempted",
    "GenerationStateError",
    "PlacementError",
    "PoolError",
    "UnknownGenerationError",
    "UnknownWorkerError",
    "WorkerLost",
]


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
