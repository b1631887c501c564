"""The server's slots and the Ray workers decode with the default thread count's rule (docs/threads.md) when given
no count: the slots of one process, or the Ray workers on one node, share the machine's cores."""

from __future__ import annotations

from pathlib import Path

from specstate import default_threads
from specstate.cluster._worker import Worker
from specstate.serve.config import ServerConfig
from specstate.serve.ray_worker import worker_config


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


def test_a_servers_ray_worker_takes_its_share_of_the_node(tiny_map: dict[str, Path]) -> None:
    """``specstate serve --ray-workers``: a worker's batched engine, or each of its separate slots, decodes with the
    default thread count of every worker's generations on the node decoding at once."""
    path = str(tiny_map["llama"])
    batched = ServerConfig(model_path=path, mode="ngram", slots=3)
    assert worker_config(batched, sharing=2).engine_threads() == default_threads(2)
    separate = ServerConfig(model_path=path, mode="ngram", slots=3, separate_slots=True)
    assert worker_config(separate, sharing=2).threads_per_slot() == default_threads(6)
    assert worker_config(ServerConfig(model_path=path, n_threads=3), sharing=2).n_threads == 3
