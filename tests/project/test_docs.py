"""The README and docs/*.md name only what exists: the repository's paths, the Makefile's targets, and
``specstate``'s modules and names."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "llama-cpp-sys-4" / "README.md"]
#: The repository's top-level folders: a reference that starts with one is a path of the repository.
TOP = ("python/", "src/", "tests/", "docs/", "benchmarks/", "scripts/", "llama-cpp-sys-4/", "examples/", "cmake/")
#: A span of code: `...`.
CODE = re.compile(r"`([^`\n]+)`")
#: ``specstate.X`` where X is one of these names a file (``specstate.cmake``) or a folder (auditwheel's
#: ``specstate.libs``), not a module.
FILE_SUFFIXES = {"cmake", "libs", "so", "toml"}
#: What a path reference may not hold (placeholders, globs, ranges).
PLACEHOLDER = re.compile(r"[*<>{}\s]|\.\.\.")


def _spans(page: Path) -> list[str]:
    text = page.read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
    return CODE.findall(text) + [line for block in blocks for line in block.splitlines()]


def _paths(page: Path) -> set[str]:
    found = set()
    for span in CODE.findall(page.read_text()):
        candidate = span.split("::")[0].split(":")[0].rstrip(".,;")
        if candidate.startswith(TOP) and not PLACEHOLDER.search(candidate):
            found.add(candidate)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_paths_a_page_names_exist(page: Path) -> None:
    missing = sorted(path for path in _paths(page) if not (ROOT / path).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def _targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", makefile, re.MULTILINE))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_make_targets_a_page_names_exist(page: Path) -> None:
    named = {target for span in _spans(page) for target in re.findall(r"\bmake ([a-z][a-z0-9-]*)", span)}
    missing = sorted(named - _targets())
    assert not missing, f"{page.name} names make targets that do not exist: {missing}"


def _resolves(dotted: str) -> bool:
    """Whether ``specstate.a.b...`` is a module, or a name in one (or an attribute of such a name)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for name in parts[end:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_specstate_names_a_page_uses_exist(page: Path) -> None:
    named = {
        name.rstrip(".")
        for span in _spans(page)
        for name in re.findall(r"\bspecstate(?:\.[A-Za-z_][A-Za-z0-9_]*)+", span)
        if not span.lstrip().startswith(("pip ", "$")) and name.rsplit(".", 1)[-1] not in FILE_SUFFIXES
    }
    missing = sorted(name for name in named if not _resolves(name))
    assert not missing, f"{page.name} names what specstate does not have: {missing}"


#: A file name as docs/layout.md gives it, relative to the folder its row is about.
FILE_NAME = re.compile(r"^[\w./-]+\.(?:rs|py|pyi|cpp|cmake|sh|txt)$")


def _layout_rows(heading: str) -> list[list[str]]:
    """The rows of the table under ``heading`` in docs/layout.md, each as its cells' code spans."""
    text = (ROOT / "docs" / "layout.md").read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| `")]
    return [[" ".join(CODE.findall(cell)) for cell in row] for row in rows]


def _found(name: str, places: list[Path]) -> bool:
    """Whether ``name`` is a file of the repository, or of one of ``places`` (folders, searched whole)."""
    if "/" in name and (ROOT / name).exists():
        return True
    return any((place / name).exists() or any(place.rglob(Path(name).name)) for place in places if place.is_dir())


def test_the_files_docs_layout_names_exist() -> None:
    """Every file a row of docs/layout.md's file table names is in the folder the row is about (or under it)."""
    missing = []
    for cells in _layout_rows("Files"):
        paths = [ROOT / path for path in cells[0].split()]  # a glob (``tests/*.rs``) stands for its folder
        places = [path if path.is_dir() else path.parent for path in paths] + [path.with_suffix("") for path in paths]
        assert all(path.exists() or "*" in path.name for path in paths), cells[0]
        missing += [name for name in " ".join(cells[1:]).split() if FILE_NAME.match(name) and not _found(name, places)]
    assert not missing, f"docs/layout.md names files that do not exist: {missing}"


def test_the_core_modules_docs_layout_names_exist() -> None:
    """Every module the core's import table names is a top module of the crate (src/lib.rs)."""
    modules = set(re.findall(r"^(?:pub )?mod (\w+);", (ROOT / "src" / "lib.rs").read_text(), re.MULTILINE))
    named = {name for cells in _layout_rows("The core's modules") for cell in cells for name in cell.split(" ")}
    missing = sorted(name.rstrip(",") for name in named if name and name.rstrip(",") not in modules)
    assert not missing, f"docs/layout.md's module table names modules the crate does not have: {missing}"
