"""Speculative generations on a pool of Ray workers that preempt, migrate and recover bit for bit.

``pip install 'specstate[ray]'``. The core package never imports Ray; this
package does.

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

The package's parts: :mod:`~specstate.cluster.pool` (the :class:`Pool`), its placement of generations on
workers, its driver loop, its recovery from dead workers and its streams (``_placement``, ``_runner``,
``_recovery``, ``_streaming``), the Ray actor (``_worker``) and the errors (:mod:`~specstate.cluster.errors`).

Misuse and failures raise the pool's errors (:class:`PoolError` and its
subclasses, each with its fields as attributes, and picklable); an error that a
worker's own code raised (such as
:class:`~specstate.errors.ModelMismatchError`) reaches the caller as itself.
"""

from __future__ import annotations

try:
    import ray  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(f"specstate.cluster needs Ray: pip install 'specstate[ray]' ({error})") from error

from specstate.cluster._records import GenerationStats, Handle
from specstate.cluster.errors import (
    GenerationPreempted,
    GenerationStateError,
    PlacementError,
    PoolError,
    UnknownGenerationError,
    UnknownWorkerError,
    WorkerLost,
)
from specstate.cluster.pool import Pool

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
