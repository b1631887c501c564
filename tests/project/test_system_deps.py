"""`scripts/system-deps.sh --check` finds libclang exactly as bindgen's loader does.

The detection runs against fake library directories (``SYSTEM_DEPS_LIB_DIRS``),
so these tests need neither root nor libclang. Only the ``libclang-dev`` line
of the report is asserted: the other tools it checks are whatever this machine has.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "system-deps.sh"

# One fake library directory: (name, kind) entries, kind being "file", "link" (a symlink to a real
# file kept outside the searched directories), "dangling" (a symlink to nothing) or "dir".
Directory = list[tuple[str, str]]


def make_directory(path: Path, entries: Directory, elsewhere: Path) -> None:
    path.mkdir()
    for name, kind in entries:
        entry = path / name
        if kind == "file":
            entry.write_bytes(b"\x7fELF")
        elif kind == "link":
            real = elsewhere / f"real-{name}"
            real.write_bytes(b"\x7fELF")
            entry.symlink_to(real)
        elif kind == "dangling":
            entry.symlink_to(elsewhere / "missing")
        else:
            entry.mkdir()


def missing_packages(search_dirs: str) -> list[str]:
    """The packages `--check` reports missing, with the given library search path."""
    env = {**os.environ, "SYSTEM_DEPS_LIB_DIRS": search_dirs}
    result = subprocess.run(["bash", str(SCRIPT), "--check"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def case(found: bool, *directories: Directory, name: str) -> object:
    return pytest.param(list(directories), found, id=name)


@pytest.mark.parametrize(
    "directories,found",
    [
        case(True, [("libclang.so", "file")], name="libclang.so"),
        case(True, [("libclang-14.so", "file")], name="libclang-14.so"),
        case(True, [("libclang.so.1", "file")], name="libclang.so.1"),
        case(True, [("libclang-14.so.1", "file")], name="libclang-14.so.1"),
        case(True, [("libclang-14.0.6.so.14", "file")], name="libclang-14.0.6.so.14"),
        case(True, [("libclang.so", "link")], name="symlink-to-a-file"),
        case(False, [("libclang-cpp.so.14", "file")], name="libclang-cpp.so.14"),
        case(False, [("libclang-cpp.so", "file")], name="libclang-cpp.so"),
        case(False, [("libclang-cpp14.so", "file")], name="libclang-cpp14.so"),
        case(False, [("libclangBasic.a", "file")], name="libclangBasic.a"),
        case(False, [("libclang.so", "dangling")], name="dangling-symlink"),
        case(False, [("libclang.so", "dir")], name="directory-named-libclang.so"),
        case(False, [], name="empty-directory"),
        case(True, [("libclang-cpp.so.14", "file")], [("libclang-14.so.1", "file")], [], name="found-in-the-second"),
        case(False, [("libclang-cpp.so", "file")], [("libclangBasic.a", "file")], name="in-none-of-several"),
    ],
)
def test_libclang_detection(tmp_path: Path, directories: list[Directory], found: bool) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    paths = [tmp_path / f"lib{index}" for index in range(len(directories))]
    for path, entries in zip(paths, directories):
        make_directory(path, entries, elsewhere)
    reported = missing_packages(":".join(str(path) for path in paths))
    assert ("libclang-dev" in reported) == (not found), reported


def test_a_search_path_of_missing_directories_finds_nothing(tmp_path: Path) -> None:
    assert "libclang-dev" in missing_packages(f"{tmp_path / 'none'}:{tmp_path / 'neither'}")


def makefile_recipe(target: str) -> list[str]:
    """The commands of `target`'s rule in the Makefile, without their @, - and + prefixes."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"{target}:")))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().lstrip("@-+"))
    return recipe


def test_the_makefile_runs_this_script() -> None:
    assert makefile_recipe("system-deps") == ["scripts/system-deps.sh"]
    assert (ROOT / "scripts/system-deps.sh").resolve() == SCRIPT and os.access(SCRIPT, os.X_OK)
