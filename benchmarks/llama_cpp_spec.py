"""llama.cpp's own speculation, as peer rows for specstate's ``ngram`` and ``draft`` modes.

What it measures: greedy generation speed (tokens/s after the first generated
token, prefill excluded, as ``specstate.bench.speculation_figures`` measures
it), drafted and accepted token counts, and the tokens themselves, of
llama.cpp's ``common_speculative`` n-gram drafters (``ngram-simple`` by
default; ``ngram-map-k`` and ``ngram-cache`` on request), or of its draft-model
speculation (``draft-simple``), on the same models, prompts and thread count
as specstate.

Why a driver of our own (``benchmarks/llama_spec/main.cpp``): the llama.cpp
source inside the pinned llama-cpp-sys-4 crate ships neither ``examples/``
(where speculative-simple lives) nor the full server sources, so no stock
tool runs n-gram speculation. The driver is written against the public
``llama.h`` / ``common/speculative.h`` API and built here with cmake + ninja,
with the same x86-64-v3 kernel flags as the other peers in ``run.py``.

Usage: python benchmarks/llama_cpp_spec.py [--threads 2] [--n-draft 8] [--spec-type ngram-simple]
       [--kernels x86-64-v3|native]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DRIVER_SOURCE = ROOT / "benchmarks" / "llama_spec"
BENCH_CACHE = Path.home() / ".cache" / "specstate-bench"
# The kernel flags of every peer built here (llama-bench, llama-cpp-python, this driver): x86-64-v3, specstate's own.
KERNEL_FLAGS = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
]
#: AMX off in the native build: with it, ggml's AMX buffer type (repacked Q4_1 weights) crashes on any batch of
#: more than one row on the machines measured here (llama-bench pp64 and the n-gram driver's prompt: SIGSEGV in
#: ``ggml_backend_amx_mul_mat``), so no generation can run on it; its single-row decode is recorded in
#: ``llama-cpp-sys-4/README.md``.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
#: The kernel builds llama-bench and the n-gram driver are measured at: specstate's x86-64-v3 flags, and the peer at
#: its best on this CPU (``GGML_NATIVE``: ``-march=native``, so AVX-VNNI and AVX-512 wherever the CPU has them).
KERNEL_BUILDS = {
    "x86-64-v3": KERNEL_FLAGS,
    "native": ["-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"],
}
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-cache")


def llama_cpp_source() -> Path:
    """The llama.cpp source inside the pinned llama-cpp-sys-4 crate (fetched by cargo if missing)."""
    from specstate import native_info

    version = native_info()["llama_cpp_sys_version"]
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    pattern = str(home / "registry" / "src" / "*" / f"llama-cpp-sys-4-{version}" / "llama.cpp")
    found = glob.glob(pattern)
    if not found:
        subprocess.run(["cargo", "fetch"], cwd=ROOT, check=True)
        found = glob.glob(pattern)
    return Path(found[0])


def build_tool(name: str) -> str:
    """`cmake` or `ninja`: from PATH, else from this interpreter's virtual environment."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise FileNotFoundError(f"{name} not found (pip install {name})")
    return found


def build_dir(tool: str, kernels: str) -> Path:
    """Where `tool` is built for the kernel build `kernels` (a key of KERNEL_BUILDS)."""
    suffix = "" if kernels == "x86-64-v3" else f"-{kernels}"
    return BENCH_CACHE / f"{tool}-build{suffix}"


def configured_from(build: Path, source: Path) -> bool:
    """Whether `build` holds a configuration of `source` (a clone or worktree elsewhere configured it otherwise: its
    cache is dropped so that the next configure starts afresh; the objects stay for ninja to reuse)."""
    cache = build / "CMakeCache.txt"
    if not cache.exists():
        return False
    if f"CMAKE_HOME_DIRECTORY:INTERNAL={source}\n" in cache.read_text(encoding="utf-8", errors="replace"):
        return (build / "build.ninja").exists()
    cache.unlink()
    return False


def configure_command(source: Path, build: Path, kernels: str = "x86-64-v3") -> list[str]:
    """The cmake configure command of the driver, against the llama.cpp at `source`."""
    return [
        build_tool("cmake"),
        "-S",
        str(DRIVER_SOURCE),
        "-B",
        str(build),
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={build_tool('ninja')}",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DLLAMA_SRC={source}",
        *KERNEL_BUILDS[kernels],
    ]


#: The CMake options of every tool built from a whole llama.cpp tree here: the library and its tools, nothing that
#: needs the network, static (each binary carries its own llama.cpp).
TOOL_OPTIONS = [
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DBUILD_SHARED_LIBS=OFF",
]


def llama_cpp_tool(
    target: str,
    source: Path,
    build: Path,
    kernels: str = "x86-64-v3",
    options: tuple[str, ...] = (),
    refresh: bool = False,
) -> Path:
    """llama.cpp's tool `target` (``llama-bench``, ``llama-perplexity``), built with cmake from the tree at `source`
    into `build`: once, or with `refresh` configured again and rebuilt where its sources changed (the first build
    takes several minutes on 2 cores, a second tool of the same build seconds)."""
    binary = build / "bin" / target
    if binary.exists() and not refresh:
        return binary
    print(f"[bench] building {target} with cmake", file=sys.stderr, flush=True)
    if refresh or not (build / "build.ninja").exists():
        configure = [build_tool("cmake"), "-S", str(source), "-B", str(build), "-G", "Ninja"]
        configure += [f"-DCMAKE_MAKE_PROGRAM={build_tool('ninja')}", "-DCMAKE_BUILD_TYPE=Release"]
        subprocess.run([*configure, *KERNEL_BUILDS[kernels], *TOOL_OPTIONS, *options], check=True)
    subprocess.run([build_tool("cmake"), "--build", str(build), "--target", target, "-j", "2"], check=True)
    return binary


def llama_bench(kernels: str = "x86-64-v3") -> Path:
    """llama.cpp's llama-bench, built with cmake from the pinned crate's source, unpatched (once per kernel build)."""
    return llama_cpp_tool("llama-bench", llama_cpp_source(), build_dir("llama-bench", kernels), kernels)


#: llama-cpp-python's sdist (the version the benchmarks measure), whose ``vendor/llama.cpp`` is llama.cpp's whole
#: source tree, ``tools/server`` included: the pinned crate ships only a stub of it, and llama.cpp's repository is
#: too large to fetch here. Pinned by its SHA-256; unpacked into the bench cache, never into the repository.
PEER_SDIST = (
    "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
    "llama_cpp_python-0.3.36.tar.gz",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
)


def peer_llama_cpp_source() -> Path:
    """llama.cpp's source tree as vendored by llama-cpp-python's sdist (downloaded and checked once)."""
    import hashlib
    import tarfile
    import urllib.request

    cache = BENCH_CACHE / "peer-llama-cpp"
    source = cache / "llama.cpp"
    if (source / "tools" / "server" / "server.cpp").exists():
        return source
    url, digest = PEER_SDIST
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / "sdist.tar.gz"
    urllib.request.urlretrieve(url, archive)
    if hashlib.sha256(archive.read_bytes()).hexdigest() != digest:
        raise RuntimeError(f"{url} does not have the pinned SHA-256")
    prefix = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            if member.name.startswith(prefix):
                member.name = member.name[len(prefix) :]
                members.append(member)
        tar.extractall(source, members=members, filter="data")
    archive.unlink()
    return source


def llama_server() -> Path:
    """llama.cpp's llama-server (continuous batching, ``--parallel``), built with cmake from the peer's llama.cpp
    source with the same kernel flags as every peer, without its web UI (once)."""
    build = build_dir("llama-server", "x86-64-v3")
    binary = build / "bin" / "llama-server"
    if binary.exists():
        return binary
    print("[bench] building llama-server with cmake (several minutes on 2 cores)", file=sys.stderr, flush=True)
    options = ["-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
    options += ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_UI=OFF"]
    options += ["-DLLAMA_USE_PREBUILT_UI=OFF", "-DBUILD_SHARED_LIBS=OFF"]
    configure = ["cmake", "-S", str(peer_llama_cpp_source()), "-B", str(build), "-G", "Ninja"]
    configure += [f"-DCMAKE_MAKE_PROGRAM={build_tool('ninja')}", "-DCMAKE_BUILD_TYPE=Release", *KERNEL_FLAGS]
    subprocess.run([*configure, *options], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", "2"], check=True)
    return binary


def build_llama_spec(kernels: str = "x86-64-v3", jobs: int = 2) -> Path:
    """The driver binary for the kernel build `kernels`, configured once and (re)built with ninja when its sources
    changed."""
    build = build_dir("llama-spec", kernels)
    if not configured_from(build, DRIVER_SOURCE):
        print(f"[bench] building llama-spec ({kernels}) with cmake (10+ minutes)", file=sys.stderr, flush=True)
        subprocess.run(configure_command(llama_cpp_source(), build, kernels), check=True)
    subprocess.run(
        [build_tool("cmake"), "--build", str(build), "--target", "llama-spec", "-j", str(jobs)],
        check=True,
        capture_output=True,
    )
    return build / "bin" / "llama-spec"


def llama_cpp_ngram(
    binary: Path,
    model: Path,
    prompt_text: str,
    n_tokens: int,
    threads: int,
    n_draft: int,
    spec_type: str = "ngram-simple",
    sizes: tuple[int, int] | None = None,
    draft_model: Path | None = None,
) -> dict[str, Any]:
    """One greedy run of the driver: tokens/s (prefill excluded), drafted, accepted and the tokens.

    `sizes` (lookup n-gram, draft m-gram) overrides llama.cpp's defaults (12, 48) for ngram-simple and
    ngram-map-k; ngram-simple only drafts when the m-gram is at least as long as the n-gram. Drafts are
    cut to `n_draft` either way. With `draft_model`, llama.cpp's draft-model speculation (``draft-simple``)
    drafts with that model instead (`spec_type` and `sizes` are then ignored).
    """
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as handle:
        handle.write(prompt_text)
    try:
        command = [str(binary), str(model), handle.name, str(n_tokens), str(threads), str(n_draft)]
        if draft_model is None:
            command += [spec_type, *(str(size) for size in sizes or ())]
        else:
            command += ["draft-simple", str(draft_model)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(handle.name)
    figures = json.loads(out.strip().splitlines()[-1])
    return {key: figures[key] for key in ("tokens_per_s", "drafted", "accepted", "tokens")}


def main() -> None:
    """One run per benchmark prompt, printed as JSON lines (a quick check, not a benchmark)."""
    from specstate.bench import CODE_PROMPT, QUOTE_PROMPT, STORY_PROMPT
    from specstate.smollm2 import smollm2_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-draft", type=int, default=8)
    parser.add_argument("--n-tokens", type=int, default=160)
    parser.add_argument("--spec-type", choices=SPEC_TYPES, default="ngram-simple")
    parser.add_argument("--kernels", choices=tuple(KERNEL_BUILDS), default="x86-64-v3")
    args = parser.parse_args()
    binary = build_llama_spec(args.kernels)
    prompts = {"story": STORY_PROMPT, "code": CODE_PROMPT, "quotes": QUOTE_PROMPT}
    for name, prompt in prompts.items():
        figures = llama_cpp_ngram(
            binary, smollm2_path(), prompt, args.n_tokens, args.threads, args.n_draft, args.spec_type
        )
        rate = figures["accepted"] / figures["drafted"] if figures["drafted"] else 0.0
        summary = {k: figures[k] for k in ("tokens_per_s", "drafted", "accepted")}
        print(json.dumps({"prompt": name, **summary, "acceptance": round(rate, 3)}), flush=True)


if __name__ == "__main__":
    main()
