#!/usr/bin/env bash
# Ensure the system packages that the native build needs and PyPI cannot give:
# libclang (bindgen in llama-cpp-sys-4), a C and a C++ compiler, make and patch.
# As root, missing ones are installed with apt-get; otherwise one clear message
# names them and the script fails.
#
#   scripts/system-deps.sh           check, and install what is missing (as root)
#   scripts/system-deps.sh --check   only print the missing Debian packages, one per line
#
# libclang is detected exactly as bindgen's loader (clang-sys) looks for it:
# a file named libclang.so, libclang-<version>.so, libclang.so.<n> or
# libclang-<version>.so.<n> in LIBCLANG_PATH, LD_LIBRARY_PATH, the loader's
# cache or the usual library directories. `libclang-cpp*` (the C++ interface
# library of package libclang-cppNN) is not what bindgen loads and never counts.
# SYSTEM_DEPS_LIB_DIRS (colon-separated) replaces the directories searched; the
# tests use it to run the detection against fake library directories.
set -euo pipefail

is_bindgen_libclang() {
    [[ "$1" =~ ^libclang(-[0-9][0-9.]*)?\.so(\.[0-9][0-9.]*)?$ ]]
}

libclang_search_dirs() {
    if [ -n "${SYSTEM_DEPS_LIB_DIRS+x}" ]; then
        tr ':' '\n' <<<"$SYSTEM_DEPS_LIB_DIRS"
        return
    fi
    [ -n "${LIBCLANG_PATH:-}" ] && echo "$LIBCLANG_PATH"
    [ -n "${LD_LIBRARY_PATH:-}" ] && tr ':' '\n' <<<"$LD_LIBRARY_PATH"
    { ldconfig -p 2>/dev/null || true; } | awk -F' => ' 'NF == 2 {print $2}' | xargs -r -n1 dirname
    ls -d /usr/lib/llvm-*/lib /usr/lib /usr/lib/* /usr/lib64 /usr/local/lib /usr/local/lib64 2>/dev/null
}

have_libclang() {
    local dir file
    while IFS= read -r dir; do
        [ -n "$dir" ] && [ -d "$dir" ] || continue
        for file in "$dir"/libclang*.so*; do
            # -e follows symlinks: a dangling link or a hidden file does not count.
            [ -e "$file" ] && [ ! -d "$file" ] || continue
            is_bindgen_libclang "$(basename "$file")" && return 0
        done
    done < <(libclang_search_dirs | awk '!seen[$0]++')
    return 1
}

missing=()
have_libclang || missing+=(libclang-dev)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v patch >/dev/null 2>&1 || missing+=(patch)

if [ "${1:-}" = "--check" ]; then
    [ ${#missing[@]} -eq 0 ] || printf '%s\n' "${missing[@]}"
    exit 0
fi
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: installing ${missing[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [[ " ${missing[*]} " == *" libclang-dev "* ]] && ! have_libclang; then
        # Installed, yet its files are gone: reinstall the packages that own them.
        owners=$(dpkg -S 'libclang-*.so*' 2>/dev/null | grep -v 'libclang-cpp' | cut -d: -f1 | sort -u | tr '\n' ' ')
        echo "system-deps: libclang is installed but missing; reinstalling ${owners:-libclang-dev}" >&2
        # shellcheck disable=SC2086
        # What counts is the library being back, checked below: apt may still
        # fail afterwards in a trigger (ldconfig) that has nothing to do with it.
        apt-get install -y -qq --reinstall --no-install-recommends ${owners:-libclang-dev} >/dev/null \
            || echo "system-deps: apt-get reported an error while reinstalling; checking for libclang again" >&2
    fi
    if [[ " ${missing[*]} " == *" libclang-dev "* ]] && ! have_libclang; then
        echo "system-deps: no libclang.so found after installing libclang-dev; set LIBCLANG_PATH" >&2
        exit 1
    fi
    exit 0
fi
echo "system-deps: the native build needs these system packages: ${missing[*]} (Debian/Ubuntu names); install them, e.g. 'sudo apt-get install ${missing[*]}', and run again" >&2
exit 1
