"""The library's functions stay small enough to read in one sitting.

A function or method of ``programlogic`` or ``managers`` has at most 80 lines of code
below its docstring (the docstring, which states the contract, does not count). A
module has no such limit: it is as long as its concept, and is split when a second
concept moves in, never to fit a number.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).parent.parent
MAX_FUNCTION_LINES = 80
SOURCES = sorted(
    path for package in ("programlogic", "managers") for path in (ROOT / package).rglob("*.py")
)


def code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of ``function`` from its first statement after the docstring to its end."""
    body = function.body
    has_docstring = ast.get_docstring(function) is not None and len(body) > 1
    first = body[1] if has_docstring else body[0]
    assert function.end_lineno is not None
    return function.end_lineno - first.lineno + 1


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
async def test_a_module_s_functions_stay_small(path: pathlib.Path) -> None:
    source = path.read_text()
    too_long = [
        f"{node.name} (line {node.lineno}): {code_lines(node)} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and code_lines(node) > MAX_FUNCTION_LINES
    ]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines of code: {too_long}"


async def test_a_function_too_long_is_found() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    source = f'def long():\n    """A contract."""\n{body}\n'
    [function] = ast.parse(source).body
    assert isinstance(function, ast.FunctionDef)
    assert code_lines(function) == MAX_FUNCTION_LINES + 1
