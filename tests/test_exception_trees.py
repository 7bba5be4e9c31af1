"""Every exception class of a package is drawn, under its real base, in its exceptions module."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

import managers.exceptions
import programlogic.exceptions

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
_ENTRY = re.compile(r"[A-Z]\w*(?=\s|$)")


def drawn_tree(docstring: str) -> dict[str, str | None]:
    """Each class drawn in the docstring's tree, and the class drawn as its parent."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    literal = docstring.split("::", 1)[1]
    for line in literal.splitlines():
        if line.strip() and not line[0].isspace():
            break  # the literal block ends at the first unindented line
        rest = line.lstrip(" │├└─")
        entry = _ENTRY.match(rest)
        if not rest or entry is None:
            continue  # a blank line, or the continuation of an entry's description
        column = len(line) - len(rest)
        while stack and stack[-1][0] >= column:
            stack.pop()
        parents[entry.group()] = stack[-1][1] if stack else None
        stack.append((column, entry.group()))
    return parents


def defined_exceptions(package: str) -> dict[str, str]:
    """Every public exception class defined in ``package``, and the name of its first base."""
    classes: dict[str, str] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.bases:
                base = node.bases[0]
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                classes[node.name] = name
    exceptions: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for name, base in classes.items():
            builtin = getattr(builtins, base, None)
            is_exception = base in exceptions or (
                isinstance(builtin, type) and issubclass(builtin, BaseException)
            )
            if is_exception and name not in exceptions:
                exceptions[name] = base
                grew = True
    return {name: base for name, base in exceptions.items() if not name.startswith("_")}


@pytest.mark.parametrize(
    ("package", "module"),
    [("managers", managers.exceptions), ("programlogic", programlogic.exceptions)],
)
async def test_every_exception_class_is_drawn_under_its_base(package, module) -> None:
    tree = drawn_tree(module.__doc__)
    defined = defined_exceptions(package)
    assert defined, f"no exception class found in {package}"
    for name, base in defined.items():
        assert name in tree, f"{package}.{name} is missing from the tree of {module.__name__}"
        drawn_parent = tree[name]
        if drawn_parent is None:
            assert base not in defined, f"{name} is drawn as a root but derives from {base}"
        else:
            assert drawn_parent == base, f"{name} is drawn under {drawn_parent}, not {base}"
    assert set(tree) <= set(defined), (
        f"the tree draws classes not defined: {set(tree) - set(defined)}"
    )
