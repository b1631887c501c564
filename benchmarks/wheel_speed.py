"""Decode and prefill speed of two built wheels, each in a fresh virtual environment, in interleaved pairs.

    python benchmarks/wheel_speed.py A.whl B.whl [--rounds 8] [--tokens 128] [--threads 2]

Each wheel is installed (with its declared dependencies) into its own new virtual environment. Every round runs
one process per wheel, in turn (the order alternating), each measuring plain greedy decoding on
SmolLM2-135M-Instruct Q4_1 (``specstate.bench.decode_speed``: median of 3 after a warm-up) and the prefill of
a 512-token prompt. The script prints the per-round ratios B / A (median and range) and writes
``benchmarks/results/wheel_speed.json``. Used to check that the manylinux_2_28 wheel (`make wheel`, zig) decodes
as fast as the wheel built by the system compiler.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specstate.smollm2 import smollm2_path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import json, statistics, sys, time
import specstate
from specstate import Generator, Model
from specstate.bench import decode_speed
model = Model(sys.argv[1])
tokens, threads = int(sys.argv[2]), int(sys.argv[3])
decode = decode_speed(model, n_tokens=tokens, threads=threads, runs=3)
prompt = (model.tokenize("The quick brown fox jumps over the lazy dog. ", add_special=False) * 64)[:512]
prefill = []
for _ in range(3):
    generator = Generator(model, n_ctx=1024, n_threads=threads)
    started = time.perf_counter()
    generator.generate(prompt, max_tokens=1)
    prefill.append(len(prompt) / (time.perf_counter() - started))
info = specstate.native_info()
print(json.dumps({"decode": decode, "prefill": statistics.median(prefill), "simd": info["simd_features"]}))
"""


def venv_with(wheel: Path, where: Path) -> Path:
    """A new virtual environment at `where` with `wheel` installed; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)], check=True
    )
    return python


def start(python: Path, model: Path, tokens: int, threads: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(python), "-c", MEASURE, str(model), str(tokens), str(threads)],
        cwd=tempfile.gettempdir(),  # not the clone: its python/ must not shadow the installed wheel
        stdout=subprocess.PIPE,
        text=True,
    )


def result(process: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"measurement failed with exit status {process.returncode}")
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="the reference wheel")
    parser.add_argument("b", type=Path, help="the wheel compared with it")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--together",
        action="store_true",
        help="run each round's two measurements at the same time (on a busy machine: the same load for both; "
        "their ratio holds while each gets an even share of the CPUs, e.g. 1 thread each on 2 cores)",
    )
    args = parser.parse_args()
    model = smollm2_path()
    with tempfile.TemporaryDirectory() as scratch:
        pythons = {name: venv_with(getattr(args, name), Path(scratch) / name) for name in ("a", "b")}
        runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
        for index in range(args.rounds):
            if args.together:  # both at once: the same machine load, shared evenly between them
                started = {name: start(pythons[name], model, args.tokens, args.threads) for name in runs}
                for name, process in started.items():
                    runs[name].append(result(process))
            for name in () if args.together else ("a", "b") if index % 2 == 0 else ("b", "a"):
                runs[name].append(result(start(pythons[name], model, args.tokens, args.threads)))
            last = {name: figures[-1] for name, figures in runs.items()}
            shown = ", ".join(f"{n} decode {r['decode']:.1f}, prefill {r['prefill']:.1f}" for n, r in last.items())
            print(f"round {index + 1} (tok/s): {shown}", flush=True)
    report: dict[str, object] = {
        "model": model.name,
        "threads": args.threads,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "together": args.together,
        "wheels": {"a": args.a.name, "b": args.b.name},
        "simd": {name: runs[name][0]["simd"] for name in runs},
    }
    for figure in ("decode", "prefill"):
        a = [r[figure] for r in runs["a"]]
        b = [r[figure] for r in runs["b"]]
        ratios = [y / x for x, y in zip(a, b)]
        report[figure] = {
            "a_median": statistics.median(a),
            "b_median": statistics.median(b),
            "ratio_b_over_a": {"median": statistics.median(ratios), "low": min(ratios), "high": max(ratios)},
            "per_round": {"a": a, "b": b},
        }
        print(
            f"{figure}: a {statistics.median(a):.1f} tok/s, b {statistics.median(b):.1f} tok/s, "
            f"b/a x{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) over {args.rounds} rounds"
        )
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "wheel_speed.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
