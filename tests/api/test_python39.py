"""The package runs on the oldest Python its wheel is tagged for (abi3, CPython >= 3.9), which this machine lacks.

`make check-old-glibc` runs the wheel on Debian bullseye's Python 3.9 end to end; this test keeps the commonest way
to break that out of `make test`'s reach: importing at run time a `typing` name that Python 3.9 does not have (ruff's
target-version already rejects newer syntax). Imports under `if TYPE_CHECKING:` are never executed and are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "specstate"

#: `typing` names added after Python 3.9 (3.10: TypeAlias and friends; 3.11; 3.12; 3.13).
NEWER_TYPING = {
    "TypeAlias", "ParamSpec", "ParamSpecArgs", "ParamSpecKwargs", "Concatenate", "TypeGuard", "is_typeddict",
    "Self", "Never", "LiteralString", "Required", "NotRequired", "Unpack", "TypeVarTuple", "assert_never",
    "assert_type", "reveal_type", "dataclass_transform", "get_overloads", "clear_overloads", "override",
    "TypeAliasType", "get_protocol_members", "is_protocol", "ReadOnly", "TypeIs", "NoDefault",
}  # fmt: skip


def runtime_typing_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every `from typing import name` outside `if TYPE_CHECKING:` blocks."""
    checked_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for statement in block.body
        for node in ast.walk(statement)
    }
    return [
        (node.lineno, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "typing" and id(node) not in checked_only
        for alias in node.names
    ]


def test_no_runtime_import_of_a_typing_name_newer_than_python_3_9() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: typing.{name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in runtime_typing_imports(ast.parse(path.read_text()))
        if name in NEWER_TYPING
    ]
    assert not found, f"not in Python 3.9's typing (import it under `if TYPE_CHECKING:`): {found}"


def test_the_check_sees_a_runtime_import_and_skips_a_checking_one() -> None:
    tree = ast.parse("from typing import TypeAlias, Any\nif TYPE_CHECKING:\n    from typing import Self\n")
    assert runtime_typing_imports(tree) == [(1, "TypeAlias"), (1, "Any")]
