"""The import graph of the repository's code: no circle, no private name across packages.

Every ``import`` statement counts, wherever it sits (a ``TYPE_CHECKING`` block, a
function body): a circle that only appears under ``TYPE_CHECKING`` or on first use is
still two modules that cannot be read one before the other. A private name (one part
starting with ``_``) is for the package that holds it: only a module inside that
package (its folder, or a folder below it) may import it. Programs
in ``bench/`` and ``samples/`` are held to the same rule, against the library too.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).parent.parent
CHECKED = ("programlogic", "managers", "bench", "samples")


@dataclasses.dataclass(frozen=True)
class Module:
    """A module of the tree: its dotted name and whether it is a package's ``__init__``."""

    name: str
    is_package: bool

    @property
    def package(self) -> str:
        """The package it sits in: itself for an ``__init__``, else its parent."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def modules_of(root: pathlib.Path, tops: tuple[str, ...]) -> dict[str, tuple[Module, str]]:
    """Every module under ``root``'s ``tops``, by dotted name, with its source."""
    found = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            found[name] = (Module(name, is_package), path.read_text())
    return found


def imported_names(module: Module, source: str) -> list[str]:
    """The dotted names ``source`` imports: ``a.b`` for ``import a.b``, ``a.b.c`` for
    ``from a.b import c`` (relative imports resolved against ``module``)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.package.split(".")[
                    : len(module.package.split(".")) - node.level + 1
                ]
                base = ".".join([*anchor, base] if base else anchor)
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def resolved(imported: str, module: Module, modules: dict[str, tuple[Module, str]]) -> str:
    """``imported`` as a name of the tree: a program's import of a module beside it
    (``from _helpers import x`` in ``bench/run.py``, found on ``sys.path`` because the
    program's folder is) names ``bench._helpers.x``."""
    first = imported.partition(".")[0]
    sibling = f"{module.package}.{first}"
    if not any(name == first or name.startswith(first + ".") for name in modules) and (
        sibling in modules
    ):
        return f"{module.package}.{imported}"
    return imported


def internal_edges(modules: dict[str, tuple[Module, str]]) -> dict[str, set[str]]:
    """For each module, the modules of the tree it imports (a name imported from a
    module counts as that module; a submodule imported from a package, as the submodule)."""
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, (module, source) in modules.items():
        for imported in imported_names(module, source):
            target = resolved(imported, module, modules)
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``edges``: each strongly connected set of two or more
    modules, sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def cycles_through_package_inits(edges: dict[str, set[str]], modules: dict) -> dict:
    """``edges`` less a package ``__init__``'s imports of its own submodules: a package
    re-exporting its modules' names is how a public API is assembled, not a circle."""
    kept = {}
    for name, targets in edges.items():
        module = modules[name][0]
        kept[name] = {
            target
            for target in targets
            if not (module.is_package and target.startswith(name + "."))
        }
    return kept


def private_imports(modules: dict[str, tuple[Module, str]]) -> list[str]:
    """Imports of a private module or name from outside the package that holds it."""
    found = []
    for name, (module, source) in modules.items():
        for imported in imported_names(module, source):
            parts = resolved(imported, module, modules).split(".")
            for depth, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    holder = ".".join(parts[:depth])
                    if holder in modules and not modules[holder][0].is_package:
                        holder = modules[holder][0].package  # a module's private name
                    inside = module.package == holder or module.package.startswith(holder + ".")
                    if not inside:
                        found.append(f"{name} imports {imported}")
                    break
    return sorted(found)


def library_graph() -> dict[str, tuple[Module, str]]:
    return modules_of(ROOT, CHECKED)


async def test_the_tree_has_no_import_circle() -> None:
    modules = library_graph()
    found = circles(cycles_through_package_inits(internal_edges(modules), modules))
    assert not found, f"import circles: {found}"


async def test_no_private_name_is_imported_across_packages() -> None:
    found = private_imports(library_graph())
    assert not found, "\n".join(found)


def write_tree(root: pathlib.Path, files: dict[str, str]) -> None:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


async def test_a_circle_under_type_checking_or_in_a_function_is_found(
    tmp_path: pathlib.Path,
) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.b import B\n",
            "pkg/b.py": "def f():\n    from pkg import a\n",
            "pkg/c.py": "import pkg.a\n",
        },
    )
    modules = modules_of(tmp_path, ("pkg",))
    found = circles(cycles_through_package_inits(internal_edges(modules), modules))
    assert found == [["pkg.a", "pkg.b"]]


async def test_private_names_are_allowed_inside_their_package_only(
    tmp_path: pathlib.Path,
) -> None:
    write_tree(
        tmp_path,
        {
            "lib/__init__.py": "from lib._core import run\n",
            "lib/_core.py": "",
            "lib/sub/__init__.py": "",
            "lib/sub/user.py": "from lib import _core\nfrom .. import _core as again\n",
            "lib/other.py": "from lib._core import run\nfrom lib.sub.user import _helper\n",
            "app/main.py": "from lib._core import run\nfrom lib.sub.user import _helper\n",
            "app/run.py": "from _beside import value\n",
            "app/_beside.py": "",
        },
    )
    found = private_imports(modules_of(tmp_path, ("lib", "app")))
    assert found == [
        "app.main imports lib._core.run",
        "app.main imports lib.sub.user._helper",
        "lib.other imports lib.sub.user._helper",
    ]
