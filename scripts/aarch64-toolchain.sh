#!/usr/bin/env bash
# The Rust compiler and standard libraries for the aarch64 wheel (`make wheel-aarch64`), from Debian's packages.
# rustup's servers are not reachable here, and a standard library for aarch64-unknown-linux-gnu must come from the
# same build as its compiler. Debian 12's security archive carries rustc-web (a current rustc, kept for the browser
# builds) and its libstd-rust-web-dev for every architecture: the amd64 compiler, its x86-64 standard library
# (build scripts, proc macros), the arm64 standard library and the libLLVM the compiler loads are unpacked, not
# installed, into DIR, with a `rustc` wrapper that points the compiler at them. Prints the wrapper's path.
#
#   scripts/aarch64-toolchain.sh [DIR]    default ~/.cache/specstate/rust-web
#
# The first run needs root: it adds arm64 as a foreign architecture (dpkg --add-architecture arm64; apt-get
# update) so that apt verifies the arm64 packages as it verifies the others.
set -euo pipefail
dir=${1:-$HOME/.cache/specstate/rust-web}
if [ -x "$dir/rustc" ] && [ -d "$("$dir/rustc" --print target-libdir --target aarch64-unknown-linux-gnu 2>/dev/null)" ]; then
    echo "$dir/rustc"
    exit 0
fi
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
    apt-get update -q >&2
fi
version=$(apt-cache policy rustc-web | sed -n 's/^  Candidate: //p')
[ -n "$version" ] && [ "$version" != "(none)" ] || {
    echo "aarch64-toolchain: no rustc-web package (Debian 12's security archive has it)" >&2
    exit 1
}
release=${version%%+*}        # 1.96.0+dfsg1-1~deb12u2 -> 1.96.0
series=${release%.*}          # -> 1.96, in the name of the shared standard library's package
llvm=$(apt-cache depends "libstd-rust-web-$series=$version" | sed -n 's/^  Depends: \(libllvm[0-9]*\)$/\1/p')
debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
(cd "$debs" && apt-get download -q "rustc-web=$version" "libstd-rust-web-$series=$version" \
    "libstd-rust-web-dev=$version" "libstd-rust-web-$series:arm64=$version" "libstd-rust-web-dev:arm64=$version" \
    "$llvm" >&2)
rm -rf "$dir.partial"
mkdir -p "$dir.partial"
for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$dir.partial"; done
cat >"$dir.partial/rustc" <<EOF
#!/bin/sh
# rustc $version from Debian's rustc-web, unpacked beside this file (scripts/aarch64-toolchain.sh).
export LD_LIBRARY_PATH=$dir/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
exec $dir/usr/bin/rustc --sysroot $dir/usr "\$@"
EOF
chmod +x "$dir.partial/rustc"
rm -rf "$dir"
mv "$dir.partial" "$dir"
"$dir/rustc" --version >&2
echo "$dir/rustc"
