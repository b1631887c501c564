"""Decode speed of the default build (x86-64-v3 kernels) against an SSE4.2-only build.

Both are the same code: `benchmarks/native_decode.rs` over the pinned
llama-cpp-sys-4. The SSE4.2 build is what that crate compiles on x86-64 when no
CPU flags are given; the default build adds ``-march=x86-64-v3`` through
``.cargo/config.toml``. The two binaries run alternately, side by side in one
run, on SmolLM2-135M-Instruct Q4_1 with 2 threads, and the script prints the
medians and their ratio and writes ``benchmarks/results/cpu_baseline.json``.

Usage: ``python benchmarks/cpu_baseline.py [--tokens 128] [--rounds 5]``.
The SSE4.2 build goes to its own target directory
(``$CARGO_TARGET_DIR-sse42``): the first run compiles llama.cpp once more.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sysconfig
from pathlib import Path

from specstate.smollm2 import smollm2_path

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TARGET = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache" / "specstate-target"))
TRIPLE_FLAGS = ("CFLAGS_x86_64_unknown_linux_gnu", "CXXFLAGS_x86_64_unknown_linux_gnu")


def build(target_dir: Path, sse42_only: bool) -> Path:
    """Build the native_decode example into `target_dir` and return the binary."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(target_dir))
    if sse42_only:
        # Environment values win over `.cargo/config.toml`'s [env]: no -march flag.
        env.update({name: "" for name in TRIPLE_FLAGS})
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--example", "native_decode"], cwd=ROOT, env=env, check=True
    )
    return target_dir / "release" / "examples" / "native_decode"


def measure(binary: Path, model: Path, tokens: int, threads: int) -> dict[str, float]:
    """One median-of-3 measurement of one binary."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(sysconfig.get_config_var("LIBDIR") or ""))
    out = subprocess.run(
        [str(binary), str(model), str(tokens), str(threads), "3"], env=env, check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = smollm2_path()
    builds = {
        "x86-64-v3 (default)": build(DEFAULT_TARGET, sse42_only=False),
        "SSE4.2 only": build(Path(f"{DEFAULT_TARGET}-sse42"), sse42_only=True),
    }
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, binary in builds.items():
            samples[name].append(measure(binary, model, args.tokens, args.threads))
    rows = {}
    for name, runs in samples.items():
        rows[name] = {
            "decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in runs),
            "prefill_tokens_per_s": statistics.median(r["prefill_tokens_per_s"] for r in runs),
            "simd": runs[0]["simd"],
        }
    default, baseline = rows["x86-64-v3 (default)"], rows["SSE4.2 only"]
    ratios = {
        "decode": default["decode_tokens_per_s"] / baseline["decode_tokens_per_s"],
        "prefill": default["prefill_tokens_per_s"] / baseline["prefill_tokens_per_s"],
    }
    print(
        f"SmolLM2-135M-Instruct Q4_1, {args.threads} threads, {args.tokens} tokens, "
        f"median of {args.rounds} rounds x 3 runs"
    )
    print(f"{'build':<22} {'decode tok/s':>13} {'prefill tok/s':>14}  kernels")
    for name, row in rows.items():
        print(f"{name:<22} {row['decode_tokens_per_s']:>13.1f} {row['prefill_tokens_per_s']:>14.1f}  {row['simd']}")
    print(f"default / SSE4.2: decode x{ratios['decode']:.2f}, prefill x{ratios['prefill']:.2f}")
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    report = {
        "model": model.name,
        "threads": args.threads,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "builds": rows,
        "ratios": ratios,
    }
    (results / "cpu_baseline.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
