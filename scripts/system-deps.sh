#!/usr/bin/env bash
# Ensure the system packages that the native build needs and PyPI cannot give:
# libclang (bindgen in llama-cpp-sys-4), a C and a C++ compiler, make and patch.
# As root, missing ones are installed with apt-get; otherwise one clear message
# names them and the script fails.
set -euo pipefail

missing=()
have_libclang() {
    [ -n "${LIBCLANG_PATH:-}" ] && ls "$LIBCLANG_PATH"/libclang*.so* >/dev/null 2>&1 && return 0
    ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so' && return 0
    ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/*/libclang*.so* >/dev/null 2>&1
}
have_libclang || missing+=(libclang-dev)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v patch >/dev/null 2>&1 || missing+=(patch)

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: installing ${missing[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    exit 0
fi
echo "system-deps: the native build needs these system packages: ${missing[*]} (Debian/Ubuntu names); install them, e.g. 'sudo apt-get install ${missing[*]}', and run again" >&2
exit 1
