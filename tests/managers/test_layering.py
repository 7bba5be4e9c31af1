"""managers is the lower layer: it never imports programlogic, and exports its managers."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import sys
from pathlib import Path

import anyio
import pytest

import managers
from managers import ProgramStateManager, ReleaseManager

pytestmark = pytest.mark.anyio

PACKAGE_DIR = Path(managers.__file__).resolve().parent
ROOT_DIR = PACKAGE_DIR.parent


def _is_programlogic(name: str | None) -> bool:
    return name is not None and (name == "programlogic" or name.startswith("programlogic."))


def _submodule_names() -> list[str]:
    return sorted(
        info.name for info in pkgutil.walk_packages(managers.__path__, prefix="managers.")
    )


async def test_submodules_are_found():
    names = _submodule_names()
    for expected in (
        "managers.structure",
        "managers.values",
        "managers.state.memory",
        "managers.release.memory",
    ):
        assert expected in names


_SUBPROCESS_CODE = """
import json, pkgutil, importlib, sys
import managers
imported = ["managers"]
for info in pkgutil.walk_packages(managers.__path__, prefix="managers."):
    importlib.import_module(info.name)
    imported.append(info.name)
leaked = sorted(
    name for name in sys.modules
    if name == "programlogic" or name.startswith("programlogic.")
)
print(json.dumps({"imported": imported, "leaked": leaked}))
"""


async def test_importing_managers_does_not_import_programlogic():
    with anyio.fail_after(120):  # a hang guard: importing takes seconds
        completed = await anyio.run_process(
            [sys.executable, "-c", _SUBPROCESS_CODE], cwd=ROOT_DIR, check=False
        )
    assert completed.returncode == 0, completed.stderr.decode()
    report = json.loads(completed.stdout)
    assert report["leaked"] == []
    assert set(report["imported"]) == {"managers", *_submodule_names()}


def _python_files() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def _programlogic_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names if _is_programlogic(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and _is_programlogic(node.module):
                found.append(node.module)
            elif node.module is None:
                found.extend(alias.name for alias in node.names if _is_programlogic(alias.name))
        elif isinstance(node, ast.Call):
            function = node.func
            name = getattr(function, "attr", None) or getattr(function, "id", None)
            if name in {"import_module", "__import__"} and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    if _is_programlogic(first.value):
                        found.append(first.value)
    return found


async def test_static_scan_finds_python_files():
    files = {path.relative_to(PACKAGE_DIR).as_posix() for path in _python_files()}
    assert {"__init__.py", "structure.py", "state/memory.py", "release/base.py"} <= files


async def test_static_scan_detects_programlogic_imports():
    sample = (
        "import programlogic\n"
        "import os, programlogic.training as t\n"
        "from programlogic.context import get_context\n"
        "from programlogicx import y\n"
        "importlib.import_module('programlogic.data')\n"
    )
    assert _programlogic_imports(ast.parse(sample)) == [
        "programlogic",
        "programlogic.training",
        "programlogic.context",
        "programlogic.data",
    ]


@pytest.mark.parametrize(
    "path", _python_files(), ids=lambda path: path.relative_to(PACKAGE_DIR).as_posix()
)
async def test_no_module_of_managers_imports_programlogic(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    assert _programlogic_imports(tree) == []


async def test_all_is_sorted_and_resolves():
    assert managers.__all__ == sorted(managers.__all__)
    assert len(set(managers.__all__)) == len(managers.__all__)
    for name in managers.__all__:
        assert hasattr(managers, name), name


def _manager_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for module_name in _submodule_names():
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and value.__module__ == module_name
                and not name.startswith("_")
                and issubclass(value, ProgramStateManager | ReleaseManager)
            ):
                found[name] = value
    return found


async def test_every_public_manager_class_is_exported():
    classes = _manager_classes()
    assert {
        "ProgramStateManager",
        "MemoryProgramStateManager",
        "ReleaseManager",
        "MemoryReleaseManager",
    } <= set(classes)
    missing = sorted(set(classes) - set(managers.__all__))
    assert missing == []
    for name, cls in classes.items():
        assert getattr(managers, name) is cls
