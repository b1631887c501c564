#!/usr/bin/env python3
"""Fail when a function is longer than the project allows.

Rust functions in ``src/`` and ``tests/*.rs`` may have at most 80 lines and
Python functions in ``python/``, ``benchmarks/`` and ``scripts/`` at most 60,
counted from the ``fn``/``def`` line to the last line of the body. Rust is read as ``rustfmt`` writes it: a
function ends at the first ``}`` at the indentation of its ``fn`` line.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUST_LIMIT = 80
PYTHON_LIMIT = 60
RUST_FN = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:unsafe\s+)?(?:extern\s+\"C\"\s+)?fn\s+(\w+)")


def _declaration(lines: list[str], index: int) -> bool:
    """Whether the ``fn`` at ``lines[index]`` is only declared (in an ``extern`` block): its signature, over
    however many lines, ends with ``;`` before any body opens."""
    for line in lines[index:]:
        stripped = line.rstrip()
        if stripped.endswith(";"):
            return True
        if stripped.endswith("{") or stripped.endswith("}"):
            return False
    return False


def rust_functions(path: Path) -> Iterator[tuple[str, int, int]]:
    """(name, first line, line count) of every function in a Rust file."""
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        match = RUST_FN.match(line)
        if not match or _declaration(lines, index):
            continue
        indent = match.group(1)
        for end in range(index, len(lines)):
            if lines[end] == f"{indent}}}" or (end == index and line.rstrip().endswith("}")):
                yield match.group(2), index + 1, end - index + 1
                break


def python_functions(path: Path) -> Iterator[tuple[str, int, int]]:
    """(name, first line, line count) of every function in a Python file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1


def too_long() -> list[str]:
    """One line for each function over its limit."""
    found = []
    rust = [*ROOT.glob("src/**/*.rs"), *ROOT.glob("tests/*.rs")]
    python = [*ROOT.glob("python/**/*.py"), *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("scripts/*.py")]
    for paths, functions, limit in ((rust, rust_functions, RUST_LIMIT), (python, python_functions, PYTHON_LIMIT)):
        for path in sorted(paths):
            for name, line, count in functions(path):
                if count > limit:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {name} has {count} lines (at most {limit})")
    return found


def main() -> int:
    found = too_long()
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
