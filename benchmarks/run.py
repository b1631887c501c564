"""The benchmark suite of specstate (``make bench``), side by side with its peers.

Peers, built here from their registries: llama-cpp-python (PyPI, compiled from
its sdist into the benchmark's own virtual environment with the same
x86-64-v3 kernel flags as specstate) and llama.cpp's own ``llama-bench``
(built with cmake from the llama.cpp source inside the pinned
llama-cpp-sys-4 crate, with the same flags and again with ``GGML_NATIVE``, the
peer at its best on this CPU), llama.cpp's own n-gram speculation (our driver of its
``common_speculative``, ``benchmarks/llama_spec``), plus specstate's native
Rust loop with no Python in it (``benchmarks/native_decode.rs``). Model:
SmolLM2-135M-Instruct Q4_1 with a 4-layer SmolLM2 draft (or ``--model`` and
``--draft-model``, names of ``bench_models`` or paths; such a run writes under
``benchmarks/results/models/``); 2 threads; the cost of verifying batches of 1 to
16 rows (``benchmarks/verify_cost.py``) also on copies in other types.
Everything is built first; then every
speed comparison is measured in interleaved rounds (each contender once per
round, back to back: ``specstate.bench.interleave``) and reported as the
median of the per-round ratios with their range.

Writes latest.json, latest.md, verify_cost.json, speculation.{json,md} and PNG charts into benchmarks/results
(``bench_models.results_dir``).
Usage: python benchmarks/run.py [--runs 5] [--threads 2] [--skip-peers] [--model M] [--draft-model D]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_models import SMOLLM2, add_model_options, kv_bytes_per_token, resolve, results_dir
from llama_cpp_spec import KERNEL_BUILDS, llama_bench
from peer_venv import peer_python
from specstate import Model, native_info
from specstate.bench import (
    CODE_PROMPT,
    STORY_PROMPT,
    checkpoint_figures,
    interleave,
    pair_ratio,
    timed_generation,
    validator_rates,
)
from specstate.smollm2 import cache_dir
from speculation import DRAFT, DRAFTS, PROMPTS, build_peers, prompt_figures
from speculation import write_results as write_speculation
from verify_cost import measure as verify_cost

ROOT = Path(__file__).resolve().parent.parent
#: Greedy tokens per speculation run.
SPECULATION_TOKENS = 160

TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache" / "specstate-target"))


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def build_native_loop() -> None:
    """Build the native loop into TARGET_DIR (make's CARGO_TARGET_DIR or its default), where native_loop() runs it."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET_DIR))
    command = ["cargo", "build", "--release", "--quiet", "--example", "native_decode"]
    subprocess.run(command, cwd=ROOT, check=True, env=env)


def native_loop(model: Path, threads: int, runs: int) -> float:
    """specstate's native Rust decode loop (no Python), tokens/s (built by ``build_native_loop``)."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(sysconfig.get_config_var("LIBDIR") or ""))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as prompt:
        prompt.write(STORY_PROMPT)
    out = subprocess.run(
        [
            str(TARGET_DIR / "release" / "examples" / "native_decode"),
            str(model),
            "128",
            str(threads),
            str(runs),
            prompt.name,
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["decode_tokens_per_s"])


def llama_bench_decode(model: Path, threads: int, runs: int, kernels: str = "x86-64-v3") -> float:
    """llama-bench's tg128 tokens/s, built with the kernel flags `kernels` (a key of KERNEL_BUILDS)."""
    out = subprocess.run(
        [
            str(llama_bench(kernels)),
            "-m",
            str(model),
            "-t",
            str(threads),
            "-p",
            "0",
            "-n",
            "128",
            "-r",
            str(runs),
            "-o",
            "json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out)[0]["avg_ts"])


def peer_checkpoints(model: Path, threads: int, runs: int, checkpoint_text: str) -> dict[str, Any]:
    """llama-cpp-python's checkpoint sizes and save+load times, and its version."""
    request = {
        "model": str(model),
        "threads": threads,
        "runs": runs,
        "checkpoint_tokens": [512, 2048],
        "checkpoint_text": checkpoint_text,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(request, handle)
    out = subprocess.run(
        [str(peer_python()), str(ROOT / "benchmarks" / "peer_llama_cpp_python.py"), handle.name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return figures


def decode_figures(model: Model, path: Path, threads: int, runs: int, peers: dict[str, Any]) -> dict[str, Any]:
    """Plain decoding of 128 tokens by specstate and each peer, in interleaved rounds."""
    contenders: dict[str, Callable[[], float]] = {
        "specstate": lambda: timed_generation(model, STORY_PROMPT, 128, n_threads=threads)[0],
        "native_loop": lambda: native_loop(path, threads, 1),
    }
    if peers:
        contenders["llama_bench"] = lambda: llama_bench_decode(path, threads, 1)
        contenders["llama_bench_native"] = lambda: llama_bench_decode(path, threads, 1, "native")
        contenders["llama_cpp_python"] = lambda: float(
            peers["llama_cpp_python"].measure("plain", STORY_PROMPT, 128)["tokens_per_s"]
        )
    speeds = interleave(contenders, runs)
    return {
        "tokens_per_s": {name: statistics.median(values) for name, values in speeds.items()},
        "specstate_over": {name: vars(pair_ratio(speeds["specstate"], speeds[name])) for name in speeds},
    }


def memory_figures(model: Path, threads: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_worker.py"), str(model), "2048", "128", str(threads)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    figures["model_file"] = model.stat().st_size
    figures["kv_cache"] = kv_bytes_per_token(model) * figures["n_ctx"]
    figures["over_model_and_kv"] = figures["generation_peak_rss"] - figures["model_file"] - figures["kv_cache"]
    figures["capture_extra"] = figures["capture_peak_rss"] - figures["capture_rss_before"]
    figures["capture_extra_ratio"] = figures["capture_extra"] / figures["checkpoint_size"]
    return figures


def draft_model_path(model: Path) -> Path:
    """SmolLM2's own draft: its first 4 layers (built once, cached)."""
    from specstate_testkit.smollm2_draft import build_smollm2_draft

    path = cache_dir() / "smollm2-draft-4-layers.gguf"
    return path if path.exists() else build_smollm2_draft(model, path, n_layers=4)


def draft_contenders(args: argparse.Namespace, path: Path) -> tuple[Model | None, tuple[str, ...]]:
    """The draft model and its contenders: ``--draft-model`` with every draft contender; else, on SmolLM2, its own
    4-layer draft at the fixed length; else none."""
    if args.draft_model:
        return Model(resolve(args.draft_model)), tuple(DRAFTS)
    if args.model == SMOLLM2:
        return Model(draft_model_path(path)), (DRAFT,)
    return None, ()


def speed_figures(model: Model, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every peer built first, then plain decoding and speculation in interleaved rounds, and llama-cpp-python's
    checkpoints (``checkpoint_peer``: empty without peers)."""
    log("building: the native loop and the peers")
    build_native_loop()
    peers = build_peers(argparse.Namespace(skip_peers=args.skip_peers, threads=args.threads), path)
    if peers:
        for kernels in KERNEL_BUILDS:
            llama_bench(kernels)
    try:
        log("plain decoding, interleaved")
        decode = decode_figures(model, path, args.threads, args.runs, peers)
        log("speculation, interleaved")
        rounds = argparse.Namespace(rounds=args.runs, threads=args.threads, tokens=SPECULATION_TOKENS)
        draft, drafts = draft_contenders(args, path)
        speculation = {
            name: prompt_figures(model, prompt, rounds, peers, draft, drafts) for name, prompt in PROMPTS.items()
        }
    finally:
        if peers:
            peers["llama_cpp_python"].close()
    checkpoint_text = (CODE_PROMPT + " ") * 25
    return {
        "decode": decode["tokens_per_s"],
        "decode_ratios": decode["specstate_over"],
        "speculation": speculation,
        "checkpoint_peer": peer_checkpoints(path, args.threads, args.runs, checkpoint_text) if peers else {},
    }


def checkpoint_results(model: Model, args: argparse.Namespace, peer: dict[str, Any]) -> dict[str, Any]:
    """Our checkpoints at 512 and 2048 tokens beside llama-cpp-python's (`peer`, from ``peer_checkpoints``)."""
    checkpoints: dict[str, Any] = {}
    for tokens in (512, 2048):
        figures = checkpoint_figures(model, tokens, threads=args.threads, runs=args.runs)
        checkpoints[str(tokens)] = {
            "size": figures.size,
            "state_in_use": figures.state_in_use,
            "size_ratio": figures.size / figures.state_in_use,
            "capture_seconds": figures.capture_seconds,
            "restore_seconds": figures.restore_seconds,
            "restore_new_seconds": figures.restore_new_seconds,
            "prefill_seconds": figures.prefill_seconds,
            "llama_cpp_python": peer.get("checkpoints", {}).get(str(tokens)),
        }
    return checkpoints


def write_results(results: dict[str, Any], directory: Path) -> None:
    """latest.json, verify_cost.json, speculation.{json,md} (the run's speculation in `make bench-speculation`'s
    form, so that the page's speculation section is this run's too), latest.md and the charts (the benchmarks page:
    ``report.py``), into `directory`."""
    from report import write_report

    directory.mkdir(parents=True, exist_ok=True)
    for rows in results["speculation"].values():
        for row in rows.values():
            row.pop("tokens", None)
    (directory / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
    (directory / "verify_cost.json").write_text(json.dumps(results["verify_cost"], indent=2) + "\n")
    write_speculation(speculation_results(results), directory / "speculation")
    write_report(results, directory)


def speculation_results(results: dict[str, Any]) -> dict[str, Any]:
    """A `make bench` run's speculation figures as `benchmarks/speculation.py` writes them."""
    return {
        "date": results["date"],
        "model": results.get("model"),
        "draft_model": results.get("draft_model"),
        "threads": results["threads"],
        "tokens": SPECULATION_TOKENS,
        "rounds": results["runs"],
        "prompts": results["speculation"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-peers", action="store_true", help="no llama-cpp-python or llama-bench")
    add_model_options(parser, draft="adds the draft and draft adaptive contenders (default: SmolLM2's own draft)")
    args = parser.parse_args()
    path = resolve(args.model)
    model = Model(path)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "model": path.name,
        "draft_model": args.draft_model and resolve(args.draft_model).name,
        "threads": args.threads,
        "runs": args.runs,
        "native_info": native_info(),
    }
    speeds = speed_figures(model, path, args)
    checkpoint_peer = speeds.pop("checkpoint_peer")
    results.update(speeds)
    if checkpoint_peer:
        results["llama_cpp_python_version"] = checkpoint_peer["version"]
    log("verify cost: batches of 1-16 rows, interleaved")
    peer = None if args.skip_peers else peer_python()
    results["verify_cost"] = verify_cost(threads=args.threads, model=args.model, peer=peer)
    log("checkpoints")
    results["checkpoints"] = checkpoint_results(model, args, checkpoint_peer)
    log("memory")
    results["memory"] = memory_figures(path, args.threads)
    log("validators")
    results["validators"] = validator_rates()
    directory = results_dir(args.model, args.draft_model)
    write_results(results, directory)
    print((directory / "latest.md").read_text())


if __name__ == "__main__":
    main()
