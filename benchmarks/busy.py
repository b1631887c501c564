"""Decoding on a machine that is doing other things (issue 33; part of ``make bench``, alone ``make bench-busy``).

Each round runs every load in turn, 0, 1 and 2 other CPU-bound processes (``python -c "while True: pass"``,
started before the load's measurements and stopped after), and under each load every contender once, back to
back, the order rotating: the ratios are medians of per-round pairs measured under the same load in the same
stretch of time, printed with their range. Contenders, each decoding ``--tokens`` greedy tokens on the code prompt
after its first token (prefill excluded):

- specstate, plain decoding (``none``) and ``ngram`` with the adaptive draft length (``make bench``'s), at 1 thread,
  2 threads and the default thread count (``n_threads=0``, docs/threads.md), in a persistent worker process that
  restores a prefilled checkpoint before each generation (untimed);
- the same worker with every graph kept at its configured count (``SPECSTATE_FIXED_THREADS=1``, what specstate
  did before issue 33), at 2 threads: the configuration before (then the default on these 2-CPU machines);
- llama-cpp-python (the benchmark venv's), plain decoding at its own default thread count (``cpu_count() // 2``)
  and at 2 threads, each a persistent process (its prompt is decoded once: it keeps the prefix);
- llama.cpp's ``llama-bench`` (the crate's llama.cpp, unpatched), ``tg`` at 2 threads, as a reference.

Writes benchmarks/results/busy.json (and busy.md); docs/benchmarks.md's table is made from the JSON.
Usage: python benchmarks/busy.py [--rounds 5] [--tokens 64] [--loads 0 1 2] [--skip-peers] [--json PATH]
       python benchmarks/busy.py --worker   (one process's measurements, one JSON line per request on stdin)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from llama_cpp_spec import llama_bench
from peer_venv import peer_python
from specstate._typing import DraftPolicy, Mode

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: The environment variable that keeps every graph at its configured thread count (docs/threads.md).
FIXED_VARIABLE = "SPECSTATE_FIXED_THREADS"
#: The configuration before issue 33: 2 threads (every CPU here), kept whatever the machine does.
BEFORE_THREADS = 2
#: The loads: how many other CPU-bound processes run while the contenders decode.
LOADS = (0, 1, 2)
#: The decoding measured: plain, and n-gram speculation.
MEASURED_MODES: tuple[Mode, ...] = ("none", "ngram")
#: specstate's thread counts: 0 is the default (the rule of docs/threads.md).
THREADS = (1, 2, 0)
#: The most seconds one generation is timed: a collapsed contender's figure is its speed over this long.
DEADLINE = 12.0
PEER = "llama-cpp-python"
BENCH = "llama-bench"


def specstate_name(mode: str, threads: int) -> str:
    return f"specstate {mode}, " + ("default threads" if threads == 0 else f"{threads} thread{'s' * (threads > 1)}")


def before_name(mode: str) -> str:
    return f"specstate {mode}, {BEFORE_THREADS} fixed threads (before)"


def log(message: str) -> None:
    print(f"[busy] {message}", file=sys.stderr, flush=True)


# --- the worker: specstate's generations, in a process of their own ----------------------------------------------


def worker(path: Path) -> None:
    """Answer {"mode", "threads", "tokens"} lines with {"tokens_per_s"}: a generation restored from the prompt's
    checkpoint (untimed), then `tokens` greedy tokens timed, stopping after DEADLINE seconds (a collapsed
    contender would take minutes). The first line out: this process's default threads."""
    from specstate import Generator, Model, default_threads
    from specstate.bench import CODE_PROMPT

    model = Model(path)
    prompt = model.tokenize(CODE_PROMPT, add_special=False, parse_special=True)
    checkpoints = {}
    for mode in MEASURED_MODES:
        policy: DraftPolicy = "adaptive" if mode == "ngram" else "fixed"
        generator = Generator(model, mode=mode, n_ctx=1024, n_threads=1, draft_policy=policy)
        generator.generate(prompt, max_tokens=1)
        checkpoints[mode] = generator.checkpoint()
    print(json.dumps({"default_threads": default_threads()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        generator = Generator.restore(checkpoints[request["mode"]], model, n_threads=request["threads"])
        started = time.perf_counter()
        for _ in generator.stream(max_tokens=request["tokens"]):
            if time.perf_counter() - started > DEADLINE:
                break
        elapsed = time.perf_counter() - started
        print(json.dumps({"tokens_per_s": (len(generator.tokens) - 1) / elapsed}), flush=True)


class Process:
    """A persistent measuring process: one JSON line in, one JSON line out."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        stdin = self._pipes()[0]
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        return self.read()

    def read(self) -> dict[str, Any]:
        line = self._pipes()[1].readline()
        if not line:
            raise RuntimeError(f"{self.process.args!r} ended (status {self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def close(self) -> None:
        self._pipes()[0].close()
        self.process.wait(timeout=60)


# --- the load -----------------------------------------------------------------------------------------------------


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """`processes` other CPU-bound processes running for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        time.sleep(0.2 if processes else 0.0)  # let them start spinning
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


# --- the contenders -----------------------------------------------------------------------------------------------


Measures = dict[str, Callable[[], float]]


def contenders(args: argparse.Namespace, opened: list[Process]) -> tuple[Measures, dict[str, Any]]:
    """Every contender as a measurement, and what the run records of the machine and the peers."""
    command = [sys.executable, __file__, "--worker", "--model", str(args.model)]
    ours = Process(command)
    fixed = Process(command, env={**os.environ, FIXED_VARIABLE: "1"})
    opened += [ours, fixed]
    info: dict[str, Any] = {"default_threads": ours.read()["default_threads"], "cpus": os.cpu_count()}
    fixed.read()
    measures: Measures = {}

    def specstate(process: Process, mode: str, threads: int) -> Callable[[], float]:
        request = {"mode": mode, "threads": threads, "tokens": args.tokens}
        return lambda: float(process.ask(request)["tokens_per_s"])

    for mode in MEASURED_MODES:
        for threads in THREADS:
            measures[specstate_name(mode, threads)] = specstate(ours, mode, threads)
        measures[before_name(mode)] = specstate(fixed, mode, BEFORE_THREADS)
    if not args.skip_peers:
        measures.update(peers(args, opened, info))
    return measures, info


def peers(args: argparse.Namespace, opened: list[Process], info: dict[str, Any]) -> Measures:
    """llama-cpp-python at its default thread count and at 2 threads, and llama-bench at 2 threads."""
    from specstate.bench import CODE_PROMPT

    python, model, binary = peer_python(), args.model, llama_bench()
    script = str(ROOT / "benchmarks" / "peer_llama_cpp_python.py")
    measures: Measures = {}
    request = {"llm": "plain", "prompt": CODE_PROMPT, "tokens": args.tokens + 1}

    def peer(process: Process) -> Callable[[], float]:
        return lambda: float(process.ask(request)["tokens_per_s"])

    for threads in (0, 2):  # 0: llama-cpp-python's own default
        process = Process([str(python), script, "--serve", str(model), str(threads)])
        opened.append(process)
        measures[f"{PEER} none, " + ("its default threads" if threads == 0 else f"{threads} threads")] = peer(process)
    info["llama_cpp_python_default_threads"] = max((os.cpu_count() or 1) // 2, 1)

    def bench() -> float:
        command = [str(binary), "-m", str(model), "-t", "2", "-p", "0", "-n", str(args.tokens), "-r", "1"]
        out = subprocess.run([*command, "-o", "json"], check=True, capture_output=True, text=True).stdout
        return float(json.loads(out)[0]["avg_ts"])

    measures[f"{BENCH} tg{args.tokens}, 2 threads"] = bench
    return measures


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every contender under every load, in interleaved rounds after one warm-up round."""
    opened: list[Process] = []
    try:
        measures, info = contenders(args, opened)
        names = list(measures)
        figures: dict[str, dict[str, list[float]]] = {str(load): {name: [] for name in names} for load in args.loads}
        for index in range(1 + args.rounds):
            log(f"round {index}/{args.rounds}" + (" (warm-up)" if index == 0 else ""))
            for load in args.loads:
                with busy(load):
                    shift = index % len(names)
                    for name in names[shift:] + names[:shift]:
                        value = measures[name]()
                        if index > 0:
                            figures[str(load)][name].append(value)
    finally:
        for process in opened:
            process.close()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "tokens": args.tokens,
        "rounds": args.rounds,
        "machine": info,
        "figures": figures,
    }


# --- ratios, goals and tables -------------------------------------------------------------------------------------


def ratio(a: list[float], b: list[float]) -> dict[str, float]:
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    return {"median": statistics.median(ratios), "low": min(ratios), "high": max(ratios)}


def _text(entry: dict[str, float]) -> str:
    return f"x{entry['median']:.2f} ({entry['low']:.2f}-{entry['high']:.2f})"


def goals(results: dict[str, Any]) -> list[tuple[str, dict[str, float], float]]:
    """Issue 33's goals as (measure, ratio, at least): each a median of per-round ratios of one run."""
    figures = results["figures"]
    rows: list[tuple[str, dict[str, float], float]] = []
    for mode in MEASURED_MODES:
        one, two, default = (figures.get("1", {}).get(specstate_name(mode, t)) for t in THREADS)
        if one and two and default:
            best = [max(a, b) for a, b in zip(one, two)]
            rows.append((f"1 busy process, {mode}: default / best of 1 and 2 threads", ratio(default, best), 0.9))
            rows.append((f"1 busy process, {mode}: 2 threads / 1 thread", ratio(two, one), 1.0))
    idle = figures.get("0", {})
    for mode in MEASURED_MODES:
        before, ours = idle.get(before_name(mode)), idle.get(specstate_name(mode, 0))
        if before and ours:
            rows.append((f"idle, {mode}: default / before (2 fixed threads)", ratio(ours, before), 0.97))
    peer = f"{PEER} none, its default threads"
    for load, row in figures.items():
        for mode in MEASURED_MODES:
            ours = row.get(specstate_name(mode, 0))
            if ours and peer in row:
                measure = f"{load} busy: specstate {mode}, default / {PEER} at its default"
                rows.append((measure, ratio(ours, row[peer]), 1.0))
    return rows


def targets_table(results: dict[str, Any]) -> list[str]:
    lines = ["| measure | median pair ratio (range) | target | verdict |", "| --- | ---: | ---: | --- |"]
    for measure, entry, target in goals(results):
        verdict = "met" if entry["median"] >= target else "**missed**"
        lines.append(f"| {measure} | {_text(entry)} | >= {target:g} | {verdict} |")
    return lines


def table(results: dict[str, Any]) -> list[str]:
    """Tokens per second (medians) of every contender under every load, and each against specstate's default."""
    loads = list(results["figures"])
    header = "| contender | " + " | ".join(f"{load} busy: tokens/s | vs default" for load in loads) + " |"
    lines = [header, "| --- |" + " ---: | ---: |" * len(loads)]
    for name in results["figures"][loads[0]]:
        cells = []
        for load in loads:
            row = results["figures"][load]
            mode = "ngram" if " ngram" in name else "none"
            cells.append(f"{statistics.median(row[name]):.1f}")
            cells.append(_text(ratio(row[name], row[specstate_name(mode, 0)])))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def busy_fields(results: dict[str, Any]) -> dict[str, str]:
    """The fields of docs/benchmarks.md's section (``report.py`` fills the template with them)."""
    machine = results["machine"]
    verdicts = ["met" if entry["median"] >= target else "missed" for _, entry, target in goals(results)]
    return {
        "busy_setup": f"{results['tokens']} greedy tokens, {results['rounds']} interleaved rounds, {results['date']}; "
        f"{machine['cpus']} CPUs; specstate's default thread count {machine['default_threads']}"
        + (
            f", llama-cpp-python's {machine['llama_cpp_python_default_threads']}"
            if "llama_cpp_python_default_threads" in machine
            else ""
        ),
        "busy_targets": "\n".join(targets_table(results)),
        "busy_table": "\n".join(table(results)),
        "busy_verdict": f"{verdicts.count('met')} of {len(verdicts)} goals met",
    }


def markdown(results: dict[str, Any]) -> str:
    fields = busy_fields(results)
    lines = [
        f"SmolLM2-135M-Instruct Q4_1, code prompt, {fields['busy_setup']}: {fields['busy_verdict']}",
        "",
        *targets_table(results),
        "",
        *table(results),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--loads", type=int, nargs="+", default=list(LOADS))
    parser.add_argument("--skip-peers", action="store_true", help="no llama-cpp-python or llama-bench")
    parser.add_argument("--json", type=Path, default=RESULTS / "busy.json")
    parser.add_argument("--model", type=Path, help="the GGUF model (default: SmolLM2-135M-Instruct Q4_1)")
    args = parser.parse_args()
    if args.model is None:
        from specstate.smollm2 import smollm2_path

        args.model = smollm2_path()
    if args.worker:
        worker(args.model)
        return
    results = measure(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    args.json.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
