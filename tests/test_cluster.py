"""specstate.cluster on a local Ray instance: migration, recovery from a killed worker, refused checkpoints."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray  # the `ray` extra, in requirements-dev.txt: without it these tests fail, they are not skipped

import models
from generator_support import MODES, TINY_CTX, sampling, tiny_generator
from specstate.cluster import Handle, PlacementError, Pool
from specstate.errors import ModelMismatchError

PROMPT = "Once upon a time"
TOKENS = 60
DRAFTS = {"draft": "llama", "eagle3": "eagle3_draft"}


@pytest.fixture(scope="module")
def pool(tiny_map: dict[str, Path]) -> Iterator[Pool]:
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


@pytest.fixture(scope="module")
def foreign_qwen35(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model of the same shape and names, but another file (seed 1)."""
    return models.build_qwen35_mtp(tmp_path_factory.mktemp("foreign") / "qwen35.gguf", seed=1)


def test_a_worker_refuses_a_checkpoint_of_other_model_files(
    pool: Pool, tiny_map: dict[str, Path], foreign_qwen35: Path
) -> None:
    foreign = pool.add_worker({**tiny_map, "qwen35": foreign_qwen35})
    handle = submit(pool, "ngram")
    pieces = pool.stream(handle)
    text = next(pieces)
    pool.preempt(handle)
    with pytest.raises(ModelMismatchError):
        pool.resume(handle, worker=foreign)
    assert pool.worker_of(handle) is None  # still preempted, its checkpoint kept
    assert pool.resume(handle) != foreign  # the pool itself never places it there
    text += "".join(pieces)
    tokens, expected = reference(tiny_map, "ngram")
    assert pool.tokens(handle) == tokens and text == expected
    pool.kill(foreign)


def test_placement_keeps_the_thread_count(pool: Pool, tiny_map: dict[str, Path]) -> None:
    wide = pool.add_worker(n_threads=2)
    handle = submit(pool, "draft")
    assert pool.worker_of(handle) != wide  # new generations get the pool's thread count
    pool.preempt(handle)
    with pytest.raises(PlacementError, match="2 threads"):
        pool.resume(handle, worker=wide)
    assert pool.resume(handle, worker=wide, exact=False) == wide  # allowed when asked: exact up to near-ties
    pool.result(handle)
    assert len(pool.tokens(handle)) == TOKENS
    pool.kill(wide)
