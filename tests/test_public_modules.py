"""Every public module of programlogic and managers declares what it exports, and
documents it.

A public module is one whose dotted name has no part starting with ``_``. Its
``__all__`` is sorted as ruff sorts it (constants, then classes, then the rest), every
name in it exists, and every exported class and function has a docstring. An exported
constant is documented by a string literal right under its assignment (an attribute
docstring), in the module that assigns it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
import re
import sys
import types

import pytest

import managers
import programlogic

pytestmark = pytest.mark.anyio

# Optional backends whose dependencies this environment may lack.
OPTIONAL = {
    "programlogic.contexts.ray": "ray",
    "programlogic.contexts.tff": "tensorflow_federated",
}


def public_module_names() -> list[str]:
    names = ["managers", "programlogic"]
    for package in (managers, programlogic):
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            if any(part.startswith("_") for part in info.name.split(".")):
                continue
            names.append(info.name)
    return sorted(names)


def import_public(name: str) -> types.ModuleType:
    for prefix, dependency in OPTIONAL.items():
        if name == prefix or name.startswith(f"{prefix}."):
            pytest.importorskip(dependency)
    return importlib.import_module(name)


def ruff_order(name: str) -> tuple[int, list[object]]:
    """The key by which ruff's RUF022 sorts ``__all__``: by casing, then naturally."""
    if name.isupper():
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    parts = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    return kind, parts


def documented_constants(module: types.ModuleType) -> set[str]:
    """The names that ``module`` assigns with a string literal right under them."""
    source = inspect.getsource(module)
    body = ast.parse(source).body
    names: set[str] = set()
    for statement, following in itertools.pairwise(body):
        if not (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            continue
        if isinstance(statement, ast.Assign):
            names.update(t.id for t in statement.targets if isinstance(t, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
    return names


def documenting_modules(value: object, name: str, modules: list[types.ModuleType]) -> list[str]:
    """The modules among ``modules`` that assign ``name`` to ``value`` and document it."""
    return [
        module.__name__
        for module in modules
        if module.__dict__.get(name) is value and name in documented_constants(module)
    ]


@pytest.mark.parametrize("name", public_module_names())
async def test_a_public_module_exports_a_sorted_documented_all(name: str) -> None:
    module = import_public(name)
    assert inspect.getdoc(module), f"{name} has no docstring"
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    exported = list(module.__all__)
    assert exported == sorted(exported, key=ruff_order), f"{name}.__all__ is not sorted"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    loaded = [
        loaded_module
        for loaded_name, loaded_module in sorted(sys.modules.items())
        if loaded_name.partition(".")[0] in ("managers", "programlogic")
    ]
    for attribute in exported:
        assert hasattr(module, attribute), f"{name}.{attribute} does not exist"
        value = getattr(module, attribute)
        if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismodule(value):
            assert value.__doc__, f"{name}.{attribute} has no docstring"
        else:
            assert documenting_modules(value, attribute, loaded), (
                f"{name}.{attribute} is a constant without a docstring under its assignment"
            )


async def test_the_walk_finds_the_modules_of_both_packages_and_skips_private_ones() -> None:
    names = public_module_names()
    assert {"managers.taskgroups", "managers.release.csv_file", "programlogic.tasks"} <= set(names)
    assert "managers._serialization_tree" not in names
    assert "programlogic.contexts._threads" not in names
