#!/usr/bin/env bash
# `make asan`: the Python suite against a build whose C and C++ code (llama.cpp,
# ggml and the llama-cpp-sys-4 shims) is compiled with AddressSanitizer.
#
# The instrumented extension is built by maturin into its own Cargo target
# directory and its own virtual environment (.venv-asan), so the normal build
# is untouched. Python itself is not instrumented: the ASan runtime is
# preloaded, and leak detection is off (the interpreter's own allocations at
# exit would drown it; leaks are measured by benchmarks/lifecycle_memory.py).
# Any ASan report aborts the process, which fails the test that caused it.
#
#   scripts/asan.sh [PYTEST ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${ASAN_VENV:-.venv-asan}
export CARGO_TARGET_DIR=${ASAN_TARGET_DIR:-$HOME/.cache/specstate-target-asan}
sanitize="-fsanitize=address -fno-omit-frame-pointer -g1"
baseline="-march=x86-64-v3 -mtune=generic"
export CFLAGS_x86_64_unknown_linux_gnu="$baseline $sanitize"
export CXXFLAGS_x86_64_unknown_linux_gnu="$baseline $sanitize"

if [ ! -f "$VENV/.installed" ] || [ requirements-dev.txt -nt "$VENV/.installed" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r requirements-dev.txt
    touch "$VENV/.installed"
fi
# A wheel installed into the ASan environment (not `maturin develop`, whose
# editable install would put the instrumented library into python/specstate,
# where the normal environment would load it too).
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/maturin" build --release --quiet --interpreter "$VENV/bin/python" --out "$wheels"
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/specstate-*.whl

libasan=$(${CC:-cc} -print-file-name=libasan.so)
[ -f "$libasan" ] || { echo "asan: libasan.so not found (install gcc's libasan)" >&2; exit 1; }
# libstdc++ is preloaded too: Python does not link it, and ASan's __cxa_throw
# interceptor must find the real one at start-up, or the first C++ exception
# (llama.cpp throws and catches its own) aborts the process.
libstdcxx=$(${CXX:-c++} -print-file-name=libstdc++.so.6)
instrumented=$(nm -D "$VENV"/lib/python3*/site-packages/specstate/_native*.so | grep -c __asan_report || true)
[ "$instrumented" -gt 0 ] || { echo "asan: the extension is not instrumented" >&2; exit 1; }
echo "asan: running the suite with $libasan preloaded" >&2
LD_PRELOAD="$libasan $libstdcxx" \
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=0:allocator_may_return_null=1" \
HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} \
    "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
