"""What loading a model without mmap costs (issue 20, item 7): ``Model(path)`` against ``Model(path, use_mmap=True)``.

Each measurement runs in a fresh process, alternating the two ways (A, B, A, B, ...) after one
warm-up of each (so the file is in the page cache for both, as it is on a machine that has loaded
it before). Per process: the load time of ``Model()``, the peak resident set (``ru_maxrss``) and
its anonymous and file-backed parts (``RssAnon``, ``RssFile``) after the load, and the peak after
generating 8 tokens (which makes a mapped model's pages resident). Reported: the medians.

Usage: python benchmarks/model_load.py [--runs 5] [--json OUT]
       python benchmarks/model_load.py --measure [--mmap]   (one process's figures, as JSON)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FIGURES = ("load_s", "peak_rss_mib_loaded", "rss_anon_mib", "rss_file_mib", "peak_rss_mib_generated", "baseline_mib")


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(use_mmap: bool) -> dict[str, float]:
    """One process's figures for one way of loading SmolLM2."""
    from specstate import Generator, Model
    from specstate.smollm2 import smollm2_path

    path = smollm2_path()
    baseline = _peak_mib()
    started = time.perf_counter()
    model = Model(path, use_mmap=use_mmap)
    load = time.perf_counter() - started
    figures = {
        "load_s": load,
        "peak_rss_mib_loaded": _peak_mib(),
        "rss_anon_mib": _status_mib("RssAnon"),
        "rss_file_mib": _status_mib("RssFile"),
        "baseline_mib": baseline,
    }
    generator = Generator(model, n_ctx=256, n_threads=1)
    generator.generate("The quick brown fox", max_tokens=8)
    figures["peak_rss_mib_generated"] = _peak_mib()
    return figures


def run_one(use_mmap: bool) -> dict[str, float]:
    command = [sys.executable, __file__, "--measure", *(["--mmap"] if use_mmap else [])]
    figures: dict[str, float] = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return figures


def compare(runs: int) -> dict[str, Any]:
    """Medians of `runs` interleaved fresh processes per way, after one warm-up of each."""
    run_one(False), run_one(True)
    samples: dict[str, list[dict[str, float]]] = {"read": [], "mmap": []}
    for _ in range(runs):
        samples["read"].append(run_one(False))
        samples["mmap"].append(run_one(True))
    medians = {
        way: {figure: statistics.median(run[figure] for run in rows) for figure in FIGURES}
        for way, rows in samples.items()
    }
    from specstate.smollm2 import smollm2_path

    return {
        "model": smollm2_path().name,
        "model_bytes": smollm2_path().stat().st_size,
        "runs": runs,
        "medians": medians,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="measure in this process and print JSON")
    parser.add_argument("--mmap", action="store_true", help="with --measure: load with use_mmap=True")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.mmap)))
        return
    results = compare(args.runs)
    for way, figures in results["medians"].items():
        print(way, " ".join(f"{name}={value:.3f}" for name, value in figures.items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
