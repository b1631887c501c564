"""The layout keeps its promises (docs/layout.md): no import circle between modules, each default written once
(by its owner), and no source file that has grown past what a newcomer can read."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"specstate": ROOT / "python" / "specstate", "specstate_testkit": ROOT / "python" / "specstate_testkit"}
#: The most lines of one source file (generated code and test tables excepted, below).
MOST_LINES = 800
#: Files allowed to be longer: test tables and fuzzers (data more than logic).
LONG_FILES = {"tests/support/checkpoint_fuzz.py"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = path
    for path in (ROOT / "benchmarks").glob("*.py"):
        found[path.stem] = path
    return found


def _imports(tree: ast.Module, module: str, known: dict[str, Path]) -> Iterator[str]:
    """The modules ``module`` imports at its top level (not inside functions), those for type checkers included."""
    for node in tree.body:
        for child in [node] if not isinstance(node, (ast.If, ast.Try)) else ast.walk(node):
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names if alias.name in known)
            elif isinstance(child, ast.ImportFrom) and child.module is not None and child.level == 0:
                for alias in child.names:
                    name = f"{child.module}.{alias.name}"
                    yield name if name in known else child.module


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle in ``graph``, if there is one."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_python_module_imports_itself_through_others() -> None:
    """Module-level imports between specstate's modules (and the benchmarks'), ``TYPE_CHECKING`` ones included, form
    no circle. A package's ``__init__`` that re-exports its modules is left out: importing ``specstate.x`` runs it
    first anyway."""
    known = _modules()
    packages = {name for name, path in known.items() if path.name == "__init__.py"}
    graph = {
        module: {target for target in _imports(ast.parse(path.read_text()), module, known) if target not in packages}
        for module, path in known.items()
        if module not in packages
    }
    assert _cycle(graph) is None, f"an import circle: {' -> '.join(_cycle(graph) or [])}"


#: Defaults the native core owns (GENERATOR_DEFAULTS), as a literal given to a parameter or option of that name.
DEFAULT_LITERALS = [
    re.compile(r"\bn_draft\b[^\n=]*=\s*8\b"),
    re.compile(r"\bn_ctx\b[^\n=]*=\s*2048\b"),
    re.compile(r"\bn_batch\b[^\n=]*=\s*512\b"),
    re.compile(r"""\bMODES\s*=\s*\(\s*["']none["']"""),
]


def _python_sources() -> Iterator[Path]:
    for folder in (*PACKAGES.values(), ROOT / "benchmarks"):
        yield from folder.rglob("*.py")


def test_no_default_literal_is_written_outside_its_owner() -> None:
    """n_draft 8, n_ctx 2048, n_batch 512 and the mode list are the core's (read through ``_defaults`` and
    ``_typing.Mode``): none of them is written again as a default in the Python layers."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _python_sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(pattern.search(line) for pattern in DEFAULT_LITERALS)
    ]
    assert not found, "defaults written again outside their owner:\n" + "\n".join(found)


@pytest.mark.parametrize("suffix", [".py", ".rs"])
def test_no_source_file_is_longer_than_a_newcomer_reads(suffix: str) -> None:
    folders = [ROOT / "python", ROOT / "src", ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts"]
    long = [
        f"{path.relative_to(ROOT)} ({count} lines)"
        for folder in folders
        for path in folder.rglob(f"*{suffix}")
        if (count := len(path.read_text().splitlines())) > MOST_LINES and str(path.relative_to(ROOT)) not in LONG_FILES
    ]
    assert not long, f"files over {MOST_LINES} lines: {long}"
