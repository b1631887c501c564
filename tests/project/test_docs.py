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
