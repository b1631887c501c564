"""What verification costs: decoding a batch of 1, 2, 4, 8 and 16 rows, against one row (part of ``make bench``).

Speculation verifies a draft of k tokens as one batch of k + 1 rows; it pays when that batch costs little more
than one row. Since specstate's llama.cpp patch (``llama-cpp-sys-4/patches``) gives each row of a batch of up to 17
exactly its single decode's logits, this table is the price of exactness too. On SmolLM2-135M-Instruct Q4_1 and
copies requantized to Q4_0, Q8_0 and Q4_K (``specstate_testkit.requantize``), after a 300-token prompt, every batch is
decoded on a fresh copy of the KV state (``set_seq_state``, untimed), as verification does, with every row's
logits; each round times every row count once (the best of ``--repeats`` decodes, which filters a shared machine's
stalls), the order rotating (``specstate.bench.interleave``), and a ratio is the median of the per-round ratios to
1 row, with their range.

The bound beside it: a decode reads every weight once, so one row takes at least the model's tensor bytes over the
machine's memory bandwidth (a numpy copy of a large array, best of 3, read and written bytes counted, one thread);
the 1-row figure is printed as the fraction of that limit it reaches.

Usage: python benchmarks/verify_cost.py [--rounds 20] [--repeats 3] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from specstate import Context, Model
from specstate.bench import interleave, pair_ratio

ROWS = (1, 2, 4, 8, 16)
PROMPT_TOKENS = 300
ROUNDS = 20
#: Each round times a batch size as the best of this many decodes (each on a fresh copy of the state).
REPEATS = 3
QUANTS: dict[str, T | None] = {"Q4_1": None, "Q4_0": T.Q4_0, "Q8_0": T.Q8_0, "Q4_K": T.Q4_K}
TEXT = "The committee met on Tuesday to review the budget, the schedule and the open questions. " * 30


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def smollm2_copies() -> dict[str, Path]:
    """SmolLM2 as shipped (Q4_1) and its requantized copies (built once, cached), by type."""
    from specstate.smollm2 import cache_dir, smollm2_path
    from specstate_testkit.requantize import cached_copy

    path = smollm2_path()
    directory = cache_dir() / "requantized"
    return {name: path if kind is None else cached_copy(path, kind, directory) for name, kind in QUANTS.items()}


def tensor_bytes(path: Path) -> int:
    """The bytes of a GGUF file's tensors: what one decode reads."""
    return sum(int(tensor.n_bytes) for tensor in gguf.GGUFReader(path).tensors)


def copy_bandwidth(size: int = 2**30, repeats: int = 3) -> float:
    """Memory bandwidth in bytes/s: a numpy copy of `size` bytes (read + written), the best of `repeats`."""
    source = np.ones(size, dtype=np.uint8)
    target = np.zeros_like(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return 2 * size / best


class BatchTimer:
    """A context holding `prompt_tokens` of text, timing batches decoded after it on a fresh copy of its state."""

    def __init__(self, model: Model, threads: int, prompt_tokens: int, max_rows: int) -> None:
        tokens = model.tokenize(TEXT)
        assert len(tokens) >= prompt_tokens + max_rows, "the benchmark text is too short for the prompt"
        self.prompt, self.batch = tokens[:prompt_tokens], tokens[prompt_tokens : prompt_tokens + max_rows]
        self.context = Context(model, n_ctx=512, n_threads=threads)
        self.context.decode(self.prompt, 0)
        self.state = self.context.seq_state()

    def once(self, rows: int) -> float:
        self.context.set_seq_state(0, self.state)
        started = time.perf_counter()
        self.context.decode(self.batch[:rows], len(self.prompt), all_logits=True)
        self.context.argmax(-1)
        return time.perf_counter() - started

    def timer(self, rows: int, repeats: int) -> Callable[[], float]:
        """Seconds to decode `rows` rows: the best of `repeats` back to back (a shared machine's stalls filtered)."""
        return lambda: min(self.once(rows) for _ in range(repeats))


def batch_costs(
    model: Model,
    rounds: int,
    threads: int,
    rows: Sequence[int] = ROWS,
    prompt_tokens: int = PROMPT_TOKENS,
    repeats: int = REPEATS,
) -> dict[str, Any]:
    """Median seconds per batch size and the per-round ratios to the first (1 row), in interleaved rounds."""
    timer = BatchTimer(model, threads, prompt_tokens, max(rows))
    seconds = interleave({str(n): timer.timer(n, repeats) for n in rows}, rounds)
    one = seconds[str(rows[0])]
    return {
        "seconds": {n: statistics.median(values) for n, values in seconds.items()},
        "x_one_row": {n: vars(pair_ratio(values, one)) for n, values in seconds.items()},
    }


def figures(
    paths: dict[str, Path], rounds: int, threads: int, bandwidth: float, **sizes: Any
) -> dict[str, dict[str, Any]]:
    """Every model's batch costs and its bandwidth bound (`sizes`: rows, prompt_tokens, repeats)."""
    out = {}
    for name, path in paths.items():
        log(f"verify cost: {name}, {rounds} interleaved rounds")
        costs = batch_costs(Model(path), rounds, threads, **sizes)
        weights = tensor_bytes(path)
        bound = weights / bandwidth
        one_row = next(iter(costs["seconds"].values()))
        out[name] = {"file": path.name, "weight_bytes": weights, "bound_seconds": bound, **costs}
        out[name]["one_row_of_bound"] = bound / one_row
    return out


def measure(rounds: int = ROUNDS, threads: int = 2, repeats: int = REPEATS, copy_size: int = 2**30) -> dict[str, Any]:
    """The verify-cost results of SmolLM2 in its four types, with the machine's bandwidth."""
    bandwidth = copy_bandwidth(copy_size)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "threads": threads,
        "rounds": rounds,
        "repeats": repeats,
        "prompt_tokens": PROMPT_TOKENS,
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_copy_bytes": copy_size,
        "models": figures(smollm2_copies(), rounds, threads, bandwidth, repeats=repeats),
    }


def table(results: dict[str, Any]) -> list[str]:
    """The verify-cost results as markdown lines: a row per model type."""
    first = next(iter(results["models"].values()))
    rows = list(first["seconds"])
    lines = [
        f"Verify cost: a batch of n rows after a {results['prompt_tokens']}-token prompt, {results['threads']} "
        f"threads, {results['rounds']} interleaved rounds, best of {results.get('repeats', 1)} decodes each (median "
        "ratio to 1 row, with the range); bound: tensor "
        f"bytes / {results['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (numpy copy)",
        "",
        "| type | tensors | bound | 1 row | of the bound | " + " | ".join(f"{n} rows" for n in rows[1:]) + " |",
        "| --- | ---: | ---: | ---: | ---: |" + " ---: |" * (len(rows) - 1),
    ]
    for name, model in results["models"].items():
        ratios = [model["x_one_row"][n] for n in rows[1:]]
        lines.append(
            f"| {name} | {model['weight_bytes'] / 1e6:.1f} MB | {model['bound_seconds'] * 1e3:.2f} ms "
            f"| {model['seconds'][rows[0]] * 1e3:.2f} ms | {model['one_row_of_bound']:.0%} | "
            + " | ".join(f"x{r['median']:.2f} ({r['low']:.2f}-{r['high']:.2f})" for r in ratios)
            + " |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="decodes per batch size and round (the best)")
    parser.add_argument("--json", type=Path, help="write the results here (benchmarks/results/verify_cost.json)")
    args = parser.parse_args()
    results = measure(args.rounds, args.threads, args.repeats)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
