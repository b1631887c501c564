#!/usr/bin/env bash
# Install a specstate wheel (CPU, or CUDA with its `cuda` extra) on an older Linux and run it there: a Debian
# bullseye root file system (glibc 2.31, Python 3.9, pip 20.3), made once with debootstrap from Debian's mirror and
# cached outside the clone, entered with unshare (private mounts and PIDs) and chroot. There, with that system's own
# python3: a virtual environment, `pip install` of the wheel and of the dependencies it declares (downloaded here
# first, for Python 3.9: the old system needs no network), `ldd` of the extension, then scripts/old_glibc_check.py:
# import, native_info(), generate on SmolLM2, checkpoint half-way and resume (API and CLI), `specstate inspect`.
#
#   scripts/check-old-glibc.sh [WHEEL]    default: the newest dist/specstate-*x86_64.whl (`make wheel`)
#   OLD_ARCH=arm64 scripts/check-old-glibc.sh [WHEEL]    an aarch64 wheel (`make wheel-aarch64`) under qemu-user
#
# Needs root (debootstrap, chroot, mounts) on an x86-64 Debian or Ubuntu host; installs debootstrap (and for arm64
# qemu-user-static, registered with binfmt_misc) with apt-get when missing. OLD_ROOT: the root file system (default
# ~/.cache/specstate/bullseye-root, or bullseye-arm64-root); DEBIAN_MIRROR; SPECSTATE_SMOLLM2: the model file
# (default: fetched once into ~/.cache/specstate, as for the tests).
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bullseye
ARCH=${OLD_ARCH:-amd64}
case $ARCH in
amd64) ROOT=${OLD_ROOT:-$HOME/.cache/specstate/$SUITE-root} MACHINE=x86_64 ;;
arm64) ROOT=${OLD_ROOT:-$HOME/.cache/specstate/$SUITE-arm64-root} MACHINE=aarch64 ;;
*) echo "check-old-glibc: OLD_ARCH is amd64 or arm64, not $ARCH" >&2 && exit 1 ;;
esac
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ -x .venv/bin/python ]; then PYTHON=${PYTHON:-.venv/bin/python}; else PYTHON=${PYTHON:-python3}; fi

die() {
    echo "check-old-glibc: $*" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mounts)"
wheel=${1:-$(ls -t dist/specstate-*"$MACHINE".whl 2>/dev/null | head -1 || true)}
[ -f "$wheel" ] || die "no $MACHINE wheel: give its path, or run 'make wheel' first"
model=${SPECSTATE_SMOLLM2:-$("$PYTHON" -c \
    "import runpy; print(runpy.run_path('python/specstate/smollm2.py')['smollm2_path']())")}
[ -f "$model" ] || die "no model file at $model"

need() { # COMMAND PACKAGE: install PACKAGE when COMMAND is missing
    command -v "$1" >/dev/null || apt-get install -y -q "$2" || { apt-get update -q && apt-get install -y -q "$2"; }
}
if [ "$ARCH" = arm64 ] && [ "$(uname -m)" != aarch64 ]; then
    # aarch64 programs run through qemu-user, registered with binfmt_misc ("F": usable inside the chroot).
    need qemu-aarch64-static qemu-user-static
    need update-binfmts binfmt-support
    [ -e /proc/sys/fs/binfmt_misc/status ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
fi

# The old system, made once (a partial one from an interrupted run is made again).
if [ ! -f "$ROOT/.specstate-root-ready" ]; then
    need debootstrap debootstrap
    rm -rf "$ROOT.partial"
    mkdir -p "$(dirname "$ROOT")"
    echo "check-old-glibc: debootstrap $SUITE $ARCH into $ROOT (a few minutes, once)"
    debootstrap --arch="$ARCH" --variant=minbase --include=python3,python3-venv "$SUITE" "$ROOT.partial" "$MIRROR" \
        >"$ROOT.log" 2>&1 ||
        die "debootstrap failed; see $ROOT.log"
    touch "$ROOT.partial/.specstate-root-ready"
    rm -rf "$ROOT"
    mv "$ROOT.partial" "$ROOT"
fi

# What the old system gets: the wheel, its dependencies as the old pip will resolve them, the check, the model
# (bind-mounted read-only, not copied).
work=$ROOT/opt/specstate-check
rm -rf "$work"
mkdir -p "$work/wheels"
cp "$wheel" "$work/wheels/"
platforms=()
for minor in $(seq 17 31); do platforms+=(--platform "manylinux_2_${minor}_$MACHINE"); done # what bullseye's pip takes
# A CUDA wheel (`make wheel-cuda`) loads libcublas from the `cuda` extra's wheels: installed with it.
extras=
if "$PYTHON" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1])
sys.exit(not any(b"libcublas" in z.read(n) for n in z.namelist() if n.endswith(".so")))' "$wheel"; then
    extras="[cuda]"
fi
"$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version 3.9 \
    "${platforms[@]}" --dest "$work/wheels" "$wheel$extras"
cp scripts/old_glibc_check.py "$work/"
touch "$work/model.gguf"
echo "check-old-glibc: $(basename "$wheel") in $SUITE $ARCH ($ROOT)"

inside='
cd /opt/specstate-check
echo "$(ldd --version | head -1); $(python3 --version); $(python3 -m pip --version 2>/dev/null || echo pip in venv only)"
python3 -m venv venv
venv/bin/pip install --disable-pip-version-check --no-index --find-links wheels "specstate$1"
extension=$(ls venv/lib/python3*/site-packages/specstate/_native*.so)
ldd "$extension"
if ldd "$extension" | grep -q "not found"; then echo "FAILED: a library of the extension is missing"; exit 1; fi
venv/bin/python old_glibc_check.py /opt/specstate-check/model.gguf /opt/specstate-check
'
unshare --mount --pid --fork --propagation private /bin/sh -ec '
    mount --bind "$1" "$2/opt/specstate-check/model.gguf"
    mount -o remount,bind,ro "$2/opt/specstate-check/model.gguf"
    mount -t proc proc "$2/proc"
    exec chroot "$2" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 /bin/sh -ec "$3" sh "$4"
' sh "$model" "$ROOT" "$inside" "$extras"
echo "check-old-glibc: passed"
