"""Leaks, measured: create and destroy many generators and contexts, and compare resident memory.

Usage: python benchmarks/lifecycle_memory.py [--cycles 10000] [--json OUT]

Each cycle builds a speculative ``Generator`` (ngram mode, with a prompt decoded, a few tokens
generated and a checkpoint captured), restores that checkpoint into a second generator, and builds
and frees a bare ``Context`` and ``Batch``, all over one tiny GGUF model written with the ``gguf``
package (specstate_testkit.models). Resident memory (VmRSS) is read after a warm-up of 10% of the cycles
and at the end; the growth between them is what leaks would show as. Prints one line and, with
``--json``, writes the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

from specstate import Batch, Context, Generator, Model
from specstate_testkit import models


def rss_bytes() -> int:
    """Resident memory of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def one_cycle(model: Model, prompt: list[int]) -> None:
    """Everything a user creates and drops in one generation's life."""
    generator = Generator(model, mode="ngram", n_ctx=128, n_batch=32, n_draft=4, n_threads=1)
    generator.generate(prompt, max_tokens=4)
    data = generator.checkpoint()
    resumed = Generator.restore(data, model, n_threads=1)
    resumed.generate(max_tokens=2)
    context = Context(model, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=1)
    batch = Batch(16)
    del generator, resumed, context, batch, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        model = Model(models.build_llama(Path(directory) / "llama.gguf", seed=0))
    prompt = [1 + (i * 7) % 50 for i in range(24)]
    warmup = max(1, args.cycles // 10)
    started = time.perf_counter()
    for _ in range(warmup):
        one_cycle(model, prompt)
    gc.collect()
    after_warmup = rss_bytes()
    samples = [(warmup, after_warmup)]
    for cycle in range(warmup, args.cycles):
        one_cycle(model, prompt)
        if (cycle + 1) % warmup == 0:
            gc.collect()
            samples.append((cycle + 1, rss_bytes()))
    gc.collect()
    at_end = rss_bytes()
    growth = (at_end - after_warmup) / after_warmup
    result = {
        "cycles": args.cycles,
        "warmup_cycles": warmup,
        "rss_after_warmup": after_warmup,
        "rss_at_end": at_end,
        "growth": growth,
        "seconds": time.perf_counter() - started,
        "samples": samples,
    }
    print(
        f"{args.cycles} cycles (generator + restore + context + batch) in {result['seconds']:.0f} s: "
        f"RSS {after_warmup / 2**20:.1f} MiB after {warmup} -> {at_end / 2**20:.1f} MiB at the end, "
        f"growth {growth:+.2%} (target < 1%)"
    )
    print("RSS (MiB) by cycle: " + ", ".join(f"{n}: {value / 2**20:.2f}" for n, value in samples))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0 if growth < 0.01 else 1)


if __name__ == "__main__":
    main()
