#!/usr/bin/env bash
# The device check of the CUDA wheel, one prepared script for a machine with an NVIDIA GPU and no network and no Rust:
# installs the CUDA wheel offline into a fresh virtual environment, prints native_info(), and runs
# scripts/gpu_check.py (exactness and resume of every mode on the GPU, a GPU checkpoint restored on the GPU and on
# the CPU, decode tokens/s, the cost of verifying 1-16 rows, none against ngram and draft), which writes ONE JSON.
#
#   scripts/gpu-check.sh [--dry-run] [--wheels DIR] [--json PATH]
#
#   --wheels DIR  the specstate wheel (exactly one) and the small wheels the check needs, made here by
#                 `make gpu-check-wheels` (default: dist-gpu-check). Installed with --no-index --find-links.
#   --json PATH   where the results go (default: $OUT/gpu-check.json when OUT is set, else gpu-check.json).
#   --dry-run     the same steps on the CPU with small sizes (also chosen when nvidia-smi finds no GPU).
#
# libcublas.so.13: the wheel's `cuda` extra (nvidia-cublas) is installed when its wheel is in DIR; otherwise it comes
# from the machine's CUDA toolkit or PyTorch's nvidia wheels (LD_LIBRARY_PATH, which the loader searches before the
# extension's RUNPATH).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dry=0
wheels=$root/dist-gpu-check
json=${OUT:+$OUT/gpu-check.json}
json=${json:-$root/gpu-check.json}
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) dry=1 ;;
        --wheels) wheels=$(cd "$2" && pwd); shift ;;
        --json) json=$(realpath -m "$2"); shift ;;  # the check runs in a scratch directory
        *) echo "usage: $0 [--dry-run] [--wheels DIR] [--json PATH]" >&2; exit 2 ;;
    esac
    shift
done
if [ $dry = 0 ] && ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "gpu-check: no NVIDIA GPU found (nvidia-smi); running the dry run on the CPU"
    dry=1
fi
[ $dry = 0 ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

shopt -s nullglob
specstate_wheels=("$wheels"/specstate-*.whl)
if [ ${#specstate_wheels[@]} != 1 ]; then
    echo "gpu-check: $wheels must hold exactly one specstate wheel (make wheel-cuda gpu-check-wheels)" >&2
    exit 2
fi
wheel=${specstate_wheels[0]}
extra=""
cublas_wheels=("$wheels"/nvidia_cublas-*.whl)
[ ${#cublas_wheels[@]} -gt 0 ] && extra="[cuda]"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# python3 may itself be a virtual environment's (the GPU machine's python3 is PyTorch's): its own site-packages
# (numpy, PyTorch's nvidia wheels) are what the check uses beside the wheels it installs.
machine_sites=$(python3 -c 'import site; print("\n".join(site.getsitepackages()))')
install_in_venv() {
    python3 -m venv --system-site-packages "$work/venv" || return 1
    # --system-site-packages reaches only the base interpreter's packages: a .pth file adds python3's own after the
    # venv's.
    venv_site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$machine_sites" > "$venv_site/machine-site-packages.pth"
    "$work/venv/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$wheels" \
        "specstate$extra @ file://$wheel" gguf numpy
}
if install_in_venv; then
    python=$work/venv/bin/python
else
    # No ensurepip (a Debian python without python3-venv), or a package the wheels lack: the specstate and gguf
    # wheels go into a folder of their own, on PYTHONPATH, and what they need beyond them comes from python3's.
    echo "gpu-check: no virtual environment; installing the wheels with pip --target"
    python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --target "$work/site" \
        "$wheel" "$wheels"/gguf-*.whl
    export PYTHONPATH=$work/site
    python=python3
fi

if [ -z "$extra" ]; then
    # libcublas.so.13 from the machine: a CUDA toolkit, or PyTorch's nvidia wheels.
    cublas=""
    for dir in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-13*; do
        for lib in "$dir"/lib64 "$dir"/lib "$dir"/targets/x86_64-linux/lib; do
            [ -e "$lib/libcublas.so.13" ] && cublas=${cublas:-$lib}
        done
    done
    if [ -z "$cublas" ]; then
        # shellcheck disable=SC2086  # one folder per line
        found=$(find $machine_sites /usr/lib /usr/local/lib -name libcublas.so.13 2>/dev/null | head -1 || true)
        [ -n "$found" ] && cublas=$(dirname "$found")
    fi
    [ -n "$cublas" ] && export LD_LIBRARY_PATH=$cublas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "gpu-check: libcublas.so.13 from ${cublas:-the default loader search}"
fi

mkdir -p "$(dirname "$json")"
# The tests' model builders (python/specstate_testkit, not in the wheel) on their own path entry: python/ itself
# would put the source tree's specstate before the installed wheel.
mkdir -p "$work/testkit" && cp -r "$root/python/specstate_testkit" "$work/testkit/"
cd "$work"  # import the installed wheel, not the source tree
"$python" -c 'import json, specstate; print(json.dumps(specstate.native_info(), indent=1))'
args=(--json "$json" --gpu-layers -1 --threads "$(nproc)")
[ $dry = 1 ] && args+=(--dry-run --threads 1)
PYTHONPATH="$work/testkit${PYTHONPATH:+:$PYTHONPATH}" timeout 480 "$python" "$root/scripts/gpu_check.py" "${args[@]}"
