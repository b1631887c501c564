"""``specstate demo-cluster``: a generation moves between two Ray workers and survives a worker kill.

On SmolLM2-135M-Instruct Q4_1 (the ``specstate demo`` prompt, ``ngram`` mode,
1 thread per worker) it generates the text uninterrupted in this process,
then on a :class:`~specstate.cluster.Pool` of two workers: part-way it
migrates the generation to the other worker (checkpoint through Ray's object
store, restore), later it kills that worker's process, and the generation
recovers on the survivor from its latest checkpoint. The streamed text is
compared with the uninterrupted run's. Needs the ``ray`` extra.
"""

from __future__ import annotations

import time

from rich.console import Console

from specstate import Generator, Model
from specstate.cli._demo import DEMO_PROMPT
from specstate.cluster import Pool
from specstate.smollm2 import smollm2_path

__all__ = ["run_cluster_demo"]

TOKENS = 160
MIGRATE_AT, KILL_AT = 50, 110


def _uninterrupted(console: Console, model: Model) -> str:
    started = time.perf_counter()
    generator = Generator(model, mode="ngram", n_threads=1)
    text = generator.generate(DEMO_PROMPT, max_tokens=TOKENS)
    console.print(
        f"[dim]uninterrupted, in this process: {TOKENS} tokens in {time.perf_counter() - started:.1f} s[/dim]"
    )
    return text


def _event(console: Console, pool: Pool, handle: object, done: set[str]) -> None:
    """Migrate at MIGRATE_AT tokens, kill the worker at KILL_AT (once each)."""
    made = len(pool.tokens(handle))  # type: ignore[arg-type]
    worker = pool.worker_of(handle)  # type: ignore[arg-type]
    if made >= MIGRATE_AT and "migrate" not in done and worker is not None:
        done.add("migrate")
        started = time.perf_counter()
        target = pool.migrate(handle)  # type: ignore[arg-type]
        console.print(
            f"\n[bold cyan]>> migrated after {made} tokens: worker {worker} (pid {pool.worker_pid(worker)}) -> "
            f"worker {target} (pid {pool.worker_pid(target)}) in {1000 * (time.perf_counter() - started):.0f} ms[/]"
        )
    elif made >= KILL_AT and "kill" not in done and worker is not None:
        done.add("kill")
        console.print(
            f"\n[bold red]>> killed worker {worker} (pid {pool.worker_pid(worker)}) after {made} tokens; "
            "the generation resumes on the survivor from its latest checkpoint[/]"
        )
        pool.kill(worker)


def run_cluster_demo() -> bool:
    """Run the demo; returns whether the text was identical to the uninterrupted run's."""
    console = Console(highlight=False)
    path = smollm2_path()
    console.print(f"[bold]specstate demo-cluster[/bold]: {path.name}, mode ngram, 2 Ray workers, 1 thread each")
    expected = _uninterrupted(console, Model(path))
    started = time.perf_counter()
    pool = Pool({"target": path}, workers=2, n_threads=1)
    console.print(f"[dim]Ray pool started: workers {pool.workers()} in {time.perf_counter() - started:.1f} s[/dim]")
    handle = pool.submit(DEMO_PROMPT, max_tokens=TOKENS, mode="ngram", checkpoint_every=16)
    console.print(f"[dim]running on worker {pool.worker_of(handle)}:[/dim]")
    streamed, done = "", set[str]()
    for piece in pool.stream(handle):
        console.print(piece, end="", markup=False)
        streamed += piece
        _event(console, pool, handle, done)
    stats = pool.stats(handle)
    same = streamed == expected
    console.print(
        f"\n\nmigrations {stats.migrations}, worker kills survived {stats.recoveries}, tokens regenerated after "
        f"the kill {stats.replayed} (identical: {stats.divergences == 0}), "
        f"tokens streamed (once each): {len(pool.tokens(handle))}"
    )
    colour = "green" if same else "red"
    console.print(f"[bold {colour}]text identical to the uninterrupted run: {same}[/]")
    return same
