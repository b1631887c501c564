#!/usr/bin/env bash
# Build the divergence tool against the pinned llama.cpp (llama-cpp-sys-4 0.11.0's copy, with the
# crate's own patches), for x86-64-v3 (AVX, AVX2, FMA, F16C, BMI2; no AVX-512), as specstate ships.
# Everything is built in WORK (default /tmp/specstate-divergence), never in this repository.
#
#   benchmarks/divergence/build.sh                 # stock kernels      -> WORK/divergence-stock
#   benchmarks/divergence/build.sh --exact         # + docs/verification-exact.patch-draft
#                                                  #                    -> WORK/divergence-exact
# Needs cmake and ninja (pip install cmake ninja, or the project's .venv) and a C++17 compiler.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
variant=stock
if [[ "${1:-}" == "--exact" ]]; then variant=exact; fi
work="${WORK:-/tmp/specstate-divergence}"
crate="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/llama-cpp-sys-4-0.11.0 | head -1)"
src="$work/llama.cpp-$variant"
jobs="${JOBS:-2}"
export PATH="$repo/.venv/bin:$PATH"

if [[ ! -f "$src/.prepared" ]]; then
    rm -rf "$src"
    mkdir -p "$work"
    cp -r "$crate/llama.cpp" "$src"
    for p in "$crate"/patches/*.patch; do patch -d "$src" -p1 -s < "$p"; done
    if [[ "$variant" == exact ]]; then
        patch -d "$src" -p1 < "$repo/docs/verification-exact.patch-draft"
    fi
    touch "$src/.prepared"
fi

cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_APP=OFF > /dev/null
nice -n 10 ninja -C "$src/build" -j "$jobs" llama

b="$src/build"
"${CXX:-g++}" -O2 -std=c++17 "$here/divergence.cpp" -I"$src/include" -I"$src/ggml/include" \
    "$b/src/libllama.a" "$b/ggml/src/libggml.a" "$b/ggml/src/libggml-cpu.a" "$b/ggml/src/libggml-base.a" \
    -lpthread -ldl -lm -o "$work/divergence-$variant"
echo "$work/divergence-$variant"
