"""Generations on a pool of Ray workers under preemption, migration and worker kills, checked token for token.

Method. One seeded ``random.Random(--seed)`` drives everything.

1. **Generations.** ``--generations`` (G, at least 16) generations over SmolLM2-135M-Instruct: fixed text
   prompts (code, a story, a list of repeated quotes, a chat-templated question), modes cycling
   ``none``/``ngram``/``draft`` (the draft is a 4-layer truncation of SmolLM2 built by
   ``specstate_testkit.smollm2_draft`` into a temporary folder), every other one greedy and the rest sampled
   (temperature 0.8, top-k 40, top-p 0.95, a seed per generation), ``--max-tokens`` tokens each,
   ``checkpoint_every=16``, ``n_ctx=1024``.
2. **References.** Each generation first runs uninterrupted in this process (``Generator`` with
   ``n_threads=1``, as the workers decode); its tokens and text are kept.
3. **The pool.** ``specstate.cluster.Pool`` with ``--workers`` (W) workers of one thread; all G are
   submitted, then the pool is pumped. Every few pumps (2 to 5, at random) one event happens: a random
   running generation is migrated to another live worker, or preempted and resumed a few pumps later
   on a random live worker. ``--kills`` times (at random pumps in the middle of the run) a live
   worker that hosts running generations is killed like a crash and a new worker is added, so W stay
   alive; its generations recover from their latest checkpoint. Migrations are forced in the second half
   of the run until ``--min-migrations`` have happened. After every pump, each generation's streamed
   tokens must extend what was streamed before (a rewrite counts as a divergence).
4. **Checks.** Each finished generation's streamed tokens are compared with its reference: equal, or a
   prefix of it (tokens lost), or extended by it (tokens duplicated), or different (divergent); the text
   of ``pool.stream`` must equal the reference text; the pool's own count of regenerated tokens that
   differed after a recovery (``GenerationStats.divergences``) must be 0.
5. **Migration against re-prefill.** A greedy ``none`` generation with a prompt of ``--long-prompt``
   (2,040) SmolLM2 tokens (``n_ctx`` 4096) is submitted with the pool asking one token per call; it is
   then migrated ``--long-migrations`` times between two workers, interleaved with ``--prefills``
   re-prefills of the same context (prompt and the tokens generated so far) in this process: a new
   ``Generator`` (one thread) and its prefill. A migration's cost is the pool's own timing: checkpoint
   and release on the source worker (``preempted_seconds``) plus object-store transfer and restore on the
   target (``resumed_seconds``); the wall time of ``Pool.migrate`` is also reported (it also waits for
   the round in flight, one token). The ratio of the medians is the figure (target: under 1/50). That
   generation too is compared with an uninterrupted reference.
6. **Throughput.** Tokens streamed by the pool over the wall time of its run (submission to the last
   token, events included), against the references' tokens over their serial run time.

Prints a markdown table and writes ``--json`` and ``--chart``.

Usage: ``python benchmarks/cluster.py [--workers 3] [--generations 16] [--max-tokens 96] [--seed 0]
[--json benchmarks/results/cluster.json] [--chart benchmarks/results/cluster.png]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray

from specstate import Generator, Model
from specstate._typing import Mode
from specstate.cluster import Handle, Pool
from specstate.smollm2 import smollm2_path
from specstate_testkit.smollm2_draft import build_smollm2_draft

RESULTS = Path(__file__).resolve().parent / "results"
MODES: tuple[Mode, ...] = ("none", "ngram", "draft")
N_CTX = 1024
LONG_N_CTX = 4096
CHECKPOINT_EVERY = 16
DRAFT_LAYERS = 4

PROMPTS: dict[str, str] = {
    "code": (
        "def fibonacci(n):\n"
        '    """Return the n-th Fibonacci number."""\n'
        "    if n < 2:\n"
        "        return n\n"
        "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
        "def factorial(n):\n"
    ),
    "story": (
        "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker "
        "who had never left his workshop. One winter morning, a stranger knocked on his door and"
    ),
    "quotes": (
        "Quotes of the day:\n"
        "1. The only way to do great work is to love what you do.\n"
        "2. Simplicity is the ultimate sophistication.\n"
        "3. The only way to do great work is to love what you do.\n"
        "4. Simplicity is the ultimate sophistication.\n"
        "5. The only way to do great work is"
    ),
    "chat": (
        "<|im_start|>user\nList five fruits and say one thing about each of them.<|im_end|>\n<|im_start|>assistant\n"
    ),
}

LONG_PARAGRAPHS: tuple[str, ...] = (
    "The harbour master counted the boats each morning and wrote the numbers in a green ledger.",
    "A compiler turns source code into machine instructions, checking types and folding constants on the way.",
    "In the spring the orchard was white with blossom, and the bees worked from dawn until the light failed.",
    "The committee met on Tuesdays to review the budget, the hiring plan and the list of open incidents.",
    "She tuned the violin slowly, string by string, listening for the beat between the two notes.",
    "Rain had washed the road away below the bridge, so the bus to the valley went round by the old mill.",
    "Each request carries a trace identifier, which the gateway logs together with the latency and status.",
    "The recipe asks for two eggs, a cup of flour, a pinch of salt and enough milk to make a smooth batter.",
)


@dataclass
class Spec:
    """One generation of the simulation."""

    index: int
    prompt_name: str
    mode: Mode
    sampled: bool
    max_tokens: int
    settings: dict[str, Any]

    @property
    def draft(self) -> str | None:
        return "draft" if self.mode == "draft" else None


@dataclass
class Reference:
    tokens: list[int]
    text: str
    seconds: float


@dataclass
class SimLog:
    """What happened during the pool run."""

    started: float
    events: list[dict[str, Any]] = field(default_factory=list)
    progress: list[list[tuple[float, int]]] = field(default_factory=list)
    rewrites: list[int] = field(default_factory=list)
    migrations: int = 0
    preemptions: int = 0
    kills: int = 0
    migrate_seconds: list[float] = field(default_factory=list)
    pumps: int = 0
    min_migrations: int = 0
    handles: list[Handle] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)

    def event(self, kind: str, **details: Any) -> None:
        self.events.append({"t": time.perf_counter() - self.started, "pump": self.pumps, "kind": kind, **details})


# --- set-up ------------------------------------------------------------------------------------------


def make_specs(rng: random.Random, count: int, max_tokens: int) -> list[Spec]:
    """``count`` generations: modes cycling, every other one sampled, prompts and draft lengths at random."""
    specs = []
    names = sorted(PROMPTS)
    for index in range(count):
        mode = MODES[index % len(MODES)]
        sampled = index % 2 == 1
        settings: dict[str, Any] = {"mode": mode, "n_ctx": N_CTX}
        if mode != "none":
            settings["n_draft"] = rng.choice([4, 8])
        if sampled:
            settings.update(temperature=0.8, top_k=40, top_p=0.95, seed=rng.randrange(1, 2**31))
        specs.append(Spec(index, rng.choice(names), mode, sampled, max_tokens, settings))
    return specs


def run_reference(spec: Spec, target: Model, draft: Model) -> Reference:
    """The generation uninterrupted in this process, one thread (as the workers)."""
    started = time.perf_counter()
    generator = Generator(target, draft_model=draft if spec.draft else None, n_threads=1, **spec.settings)
    text = generator.generate(PROMPTS[spec.prompt_name], max_tokens=spec.max_tokens)
    return Reference(generator.tokens, text, time.perf_counter() - started)


def long_prompt(model: Model, rng: random.Random, n_tokens: int) -> list[int]:
    """A prompt of exactly ``n_tokens`` SmolLM2 tokens of varied numbered text."""
    parts: list[str] = []
    tokens: list[int] = []
    while len(tokens) < n_tokens:
        parts.extend(f"Note {len(parts) + 1}: {rng.choice(LONG_PARAGRAPHS)}\n" for _ in range(50))
        tokens = model.tokenize("".join(parts), add_special=True, parse_special=True)
    return tokens[:n_tokens]


# --- the simulation ----------------------------------------------------------------------------------


def running(pool: Pool, handles: list[Handle], parked: dict[int, int], killed: set[int]) -> list[int]:
    """Indexes of generations on a worker that was not killed (neither done nor preempted)."""
    out = []
    for index, handle in enumerate(handles):
        worker = pool.worker_of(handle)
        if index not in parked and not pool.done(handle) and worker is not None and worker not in killed:
            out.append(index)
    return out


def live_workers(pool: Pool, killed: set[int]) -> list[int]:
    return [worker for worker in pool.workers() if worker not in killed]


def do_kill(pool: Pool, handles: list[Handle], killed: set[int], log: SimLog, rng: random.Random) -> None:
    """Kill a live worker that hosts running generations (any live one otherwise) and add a new one."""
    live = live_workers(pool, killed)
    if len(live) < 2:  # W is kept by adding a worker after each kill; never leave none meanwhile
        return
    hosts = sorted({w for i in running(pool, handles, {}, killed) if (w := pool.worker_of(handles[i])) is not None})
    victim = rng.choice(hosts or live)
    on_it = [i for i, h in enumerate(handles) if pool.worker_of(h) == victim and not pool.done(h)]
    pool.kill(victim)
    killed.add(victim)
    log.kills += 1
    log.event("kill", worker=victim, generations=on_it)
    added = pool.add_worker(n_threads=1)
    log.event("add_worker", worker=added)


def do_migrate(
    pool: Pool, handles: list[Handle], candidates: list[int], killed: set[int], log: SimLog, rng: random.Random
) -> None:
    index = candidates[0]
    source = pool.worker_of(handles[index])
    targets = [w for w in live_workers(pool, killed) if w != source]
    if not targets:
        return
    target = rng.choice(targets)
    before = pool.stats(handles[index]).migrations
    started = time.perf_counter()
    chosen = pool.migrate(handles[index], worker=target)
    seconds = time.perf_counter() - started
    if pool.stats(handles[index]).migrations > before:
        log.migrations += 1
        log.migrate_seconds.append(seconds)
        streamed = len(pool.tokens(handles[index]))
        log.event("migrate", generation=index, source=source, target=chosen, seconds=seconds, streamed=streamed)


def do_event(
    pool: Pool, handles: list[Handle], parked: dict[int, int], killed: set[int], log: SimLog, rng: random.Random
) -> None:
    """One random migration or preemption (a migration when too few have happened late in the run)."""
    candidates = running(pool, handles, parked, killed)
    if not candidates:
        return
    rng.shuffle(candidates)
    late = sum(pool.done(h) for h in handles) >= len(handles) // 2
    if rng.random() < 0.65 or (late and log.migrations < log.min_migrations):
        do_migrate(pool, handles, candidates, killed, log, rng)
        return
    index = candidates[0]
    source = pool.worker_of(handles[index])
    pool.preempt(handles[index])
    if pool.done(handles[index]):  # it finished while its last round was awaited
        log.event("preempt_finished", generation=index)
        return
    parked[index] = log.pumps + rng.randint(2, 8)
    log.preemptions += 1
    log.event("preempt", generation=index, source=source, streamed=len(pool.tokens(handles[index])))


def resume_due(
    pool: Pool, handles: list[Handle], parked: dict[int, int], killed: set[int], log: SimLog, rng: random.Random
) -> None:
    """Resume the preempted generations whose time has come (all of them when nothing else runs)."""
    idle = not running(pool, handles, parked, killed)
    for index, due in sorted(parked.items()):
        if idle or log.pumps >= due:
            del parked[index]
            worker = rng.choice(live_workers(pool, killed))
            log.event("resume", generation=index, target=worker)
            pool.resume(handles[index], worker)


def observe(pool: Pool, handles: list[Handle], seen: list[list[int]], recoveries: list[int], log: SimLog) -> bool:
    """Record progress and recoveries; check each stream only grows. Returns whether anything changed."""
    changed = False
    now = time.perf_counter() - log.started
    for index, handle in enumerate(handles):
        tokens = pool.tokens(handle)
        if tokens[: len(seen[index])] != seen[index]:
            log.rewrites[index] += 1
        if len(tokens) != len(seen[index]):
            changed = True
            log.progress[index].append((now, len(tokens)))
            seen[index] = tokens
        stats = pool.stats(handle)
        if stats.recoveries != recoveries[index]:
            changed = True
            recoveries[index] = stats.recoveries
            log.event("recover", generation=index, worker=pool.worker_of(handle), streamed=len(tokens))
    return changed


def simulate(pool: Pool, specs: list[Spec], kills: int, min_migrations: int, rng: random.Random) -> SimLog:
    """Submit every generation and pump the pool to the end, with random events (see the docstring).

    Should the pool raise, the last events are printed to stderr before the exception propagates."""
    log = SimLog(started=time.perf_counter(), min_migrations=min_migrations)
    log.handles = [
        pool.submit(
            PROMPTS[s.prompt_name],
            max_tokens=s.max_tokens,
            draft=s.draft,
            checkpoint_every=CHECKPOINT_EVERY,
            **s.settings,
        )
        for s in specs
    ]
    log.event("submitted", generations=len(specs))
    log.progress = [[(0.0, 0)] for _ in specs]
    log.rewrites = [0] * len(specs)
    try:
        drive(pool, specs, kills, log, rng)
    except Exception:
        print(f"the pool raised after {log.pumps} pumps; the last events:", file=sys.stderr)
        for event in log.events[-30:]:
            print(f"  {event}", file=sys.stderr)
        raise
    log.event("done")
    return log


def drive(pool: Pool, specs: list[Spec], kills: int, log: SimLog, rng: random.Random) -> None:
    """Pump until every generation is over, killing workers and migrating or preempting generations."""
    handles, killed = log.handles, log.killed
    expected = sum(math.ceil(s.max_tokens / pool.chunk) for s in specs)
    kill_at = sorted(rng.sample(range(expected // 4, max(expected * 2 // 3, expected // 4 + kills)), kills))
    next_event = rng.randint(2, 5)
    parked: dict[int, int] = {}
    seen: list[list[int]] = [[] for _ in specs]
    recoveries = [0] * len(specs)
    stalled = 0
    while True:
        resume_due(pool, handles, parked, killed, log, rng)
        if not parked and all(pool.done(h) for h in handles):
            return
        pool.pump()
        log.pumps += 1
        stalled = 0 if observe(pool, handles, seen, recoveries, log) else stalled + 1
        if stalled > 2000:
            raise RuntimeError("no generation progressed in 2000 pumps")
        if kill_at and log.pumps >= kill_at[0]:
            kill_at.pop(0)
            do_kill(pool, handles, killed, log, rng)
        elif log.pumps >= next_event:
            do_event(pool, handles, parked, killed, log, rng)
            next_event = log.pumps + rng.randint(2, 5)
        observe(pool, handles, seen, recoveries, log)


def compare(streamed: list[int], reference: list[int]) -> tuple[str, int]:
    """``exact``, ``lost`` (a prefix of the reference: how many missing), ``duplicated`` (the reference
    extended: how many extra) or ``divergent``."""
    if streamed == reference:
        return "exact", 0
    common = 0
    for a, b in zip(streamed, reference):
        if a != b:
            break
        common += 1
    if common == len(streamed):
        return "lost", len(reference) - common
    if common == len(reference):
        return "duplicated", len(streamed) - common
    return "divergent", 0


def check(pool: Pool, specs: list[Spec], refs: list[Reference], log: SimLog) -> list[dict[str, Any]]:
    """Per-generation results: the streamed tokens and text against the reference, and the pool's stats."""
    rows = []
    for spec, ref, handle in zip(specs, refs, log.handles):
        streamed = pool.tokens(handle)
        text = "".join(pool.stream(handle))
        verdict, count = compare(streamed, ref.tokens)
        stats = pool.stats(handle)
        rows.append(
            {
                "index": spec.index,
                "prompt": spec.prompt_name,
                "mode": spec.mode,
                "sampled": spec.sampled,
                "settings": spec.settings,
                "reference_tokens": len(ref.tokens),
                "streamed_tokens": len(streamed),
                "verdict": verdict,
                "lost": count if verdict == "lost" else 0,
                "duplicated": count if verdict == "duplicated" else 0,
                "text_equal": text == ref.text,
                "rewrites": log.rewrites[spec.index],
                "preemptions": sum(1 for e in log.events if e["kind"] == "preempt" and e["generation"] == spec.index),
                "reference_seconds": ref.seconds,
                **asdict(stats),
            }
        )
    return rows


# --- migration against re-prefill ---------------------------------------------------------------------


def reprefill_seconds(model: Model, tokens: list[int]) -> float:
    """A new one-thread generator and the prefill of ``tokens`` (the prompt's decode and the first token)."""
    started = time.perf_counter()
    generator = Generator(model, n_ctx=LONG_N_CTX, n_threads=1)
    generator._native.prefill(tokens)
    return time.perf_counter() - started


def measure_migration(
    pool: Pool, workers: list[int], model: Model, prompt: list[int], migrations: int, prefills: int
) -> dict[str, Any]:
    """Migrate a long generation back and forth, interleaved with re-prefills of the same context."""
    pool.chunk = 1  # the round a migration waits for is then one token
    max_tokens = 3 * migrations + 8
    started = time.perf_counter()
    handle = pool.submit(prompt, max_tokens=max_tokens, checkpoint_every=CHECKPOINT_EVERY, n_ctx=LONG_N_CTX)
    submit_seconds = time.perf_counter() - started
    pool.pump()
    costs: list[float] = []
    walls: list[float] = []
    contexts: list[int] = []
    prefill_times: list[float] = []
    for step in range(migrations):
        source = pool.worker_of(handle)
        target = next(w for w in workers if w != source)
        started = time.perf_counter()
        pool.migrate(handle, worker=target)
        walls.append(time.perf_counter() - started)
        stats = pool.stats(handle)
        costs.append(stats.preempted_seconds[-1] + stats.resumed_seconds[-1])
        contexts.append(len(prompt) + len(pool.tokens(handle)))
        if step < prefills:
            pool.pump()
            prefill_times.append(reprefill_seconds(model, prompt + pool.tokens(handle)))
    pool.run()
    pool.chunk = 16
    started = time.perf_counter()
    reference = Generator(model, n_ctx=LONG_N_CTX, n_threads=1)
    reference.generate(prompt, max_tokens=max_tokens)
    reference_seconds = time.perf_counter() - started
    verdict, count = compare(pool.tokens(handle), reference.tokens)
    stats = pool.stats(handle)
    return {
        "prompt_tokens": len(prompt),
        "context_tokens": contexts,
        "checkpoint_bytes": len(reference.checkpoint()),
        "submit_seconds": submit_seconds,
        "migration_seconds": costs,
        "migrate_wall_seconds": walls,
        "reprefill_seconds": prefill_times,
        "reference_seconds": reference_seconds,
        "median_migration_seconds": statistics.median(costs),
        "median_migrate_wall_seconds": statistics.median(walls),
        "median_reprefill_seconds": statistics.median(prefill_times),
        "ratio": statistics.median(costs) / statistics.median(prefill_times),
        "wall_ratio": statistics.median(walls) / statistics.median(prefill_times),
        "verdict": verdict,
        "lost_or_duplicated": count,
        "stats": asdict(stats),
    }


# --- report ------------------------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]], log: SimLog, long: dict[str, Any], pool_seconds: float) -> dict[str, Any]:
    """The figures of the issue, from the per-generation rows, the run's log and the long measurement."""
    bad = [r for r in rows if r["verdict"] == "divergent" or not r["text_equal"] or r["divergences"] or r["rewrites"]]
    preempted = [s for r in rows for s in r["preempted_seconds"]]
    resumed = [s for r in rows for s in r["resumed_seconds"]]
    pool_tokens = sum(r["streamed_tokens"] for r in rows)
    reference_seconds = sum(r["reference_seconds"] for r in rows)
    all_done = all(r["streamed_tokens"] == r["reference_tokens"] for r in rows)
    return {
        "generations": len(rows),
        "migrations": sum(r["migrations"] for r in rows),
        "preemptions": log.preemptions,
        "kills": log.kills,
        "kills_survived": log.kills if all_done else 0,
        "recoveries": sum(r["recoveries"] for r in rows),
        "replayed_tokens": sum(r["replayed"] for r in rows),
        "divergent_streams": len(bad),
        "tokens_lost": sum(r["lost"] for r in rows),
        "tokens_duplicated": sum(r["duplicated"] for r in rows),
        "median_checkpoint_release_seconds": statistics.median(preempted) if preempted else None,
        "median_transfer_restore_seconds": statistics.median(resumed) if resumed else None,
        "median_migrate_wall_seconds": statistics.median(log.migrate_seconds) if log.migrate_seconds else None,
        "pool_tokens": pool_tokens,
        "pool_seconds": pool_seconds,
        "pool_tokens_per_second": pool_tokens / pool_seconds,
        "reference_tokens": sum(r["reference_tokens"] for r in rows),
        "reference_seconds": reference_seconds,
        "reference_tokens_per_second": sum(r["reference_tokens"] for r in rows) / reference_seconds,
        "long_migration_seconds": long["median_migration_seconds"],
        "long_reprefill_seconds": long["median_reprefill_seconds"],
        "long_ratio": long["ratio"],
        "long_verdict": long["verdict"],
    }


def criteria(summary: dict[str, Any]) -> dict[str, bool]:
    """The issue's done-when conditions."""
    return {
        "at least 16 generations": summary["generations"] >= 16,
        "at least 10 migrations": summary["migrations"] >= 10,
        "at least 2 worker kills survived": summary["kills_survived"] >= 2,
        "0 divergent streams": summary["divergent_streams"] == 0 and summary["long_verdict"] == "exact",
        "0 tokens lost or duplicated": summary["tokens_lost"] == 0 and summary["tokens_duplicated"] == 0,
        "2,048-token migration under 1/50 of re-prefill": summary["long_ratio"] < 1 / 50,
    }


def table(summary: dict[str, Any], long: dict[str, Any], workers: int) -> str:
    contexts = long["context_tokens"]
    lines = [
        "| figure | value |",
        "|---|---|",
        f"| workers (processes, 1 thread each) | {workers} |",
        f"| generations (none/ngram/draft, greedy and sampled) | {summary['generations']} |",
        f"| migrations | {summary['migrations']} |",
        f"| preemptions (resumed later) | {summary['preemptions']} |",
        f"| worker kills survived | {summary['kills_survived']} of {summary['kills']} |",
        f"| recoveries (generations resumed from a checkpoint) | {summary['recoveries']} |",
        f"| tokens regenerated after recoveries (all equal) | {summary['replayed_tokens']} |",
        f"| divergent streams | {summary['divergent_streams']} |",
        f"| tokens lost / duplicated | {summary['tokens_lost']} / {summary['tokens_duplicated']} |",
        f"| median migrate() wall, short contexts | {_ms(summary['median_migrate_wall_seconds'])} |",
        f"| long generation: context at migration | {min(contexts)}-{max(contexts)} tokens |",
        f"| long: median migration (checkpoint + transfer + restore) | {_ms(long['median_migration_seconds'])} |",
        f"| long: median migrate() wall (waits for the round in flight) | {_ms(long['median_migrate_wall_seconds'])} |",
        f"| long: median re-prefill of the same context | {_ms(long['median_reprefill_seconds'])} |",
        f"| long: migration / re-prefill | 1/{1 / long['ratio']:.0f} |",
        f"| long: stream against uninterrupted | {long['verdict']} |",
        f"| throughput, pool ({workers} workers, events included) | {summary['pool_tokens_per_second']:.1f} tok/s |",
        f"| throughput, references serially in one process | {summary['reference_tokens_per_second']:.1f} tok/s |",
    ]
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


MARKERS = {"migrate": ("^", "tab:blue"), "preempt": ("v", "tab:orange"), "resume": ("o", "tab:green")}
MODE_COLORS = {"none": "0.35", "ngram": "tab:purple", "draft": "tab:cyan"}


def _timeline(axis: Any, specs: list[Spec], log: SimLog) -> None:
    """One lane per generation: its streamed tokens over time, events marked, kills as red lines."""
    for spec, points in zip(specs, log.progress):
        times = [t for t, _ in points]
        heights = [spec.index + 0.8 * n / spec.max_tokens for _, n in points]
        axis.step(times, heights, where="post", color=MODE_COLORS[spec.mode], linewidth=1.2)
    for event in log.events:
        if event["kind"] in MARKERS:
            marker, color = MARKERS[event["kind"]]
            axis.plot(event["t"], event["generation"] + 0.4, marker=marker, color=color, markersize=6, linestyle="")
        elif event["kind"] == "recover":
            axis.plot(event["t"], event["generation"] + 0.4, marker="x", color="tab:red", markersize=7)
        elif event["kind"] == "kill":
            axis.axvline(event["t"], color="tab:red", linestyle="--", linewidth=1)
    handles = [axis.plot([], [], color=color, label=f"mode {mode}")[0] for mode, color in MODE_COLORS.items()] + [
        axis.plot([], [], marker=m, color=c, linestyle="", label=kind)[0] for kind, (m, c) in MARKERS.items()
    ]
    handles.append(axis.plot([], [], marker="x", color="tab:red", linestyle="", label="recover")[0])
    handles.append(axis.plot([], [], color="tab:red", linestyle="--", label="worker killed")[0])
    axis.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    axis.set_xlabel("seconds since submission")
    axis.set_ylabel("generation (lane: tokens streamed)")
    axis.set_yticks([s.index + 0.4 for s in specs], [str(s.index) for s in specs], fontsize=7)
    axis.set_title("Pool run: every generation's stream, migrations, preemptions and worker kills")


def chart(path: Path, specs: list[Spec], rows: list[dict[str, Any]], log: SimLog, long: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(13, 9))
    grid = figure.add_gridspec(2, 2, height_ratios=[3, 2], width_ratios=[3, 2])
    _timeline(figure.add_subplot(grid[0, :]), specs, log)
    bars = figure.add_subplot(grid[1, 0])
    x = [r["index"] for r in rows]
    bottom = [0.0] * len(rows)
    for key, color in (("migrations", "tab:blue"), ("preemptions", "tab:orange"), ("recoveries", "tab:red")):
        values = [float(r[key]) for r in rows]
        bars.bar(x, values, bottom=bottom, color=color, label=key)
        bottom = [b + v for b, v in zip(bottom, values)]
    bars.set_xticks(x, [f"{r['index']}\n{r['mode'][:2]}{'s' if r['sampled'] else 'g'}" for r in rows], fontsize=7)
    bars.set_ylabel("events")
    bars.set_title("Per generation (all streams exact)" if all(r["verdict"] == "exact" for r in rows) else "")
    bars.legend(fontsize=8)
    cost = figure.add_subplot(grid[1, 1])
    labels = ["migration\n(checkpoint+transfer\n+restore)", "migrate() wall", "re-prefill"]
    values = [long["median_migration_seconds"], long["median_migrate_wall_seconds"], long["median_reprefill_seconds"]]
    cost.bar(labels, values, color=["tab:blue", "tab:cyan", "tab:gray"])
    cost.set_yscale("log")
    for i, value in enumerate(values):
        cost.text(i, value, f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s", ha="center", va="bottom")
    cost.set_ylabel("seconds (median, log scale)")
    contexts = long["context_tokens"]
    cost.set_title(f"{min(contexts)}-{max(contexts)}-token generation: 1/{1 / long['ratio']:.0f} of re-prefill")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


# --- main --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--generations", type=int, default=16, help="generations (default 16)")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per generation (default 96)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    parser.add_argument("--kills", type=int, default=2, help="worker kills (default 2)")
    parser.add_argument("--min-migrations", type=int, default=10, help="migrations forced up to (default 10)")
    parser.add_argument("--long-prompt", type=int, default=2040, help="tokens of the long prompt (default 2040)")
    parser.add_argument("--long-migrations", type=int, default=5, help="migrations of the long one (default 5)")
    parser.add_argument("--prefills", type=int, default=3, help="re-prefills of the long context (default 3)")
    parser.add_argument("--json", type=Path, default=RESULTS / "cluster.json")
    parser.add_argument("--chart", type=Path, default=RESULTS / "cluster.png")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.generations < 1 or args.max_tokens < 1 or args.prefills < 1:
        parser.error("--workers must be at least 2; --generations, --max-tokens and --prefills at least 1")
    if args.long_migrations < args.prefills:
        parser.error("--long-migrations must be at least --prefills (they are interleaved)")
    return args


def run(args: argparse.Namespace, target_path: Path, draft_path: Path) -> dict[str, Any]:
    """References, the pool run, the long measurement; returns everything the JSON holds."""
    rng = random.Random(args.seed)
    target, draft = Model(str(target_path)), Model(str(draft_path))
    specs = make_specs(rng, args.generations, args.max_tokens)
    refs = []
    for spec in specs:
        refs.append(run_reference(spec, target, draft))
        print(f"reference {spec.index}: {spec.mode} {'sampled' if spec.sampled else 'greedy'} {spec.prompt_name}")
    pool = Pool({"target": target_path, "draft": draft_path}, workers=args.workers, n_threads=1)
    try:
        started = time.perf_counter()
        log = simulate(pool, specs, args.kills, args.min_migrations, rng)
        pool_seconds = time.perf_counter() - started
        rows = check(pool, specs, refs, log)
        print(f"pool run: {pool_seconds:.1f} s, {log.pumps} pumps, {len(log.events)} events")
        prompt = long_prompt(target, rng, args.long_prompt)
        workers = live_workers(pool, log.killed)
        long = measure_migration(pool, workers, target, prompt, args.long_migrations, args.prefills)
    finally:
        ray.shutdown()
    summary = summarize(rows, log, long, pool_seconds)
    return {"specs": specs, "rows": rows, "log": log, "long": long, "summary": summary}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        target_path = smollm2_path()
        draft_path = build_smollm2_draft(target_path, Path(directory) / "draft.gguf", n_layers=DRAFT_LAYERS)
        result = run(args, target_path, draft_path)
    summary, long, log = result["summary"], result["long"], result["log"]
    passed = criteria(summary)
    print(table(summary, long, args.workers))
    for name, ok in passed.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    config.update(model=target_path.name, draft_layers=DRAFT_LAYERS, n_ctx=N_CTX, long_n_ctx=LONG_N_CTX)
    config.update(checkpoint_every=CHECKPOINT_EVERY, cpus=os.cpu_count(), ray=ray.__version__)
    document = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "summary": summary,
        "criteria": passed,
        "long": long,
        "generations": result["rows"],
        "events": log.events,
        "pumps": log.pumps,
        "run_seconds": time.perf_counter() - began,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    chart(args.chart, result["specs"], result["rows"], log, long)
    print(f"wrote {args.json} and {args.chart} ({document['run_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
