"""The benchmark suite of specstate (``make bench``), side by side with its peers.

Peers, built here from their registries: llama-cpp-python (PyPI, compiled from
its sdist into the benchmark's own virtual environment with the same
x86-64-v3 kernel flags as specstate) and llama.cpp's own ``llama-bench``
(built with cmake from the llama.cpp source inside the pinned
llama-cpp-sys-4 crate), plus specstate's native Rust loop with no Python in
it (``benchmarks/native_decode.rs``). Model: SmolLM2-135M-Instruct Q4_1;
2 threads; medians of 5 runs after a warm-up; every ratio is measured in this
one run.

Writes benchmarks/results/latest.json, latest.md and PNG charts.
Usage: python benchmarks/run.py [--runs 5] [--threads 2] [--skip-peers]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "tests"))

from specstate import Model, native_info  # noqa: E402
from specstate.bench import (  # noqa: E402
    CODE_PROMPT,
    QUOTE_PROMPT,
    STORY_PROMPT,
    checkpoint_figures,
    decode_speed,
    speculation_figures,
    validator_rates,
)
from specstate.smollm2 import cache_dir, smollm2_path  # noqa: E402

PEER_VENV = Path(os.environ.get("SPECSTATE_BENCH_VENV", Path.home() / ".cache" / "specstate-bench-venv"))
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
KERNEL_FLAGS = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
]
TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache" / "specstate-target"))


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def peer_python() -> Path:
    """The bench venv's python, with llama-cpp-python built from its sdist (once)."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    probe = subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode != 0:
        log(f"building {LLAMA_CPP_PYTHON} from its sdist (several minutes on 2 cores)")
        env = dict(os.environ, CMAKE_ARGS=" ".join(KERNEL_FLAGS))
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-binary",
                "llama-cpp-python",
                LLAMA_CPP_PYTHON,
                "numpy",
                "matplotlib",
            ],
            check=True,
            env=env,
        )
    return python


def llama_cpp_source() -> Path:
    """The llama.cpp source inside the pinned crate (fetched by cargo)."""
    version = native_info()["llama_cpp_sys_version"]
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    found = glob.glob(str(home / "registry" / "src" / "*" / f"llama-cpp-sys-4-{version}" / "llama.cpp"))
    if not found:
        subprocess.run(["cargo", "fetch"], cwd=ROOT, check=True)
        found = glob.glob(str(home / "registry" / "src" / "*" / f"llama-cpp-sys-4-{version}" / "llama.cpp"))
    return Path(found[0])


def llama_bench() -> Path:
    """llama.cpp's llama-bench, built with cmake from the pinned crate's source (once)."""
    build = Path.home() / ".cache" / "specstate-bench" / "llama-bench-build"
    binary = build / "bin" / "llama-bench"
    if binary.exists():
        return binary
    log("building llama-bench with cmake (several minutes on 2 cores)")
    subprocess.run(
        [
            "cmake",
            "-S",
            str(llama_cpp_source()),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            *KERNEL_FLAGS,
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DBUILD_SHARED_LIBS=OFF",
        ],
        check=True,
    )
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench", "-j", "2"], check=True)
    return binary


def native_loop(model: Path, threads: int, runs: int) -> float:
    """specstate's native Rust decode loop (no Python), tokens/s."""
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "native_decode"], cwd=ROOT, check=True)
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


def llama_bench_decode(model: Path, threads: int, runs: int) -> float:
    out = subprocess.run(
        [
            str(llama_bench()),
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


def peer_figures(model: Path, threads: int, runs: int, checkpoint_text: str) -> dict[str, Any]:
    request = {
        "model": str(model),
        "threads": threads,
        "runs": runs,
        "decode_prompt": STORY_PROMPT,
        "decode_tokens": 128,
        "speculation": {"code": CODE_PROMPT, "quotes": QUOTE_PROMPT},
        "speculation_tokens": 160,
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


def memory_figures(model: Path, threads: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_worker.py"), str(model), "2048", "128", str(threads)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    kv_bytes_per_token = 23_040  # SmolLM2: 30 layers x 3 KV heads x 64 x (K + V) x f16
    figures["model_file"] = model.stat().st_size
    figures["kv_cache"] = kv_bytes_per_token * figures["n_ctx"]
    figures["over_model_and_kv"] = figures["generation_peak_rss"] - figures["model_file"] - figures["kv_cache"]
    figures["capture_extra"] = figures["capture_peak_rss"] - figures["capture_rss_before"]
    figures["capture_extra_ratio"] = figures["capture_extra"] / figures["checkpoint_size"]
    return figures


def draft_model_path(model: Path) -> Path:
    from smollm2_draft import build_smollm2_draft

    path = cache_dir() / "smollm2-draft-4-layers.gguf"
    return path if path.exists() else build_smollm2_draft(model, path, n_layers=4)


def agreement(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-peers", action="store_true", help="no llama-cpp-python or llama-bench")
    args = parser.parse_args()
    path = smollm2_path()
    model = Model(path)
    checkpoint_text = (CODE_PROMPT + " ") * 25
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "model": path.name,
        "threads": args.threads,
        "runs": args.runs,
        "native_info": native_info(),
    }
    log("plain decoding")
    decode: dict[str, float] = {"specstate": decode_speed(model, threads=args.threads, runs=args.runs)}
    decode["native_loop"] = native_loop(path, args.threads, args.runs)
    peers: dict[str, Any] = {}
    if not args.skip_peers:
        decode["llama_bench"] = llama_bench_decode(path, args.threads, args.runs)
        log("llama-cpp-python")
        peers = peer_figures(path, args.threads, args.runs, checkpoint_text)
        decode["llama_cpp_python"] = peers["decode_tokens_per_s"]
        results["llama_cpp_python_version"] = peers["version"]
    results["decode"] = decode

    log("speculation")
    draft = Model(draft_model_path(path))
    speculation: dict[str, Any] = {}
    for name, prompt in (("code", CODE_PROMPT), ("quotes", QUOTE_PROMPT)):
        rows: dict[str, Any] = {}
        for mode in ("none", "ngram", "draft"):
            figures = speculation_figures(
                model,
                mode,
                prompt,
                threads=args.threads,
                runs=args.runs,  # type: ignore[arg-type]
                draft_model=draft if mode == "draft" else None,
            )
            rows[mode] = {
                "tokens_per_s": figures.tokens_per_second,
                "acceptance": figures.acceptance_rate,
                "tokens": figures.tokens,
            }
        for mode in ("ngram", "draft"):
            rows[mode]["agreement_with_none"] = agreement(rows[mode]["tokens"], rows["none"]["tokens"])
        peer = peers.get("speculation", {}).get(name, {})
        for label in ("plain", "prompt_lookup"):
            if label in peer:
                rows[f"llama_cpp_python_{label}"] = peer[label]
        if "tokens" in peer.get("prompt_lookup", {}) and "tokens" in peer.get("plain", {}):
            rows["llama_cpp_python_prompt_lookup"]["agreement_with_plain"] = agreement(
                peer["prompt_lookup"]["tokens"], peer["plain"]["tokens"]
            )
        speculation[name] = rows
    results["speculation"] = speculation

    log("checkpoints")
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
            "llama_cpp_python": peers.get("checkpoints", {}).get(str(tokens)),
        }
    results["checkpoints"] = checkpoints
    log("memory")
    results["memory"] = memory_figures(path, args.threads)
    log("validators")
    results["validators"] = validator_rates()
    RESULTS.mkdir(parents=True, exist_ok=True)
    for rows in results["speculation"].values():
        for row in rows.values():
            row.pop("tokens", None)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
    from report import write_report

    write_report(results, RESULTS)
    print((RESULTS / "latest.md").read_text())


if __name__ == "__main__":
    main()
