"""Check what a Linux wheel's shared objects ask of the system against the wheel's own manylinux tag.

    python scripts/wheel_glibc.py dist-cuda/specstate-*.whl

For each ELF file in the wheel: the libraries it needs (DT_NEEDED) and the newest symbol version it needs from
glibc. Fails when a glibc version is newer than the tag allows, when libstdc++ is needed (the zig builds link
libc++ in), or when a library is needed that neither the manylinux policy nor the wheel's own dependencies
provide. `auditwheel show` checks the same for the CPU wheels; the CUDA wheel needs libcublas from the
`nvidia-cublas` wheel (the extra `cuda`), which auditwheel counts as outside every policy.
"""

from __future__ import annotations

import io
import re
import sys
import zipfile
from pathlib import Path

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

# The libraries every manylinux policy allows (PEP 600: the glibc family and libgcc_s).
SYSTEM_LIBRARIES = re.compile(r"^(libc|libm|libpthread|libdl|librt|libgcc_s|ld-linux-x86-64|ld-linux-aarch64)\.so")
# What the `cuda` extra's wheels provide (found through the extension's RPATH).
CUDA_EXTRA_LIBRARIES = re.compile(r"^libcublas(Lt)?\.so\.\d+$")
TAG = re.compile(r"manylinux_(\d+)_(\d+)_")


def needs(elf: ELFFile) -> tuple[list[str], dict[str, list[str]]]:
    """The DT_NEEDED libraries and, per library, the symbol versions needed from it."""
    libraries: list[str] = []
    versions: dict[str, list[str]] = {}
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            libraries += [tag.needed for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]
        if isinstance(section, GNUVerNeedSection):
            for need, auxiliaries in section.iter_versions():
                versions[need.name] = [aux.name for aux in auxiliaries]
    return libraries, versions


def version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split("_", 1)[1].split("."))


def check_object(name: str, data: bytes, allowed: tuple[int, int]) -> list[str]:
    """Print what one shared object needs; return the problems."""
    libraries, versions = needs(ELFFile(io.BytesIO(data)))
    glibc = sorted((v for names in versions.values() for v in names if v.startswith("GLIBC_")), key=version_key)
    newest = glibc[-1] if glibc else "none"
    print(f"{name}: needs {', '.join(libraries)}; newest glibc symbol version {newest}")
    problems = [f"{name}: {v} is newer than glibc {allowed[0]}.{allowed[1]}" for v in glibc if version_key(v) > allowed]
    problems += [f"{name}: needs libstdc++ ({lib})" for lib in libraries if lib.startswith("libstdc++")]
    problems += [
        f"{name}: needs {lib}, which neither manylinux nor the wheel's dependencies provide"
        for lib in libraries
        if not (SYSTEM_LIBRARIES.match(lib) or CUDA_EXTRA_LIBRARIES.match(lib) or lib.startswith("libstdc++"))
    ]
    return problems


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    wheel = Path(sys.argv[1])
    tag = TAG.search(wheel.name)
    if tag is None:
        sys.exit(f"{wheel.name}: no manylinux_X_Y tag in the file name")
    allowed = (int(tag.group(1)), int(tag.group(2)))
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            data = archive.read(member)
            if data[:4] == b"\x7fELF":
                problems += check_object(member, data, allowed)
    if problems:
        sys.exit("FAILED:\n" + "\n".join(problems))
    print(f"ok: {wheel.name} needs nothing newer than glibc {allowed[0]}.{allowed[1]}")


if __name__ == "__main__":
    main()
