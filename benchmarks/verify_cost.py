"""What verification costs: decoding a batch of 1, 2, 4, 8 and 16 rows, against one row (part of ``make bench``).

Speculation verifies a draft of k tokens as one batch of k + 1 rows; it pays when that batch costs little more
than one row. Since specstate's llama.cpp patch (``llama-cpp-sys-4/patches``) gives each row of a batch of up to 17
exactly its single decode's logits, this table is the price of exactness too. On SmolLM2-135M-Instruct Q4_1 and
copies requantized to Q4_0, Q8_0 and Q4_K (``specstate_testkit.requantize``), or on ``--model`` as shipped and
copies requantized to each quantized type its weights hold, after a 300-token prompt, every batch is decoded on a
fresh copy of the KV state (``set_seq_state``, untimed), as verification does, with every row's logits; each round
times every row count once (the best of ``--repeats`` decodes, which filters a shared machine's stalls), the order
rotating (``specstate.bench.interleave``), and a ratio is the median of the per-round ratios to 1 row, with their
range.

Upstream's cost beside it (unless ``--skip-peers``): llama-cpp-python from the benchmark's peer venv (its own
llama.cpp, unpatched: batches take ggml's inexact batched kernels) decodes the same tokens after the same prompt in
the same rounds, each batch after its KV cache is cut back to the prompt, with every row's logits (``logits_all``).

The bound beside it: a decode reads every weight once, so one row takes at least the model's tensor bytes over the
machine's memory bandwidth (a numpy copy of a large array, best of 3, read and written bytes counted, one thread);
the 1-row figure is printed as the fraction of that limit it reaches.

Usage: python benchmarks/verify_cost.py [--rounds 20] [--repeats 3] [--threads 2] [--model M] [--skip-peers]
    [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from bench_models import SMOLLM2, add_model_options, file_type, resolve, weight_types
from specstate import Context, Model
from specstate.bench import interleave, pair_ratio

ROWS = (1, 2, 4, 8, 16)
PROMPT_TOKENS = 300
ROUNDS = 20
#: Each round times a batch size as the best of this many decodes (each on a fresh copy of the state).
REPEATS = 3
QUANTS: dict[str, T | None] = {"Q4_1": None, "Q4_0": T.Q4_0, "Q8_0": T.Q8_0, "Q4_K": T.Q4_K}
UPSTREAM = "upstream"
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


def type_copies(path: Path) -> dict[str, Path]:
    """A model as shipped, named by its file type (``Q4_K_M``), and copies with every 2-D weight requantized to each
    other quantized type its weights hold that ``specstate_testkit.requantize`` writes (built once, cached)."""
    from specstate.smollm2 import cache_dir
    from specstate_testkit.requantize import QUANTIZERS, cached_copy

    shipped = file_type(path)
    copies = {shipped: path}
    for kind in weight_types(path):
        if kind == shipped:
            continue
        if T[kind] not in QUANTIZERS:
            log(f"verify cost: {kind} weights, but no quantizer for {kind}: no copy")
            continue
        log(f"verify cost: a copy of {path.name} in {kind} (built once, cached)")
        copies[kind] = cached_copy(path, T[kind], cache_dir() / "requantized")
    return copies


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


class PeerProcess:
    """A persistent ``peer_llama_cpp_python.py`` process in the peer venv (llama-cpp-python), started in mode
    `flag` with `first` as its first request, answering one JSON request a line."""

    def __init__(self, python: Path, flag: str, model: Path, threads: int, first: dict[str, Any]) -> None:
        script = Path(__file__).resolve().parent / "peer_llama_cpp_python.py"
        command = [str(python), str(script), flag, str(model), str(threads)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ask(first)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


class UpstreamTimer(PeerProcess):
    """llama-cpp-python timing the same batches after the same prompt as a BatchTimer (``--batches``)."""

    def __init__(self, python: Path, model: Path, threads: int, timer: BatchTimer) -> None:
        super().__init__(python, "--batches", model, threads, {"prompt": timer.prompt, "batch": timer.batch})

    def timer(self, rows: int, repeats: int) -> Callable[[], float]:
        return lambda: float(self.ask({"rows": rows, "repeats": repeats})["seconds"])


def _ratios(seconds: dict[str, list[float]], rows: Sequence[int], prefix: str = "") -> dict[str, Any]:
    """Median seconds per row count and the per-round ratios to one row, of the timings named ``prefix + rows``."""
    one = seconds[prefix + str(rows[0])]
    return {
        "seconds": {str(n): statistics.median(seconds[prefix + str(n)]) for n in rows},
        "x_one_row": {str(n): vars(pair_ratio(seconds[prefix + str(n)], one)) for n in rows},
    }


def batch_costs(
    model: Model,
    rounds: int,
    threads: int,
    rows: Sequence[int] = ROWS,
    prompt_tokens: int = PROMPT_TOKENS,
    repeats: int = REPEATS,
    peer: Path | None = None,
) -> dict[str, Any]:
    """Median seconds per batch size and the per-round ratios to the first (1 row), in interleaved rounds; with
    `peer` (the peer venv's python), upstream's under ``"upstream"``, measured in the same rounds."""
    timer = BatchTimer(model, threads, prompt_tokens, max(rows))
    contenders = {str(n): timer.timer(n, repeats) for n in rows}
    upstream = None if peer is None else UpstreamTimer(peer, Path(model.path), threads, timer)
    try:
        if upstream is not None:
            contenders.update({f"{UPSTREAM} {n}": upstream.timer(n, repeats) for n in rows})
        seconds = interleave(contenders, rounds)
    finally:
        if upstream is not None:
            upstream.close()
    costs = _ratios(seconds, rows)
    if upstream is not None:
        costs[UPSTREAM] = _ratios(seconds, rows, f"{UPSTREAM} ")
    return costs


def figures(
    paths: dict[str, Path], rounds: int, threads: int, bandwidth: float, **sizes: Any
) -> dict[str, dict[str, Any]]:
    """Every model's batch costs and its bandwidth bound (`sizes`: rows, prompt_tokens, repeats, peer)."""
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


def measure(
    rounds: int = ROUNDS,
    threads: int = 2,
    repeats: int = REPEATS,
    copy_size: int = 2**30,
    model: str = SMOLLM2,
    peer: Path | None = None,
) -> dict[str, Any]:
    """The verify-cost results of SmolLM2 in its four types, or of `model` (a ``--model``) in its own types, with
    the machine's bandwidth; with `peer` (the peer venv's python), upstream's beside each."""
    bandwidth = copy_bandwidth(copy_size)
    paths = smollm2_copies() if model == SMOLLM2 else type_copies(resolve(model))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "model": next(iter(paths.values())).name,
        "threads": threads,
        "rounds": rounds,
        "repeats": repeats,
        "prompt_tokens": PROMPT_TOKENS,
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_copy_bytes": copy_size,
        "models": figures(paths, rounds, threads, bandwidth, repeats=repeats, peer=peer),
    }


def _ratio_cells(costs: dict[str, Any], rows: list[str]) -> str:
    return " | ".join(
        f"x{r['median']:.2f} ({r['low']:.2f}-{r['high']:.2f})" for r in (costs["x_one_row"][n] for n in rows[1:])
    )


def table(results: dict[str, Any]) -> list[str]:
    """The verify-cost results as markdown lines: a row per model type (and upstream's below it, where measured)."""
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
        lines.append(
            f"| {name} | {model['weight_bytes'] / 1e6:.1f} MB | {model['bound_seconds'] * 1e3:.2f} ms "
            f"| {model['seconds'][rows[0]] * 1e3:.2f} ms | {model['one_row_of_bound']:.0%} | "
            + _ratio_cells(model, rows)
            + " |"
        )
        if UPSTREAM in model:
            upstream = model[UPSTREAM]
            lines.append(
                f"| {name}, {UPSTREAM} | | | {upstream['seconds'][rows[0]] * 1e3:.2f} ms "
                f"| {model['bound_seconds'] / upstream['seconds'][rows[0]]:.0%} | "
                + _ratio_cells(upstream, rows)
                + " |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="decodes per batch size and round (the best)")
    add_model_options(parser)
    parser.add_argument("--skip-peers", action="store_true", help="no upstream figures (llama-cpp-python)")
    parser.add_argument("--json", type=Path, help="write the results here (benchmarks/results/verify_cost.json)")
    args = parser.parse_args()
    peer = None
    if not args.skip_peers:
        from peer_venv import peer_python

        peer = peer_python()
    results = measure(args.rounds, args.threads, args.repeats, model=args.model, peer=peer)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
