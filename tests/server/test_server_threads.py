"""The server's slots and the Ray workers decode with the default thread count's rule (docs/threads.md) when given
no count: the slots of one process, or the pool's workers on one node, share the machine's cores."""

from __future__ import annotations

from pathlib import Path

from specstate import default_threads
from specstate.cluster._worker import Worker
from specstate.serve.config import ServerConfig


def test_slots_share_the_default_thread_count(tiny_map: dict[str, Path]) -> None:
    path = str(tiny_map["llama"])
    for slots in (1, 2, 3):
        assert ServerConfig(model_path=path, slots=slots).threads_per_slot() == default_threads(slots)
    assert ServerConfig(model_path=path, slots=2, n_threads=3).threads_per_slot() == 3


def test_a_ray_worker_takes_its_share_of_the_node(tiny_map: dict[str, Path]) -> None:
    models = {"target": str(tiny_map["llama"])}
    assert Worker(models, 0, sharing=2).n_threads == default_threads(2)
    assert Worker(models, 0).n_threads == default_threads()
    assert Worker(models, 3, sharing=2).describe()["n_threads"] == 3
