"""specstate.cluster on a local Ray instance: migration, recovery from a killed worker, refused checkpoints."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray  # the `ray` extra, in requirements-dev.txt: without it these tests fail, they are not skipped

from specstate import Generator, Model
from specstate.cluster import (
    GenerationPreempted,
    GenerationStateError,
    Handle,
    PlacementError,
    Pool,
    PoolError,
    UnknownGenerationError,
    UnknownWorkerError,
    WorkerLost,
)
from specstate.cluster._worker import Worker
from specstate.errors import ModelMismatchError
from specstate_testkit import models
from specstate_testkit.generator_support import MODES, TINY_CTX, sampling, tiny_generator

PROMPT = "Once upon a time"
TOKENS = 60
DRAFTS = {"draft": "llama", "eagle3": "eagle3_draft"}


@pytest.fixture(scope="module")
def pool(tiny_map: dict[str, Path]) -> Iterator[Pool]:
    if ray.is_initialized():  # the servers' shared instance: this pool is to start its own
        ray.shutdown()
    with Pool(tiny_map, workers=2, n_threads=1, chunk=8) as pool:
        yield pool
    assert not ray.is_initialized()  # the pool started the local instance, so closing it stops it


def settings(mode: str, sampled: bool) -> dict[str, Any]:
    """The pool's version of tiny_generator's settings."""
    return dict(mode=mode, n_ctx=TINY_CTX, n_batch=64, n_draft=4, **sampling(sampled))


def submit(pool: Pool, mode: str, sampled: bool = False, tokens: int = TOKENS, **options: Any) -> Handle:
    return pool.submit(
        PROMPT, max_tokens=tokens, target="qwen35", draft=DRAFTS.get(mode), **settings(mode, sampled), **options
    )


def reference(
    tiny_map: dict[str, Path], mode: str, sampled: bool = False, tokens: int = TOKENS
) -> tuple[list[int], str]:
    """The same generation, uninterrupted, in this process."""
    generator = tiny_generator(mode, tiny_map, sampled=sampled)
    text = generator.generate(PROMPT, max_tokens=tokens)
    return generator.tokens, text


def test_the_core_package_does_not_import_ray() -> None:
    code = "import sys, specstate, specstate.cli, specstate.chat; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


CASES = [(mode, False) for mode in MODES] + [(mode, True) for mode in MODES]


@pytest.mark.parametrize(("mode", "sampled"), CASES, ids=[f"{m}-{'sampled' if s else 'greedy'}" for m, s in CASES])
def test_a_migrated_generation_continues_exactly(
    pool: Pool, tiny_map: dict[str, Path], mode: str, sampled: bool
) -> None:
    handle = submit(pool, mode, sampled)
    pieces = pool.stream(handle)
    text = "".join(next(pieces) for _ in range(5))
    source = pool.worker_of(handle)
    assert pool.migrate(handle) != source
    text += next(pieces)
    pool.preempt(handle)  # stopped at a boundary, its contexts freed, its checkpoint in the object store
    assert pool.worker_of(handle) is None
    pool.resume(handle)
    text += "".join(pieces)
    tokens, expected = reference(tiny_map, mode, sampled)
    assert pool.tokens(handle) == tokens
    assert text == expected  # every token streamed once, none skipped
    stats = pool.stats(handle)
    assert (stats.migrations, stats.recoveries, stats.divergences) == (1, 0, 0)


def test_the_generations_of_a_killed_worker_recover_exactly(pool: Pool, tiny_map: dict[str, Path]) -> None:
    cases = [("ngram", True, 8), ("draft", False, 8), ("mtp", True, 8), ("eagle3", False, None)]
    victim = pool.workers()[0]
    long = 200  # none of them is over when the worker dies
    handles = [
        submit(pool, mode, sampled, long, checkpoint_every=every, worker=victim) for mode, sampled, every in cases
    ]
    streams = [pool.stream(handle) for handle in handles]
    texts = ["".join(next(stream) for _ in range(25)) for stream in streams]
    streamed = [len(pool.tokens(handle)) for handle in handles]
    pool.kill(victim)
    texts = [text + "".join(stream) for text, stream in zip(texts, streams)]
    assert victim not in pool.workers()
    for (mode, sampled, every), handle, text, before in zip(cases, handles, texts, streamed):
        tokens, expected = reference(tiny_map, mode, sampled, long)
        assert pool.tokens(handle) == tokens and text == expected, mode
        stats = pool.stats(handle)
        assert (stats.recoveries, stats.divergences) == (1, 0)
        # Regenerated from its latest checkpoint (a few chunks back at most), or from its prompt without one:
        # everything streamed before the kill, plus what the call in flight at the kill delivered (one chunk
        # at most: the worker may finish it before it dies).
        if every is None:
            assert before <= stats.replayed <= before + pool.chunk, stats
        else:
            assert 0 < stats.replayed <= every + 2 * pool.chunk, stats
    pool.add_worker(n_threads=1)


def test_a_generation_preempted_while_it_regenerates_resumes_exactly(pool: Pool, tiny_map: dict[str, Path]) -> None:
    victim = pool.workers()[0]
    handle = submit(pool, "none", worker=victim)  # no checkpoints: it regenerates from its prompt
    pieces = pool.stream(handle)
    text = "".join(next(pieces) for _ in range(20))
    pool.kill(victim)
    pool.pump()  # recovered on a survivor, which starts regenerating what was streamed
    pool.migrate(handle)  # taken while it is still behind the stream
    text += "".join(pieces)
    tokens, expected = reference(tiny_map, "none")
    assert pool.tokens(handle) == tokens and text == expected
    stats = pool.stats(handle)
    assert (stats.recoveries, stats.migrations, stats.divergences) == (1, 1, 0)
    pool.add_worker(n_threads=1)


def kill_from_outside(pool: Pool, worker: int) -> None:
    """SIGKILL a worker's process behind the pool's back (as the kernel's OOM killer would)."""
    os.kill(pool.worker_pid(worker), signal.SIGKILL)


def test_a_worker_killed_behind_the_pools_back_is_passed_over_quietly(
    pool: Pool, tiny_map: dict[str, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    parked = submit(pool, "ngram")
    parked_pieces = pool.stream(parked)
    parked_text = next(parked_pieces)
    pool.preempt(parked)
    # Nothing runs: placement goes by worker id, so the added workers come last, in their order.
    first, *_ = pool.workers()
    spare, _, last = pool.add_worker(), pool.add_worker(), pool.add_worker()
    kill_from_outside(pool, first)
    handle = submit(pool, "none")  # the least loaded worker is dead: the next one takes it
    kill_from_outside(pool, spare)
    pool.resume(parked)  # on the two least loaded workers: the dead spare, then a live one
    kill_from_outside(pool, last)
    source = pool.worker_of(handle)
    target = pool.migrate(handle)  # the least loaded other worker (the dead last one) is passed over
    assert target not in (source, first, spare, last) and pool.worker_of(parked) not in (first, spare)
    assert not {first, spare, last} & set(pool.workers())
    parked_text += "".join(parked_pieces)
    assert (pool.result(handle), parked_text) == (reference(tiny_map, "none")[1], reference(tiny_map, "ngram")[1])
    time.sleep(1)  # Ray's driver would have printed its notice of each death by now
    assert "worker died" not in "".join(capfd.readouterr())  # the driver's output is the library's own


def test_a_stream_stops_at_a_preemption_and_the_next_continues_where_it_stopped(
    pool: Pool, tiny_map: dict[str, Path]
) -> None:
    handle = submit(pool, "mtp", sampled=True)
    pieces = pool.stream(handle)
    text = "".join(next(pieces) for _ in range(3))
    pool.preempt(handle)
    with pytest.raises(GenerationPreempted) as caught:  # after the pieces produced before the preemption
        for piece in pieces:
            text += piece
    assert (caught.value.generation, caught.value.state, caught.value.operation) == (handle.id, "preempted", "stream")
    with pytest.raises(GenerationPreempted, match="result"):
        pool.result(handle)
    pool.resume(handle)
    text += "".join(pool.stream(handle))  # from where the first stream stopped
    expected = reference(tiny_map, "mtp", sampled=True)[1]
    assert text == expected and pool.result(handle) == expected  # the result is the whole text
    assert "".join(pool.stream(handle)) == ""  # everything was handed out


def test_the_pools_misuse_raises_its_own_typed_errors(pool: Pool) -> None:
    handle = submit(pool, "none", tokens=4)
    with pytest.raises(GenerationStateError, match="it is running") as running:
        pool.resume(handle)
    pool.result(handle)
    with pytest.raises(GenerationStateError, match="it is finished") as finished:
        pool.migrate(handle)
    with pytest.raises(GenerationStateError, match="it is finished"):
        pool.resume(handle)
    with pytest.raises(UnknownWorkerError, match="no worker 999") as unknown:
        pool.kill(999)
    with pytest.raises(UnknownGenerationError, match="no generation 'g-1'"):
        pool.stream(Handle("g-1"))
    assert (finished.value.generation, finished.value.state, finished.value.operation) == (
        handle.id,
        "finished",
        "migrate",
    )
    assert unknown.value.worker == 999 and isinstance(unknown.value, LookupError)
    errors = [
        running.value,
        finished.value,
        unknown.value,
        UnknownGenerationError("g-1"),
        GenerationPreempted("g1", "stream"),
    ]
    for error in [*errors, PlacementError("worker 3 is not alive", 3), WorkerLost(2, ["g1", "g2"])]:
        copy = pickle.loads(pickle.dumps(error))
        assert isinstance(error, PoolError) and type(copy) is type(error)
        assert (str(copy), vars(copy)) == (str(error), vars(error))


@pytest.fixture(scope="module")
def foreign_qwen35(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model of the same shape and names, but another file (seed 1)."""
    return models.build_qwen35_mtp(tmp_path_factory.mktemp("foreign") / "qwen35.gguf", seed=1)


@pytest.fixture(scope="module")
def foreign(pool: Pool, tiny_map: dict[str, Path], foreign_qwen35: Path) -> int:
    """A worker with another qwen35 file."""
    return pool.add_worker({**tiny_map, "qwen35": foreign_qwen35})


@pytest.fixture(scope="module")
def wide(pool: Pool) -> int:
    """A worker that decodes with 2 threads (the last test that uses it kills it)."""
    return pool.add_worker(n_threads=2)


def test_a_worker_refuses_a_checkpoint_of_other_model_files(
    pool: Pool, tiny_map: dict[str, Path], foreign: int
) -> None:
    handle = submit(pool, "ngram")
    pieces = pool.stream(handle)
    text = next(pieces)
    pool.preempt(handle)
    with pytest.raises(ModelMismatchError) as refused:
        pool.resume(handle, worker=foreign)
    assert type(refused.value) is ModelMismatchError  # the library's own error, not Ray's wrapping of it
    assert str(refused.value).startswith("the checkpoint's target model is") and vars(refused.value)["role"] == "target"
    assert pool.worker_of(handle) is None  # still preempted, its checkpoint kept
    assert pool.resume(handle) != foreign  # the pool itself never places it there
    text += "".join(pieces)
    tokens, expected = reference(tiny_map, "ngram")
    assert pool.tokens(handle) == tokens and text == expected


def test_a_generation_continues_exactly_on_a_worker_with_another_thread_count(
    pool: Pool, tiny_map: dict[str, Path], wide: int
) -> None:
    handle = submit(pool, "draft", tokens=16)  # 2 threads on a loaded 2-core machine are slow: a short one
    next(pool.stream(handle))
    pool.preempt(handle)
    assert pool.resume(handle, worker=wide) == wide  # 1 thread, then 2: numerics do not depend on the count
    pool.result(handle)
    assert pool.tokens(handle) == reference(tiny_map, "draft", tokens=16)[0]


def test_a_migration_that_cannot_happen_leaves_the_generation_running_where_it_was(
    pool: Pool, tiny_map: dict[str, Path], foreign: int, wide: int
) -> None:
    handle = submit(pool, "ngram")
    pieces = pool.stream(handle)
    text = next(pieces)
    source = pool.worker_of(handle)
    for target, reason in [(foreign, "model files"), (wide, "not alive")]:
        if reason == "not alive":
            kill_from_outside(pool, wide)  # the pool does not know it yet
        with pytest.raises(PlacementError, match=reason) as refused:
            pool.migrate(handle, worker=target)
        assert pool.worker_of(handle) == source  # checked before it was preempted: still running there
        assert refused.value.worker == target
    text += "".join(pieces)
    assert text == reference(tiny_map, "ngram")[1]
    stats = pool.stats(handle)
    assert (stats.migrations, stats.preempted_seconds) == (0, [])


def test_a_workers_generations_are_decoded_together_each_as_alone(pool: Pool, tiny_map: dict[str, Path]) -> None:
    """A worker's none and ngram generations on an attention-only target share its BatchEngine: one call for a
    generation's tokens steps them all (rounds per step above 1), and each gives the tokens it gives alone, through a
    preemption and a resume."""
    worker = pool.workers()[0]
    actor = pool._placement.workers[worker].actor
    before = ray.get(actor.describe.remote())["batched"]
    cases = [("none", False), ("ngram", False), ("ngram", True), ("none", True)]
    handles = [
        pool.submit(PROMPT, max_tokens=TOKENS, target="llama", worker=worker, **settings(mode, sampled))
        for mode, sampled in cases
    ]
    next(pool.stream(handles[1]))
    pool.preempt(handles[1])  # its sequence leaves the engine as a checkpoint
    pool.resume(handles[1], worker=worker)  # and joins it again
    for handle in handles:
        pool.result(handle)
    for handle, (mode, sampled) in zip(handles, cases):
        alone = Generator(Model(tiny_map["llama"]), n_threads=1, **settings(mode, sampled))
        alone.generate(PROMPT, max_tokens=TOKENS)
        assert pool.tokens(handle) == alone.tokens
    after = ray.get(actor.describe.remote())["batched"]
    steps, rounds = after["steps"] - before["steps"], after["rounds"] - before["rounds"]
    assert steps > 0 and rounds > 1.5 * steps  # most steps ran several generations' rounds


def test_a_pool_checks_its_batch(tiny_map: dict[str, Path]) -> None:
    for batch in (-1, 257):
        with pytest.raises(ValueError, match="batch between 0 and 256"):
            Pool(tiny_map, batch=batch)


@pytest.mark.parametrize("grammar_drafts", [False, True])
def test_a_restored_generation_keeps_its_grammar_drafts_option(tiny_map: dict[str, Path], grammar_drafts: bool) -> None:
    """Checkpoints do not carry the runtime option ``grammar_drafts``: the pool hands the generation's own to the
    worker that restores it (the worker's code, called in this process)."""
    worker = Worker({"qwen35": str(tiny_map["qwen35"])}, n_threads=1, batch=0)
    options = dict(settings("ngram", False), grammar='root ::= [a-e ]+ "."', grammar_drafts=grammar_drafts)
    worker.start("g", PROMPT, options, "qwen35", None)
    worker.advance("g", 3)
    checkpoint = worker.checkpoint_and_release("g")
    worker.restore("h", checkpoint, "qwen35", None, grammar_drafts)
    assert worker.generators["h"].grammar_drafts is grammar_drafts
