"""ggml's OpenMP thread pool against its own, measured side by side (issue 11's thread question).

Two builds of specstate are compared: the default one (ggml's own thread pool,
``GGML_OPENMP=OFF``) in this Python, and one built with the ``openmp`` Cargo
feature in another environment (``--other-python``). Each measurement runs in
a fresh process of one build, then of the other (A, B, A, B, ...), so that
the machine's drift hits both alike; reported are the medians and the median
of the per-pair ratios (OpenMP / default) with their range. Measured, on
SmolLM2-135M-Instruct Q4_1: plain decoding (128 tokens, prefill excluded),
prefill (a ~500-token prompt, tokens per second), and ``ngram`` speculation on
the code and quotes prompts (160 tokens).

Usage: python benchmarks/openmp.py --other-python PATH [--pairs 5] [--threads 2] [--json OUT]
       python benchmarks/openmp.py --measure --threads 2   (one process's figures, as JSON)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FIGURES = ("decode", "prefill", "ngram_code", "ngram_quotes")


def measure(threads: int) -> dict[str, float]:
    """This build's figures, one run each after a warm-up."""
    from specstate import Generator, Model, native_info
    from specstate.bench import CODE_PROMPT, QUOTE_PROMPT, STORY_PROMPT, decode_speed, speculation_figures
    from specstate.smollm2 import smollm2_path

    model = Model(smollm2_path())
    prompt = model.tokenize((STORY_PROMPT + " ") * 6, add_special=True, parse_special=False)[:500]

    def prefill() -> float:
        generator = Generator(model, n_ctx=1024, n_threads=threads)
        started = time.perf_counter()
        generator.generate(prompt, max_tokens=1)
        return len(prompt) / (time.perf_counter() - started)

    prefill()
    figures = {
        "decode": decode_speed(model, threads=threads, runs=2),
        "prefill": statistics.median(prefill() for _ in range(2)),
    }
    for name, text in (("code", CODE_PROMPT), ("quotes", QUOTE_PROMPT)):
        figures[f"ngram_{name}"] = speculation_figures(model, "ngram", text, threads=threads, runs=2).tokens_per_second
    figures["openmp"] = float("openmp" in native_info()["system_info"].lower())
    return figures


def run_one(python: str, threads: int) -> dict[str, float]:
    out = subprocess.run(
        [python, __file__, "--measure", "--threads", str(threads)], check=True, capture_output=True, text=True
    ).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def compare(other: str, pairs: int, threads: int) -> dict[str, Any]:
    default_runs, openmp_runs = [], []
    for index in range(pairs):
        default_runs.append(run_one(sys.executable, threads))
        openmp_runs.append(run_one(other, threads))
        print(f"pair {index + 1}/{pairs}: default {default_runs[-1]}, openmp {openmp_runs[-1]}", file=sys.stderr)
    summary: dict[str, Any] = {"pairs": pairs, "threads": threads, "figures": {}}
    for figure in FIGURES:
        ratios = [b[figure] / a[figure] for a, b in zip(default_runs, openmp_runs)]
        summary["figures"][figure] = {
            "default": statistics.median(a[figure] for a in default_runs),
            "openmp": statistics.median(b[figure] for b in openmp_runs),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    summary["builds_report_openmp"] = [default_runs[0]["openmp"], openmp_runs[0]["openmp"]]
    summary["raw"] = {"default": default_runs, "openmp": openmp_runs}
    return summary


def table(summary: dict[str, Any]) -> str:
    lines = ["| figure (tokens/s) | default | OpenMP | OpenMP / default (min-max) |", "| --- | ---: | ---: | ---: |"]
    for figure, row in summary["figures"].items():
        lines.append(
            f"| {figure} | {row['default']:.1f} | {row['openmp']:.1f} | "
            f"x{row['ratio_median']:.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="print this build's figures as JSON")
    parser.add_argument("--other-python", help="the Python of the environment with the OpenMP build")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.threads)))
        return
    if not args.other_python:
        parser.error("--other-python is needed")
    summary = compare(args.other_python, args.pairs, args.threads)
    print(table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
