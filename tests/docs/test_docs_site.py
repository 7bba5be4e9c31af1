"""The docs site builds with ``mkdocs build --strict`` and its API reference documents
every name that a public module of ``programlogic`` and ``managers`` exports."""

import os
import subprocess
import sys
from pathlib import Path

import griffe
import pytest
from mkdocstrings import Inventory

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def exported_names() -> list[str]:
    """``module.name`` for each name in the ``__all__`` of each public module (read from
    the source, so modules needing TFF or Ray count without them)."""
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    names = []

    def walk(module: griffe.Module) -> None:
        if any(part.startswith("_") for part in module.path.split(".")):
            return
        for export in module.exports or ():
            names.append(f"{module.path}.{export if isinstance(export, str) else export.name}")
        for submodule in module.modules.values():
            walk(submodule)

    for package in ("managers", "programlogic"):
        walk(loader.load(package))
    return names


def undocumented(inventory: Path) -> list[str]:
    """The exported names the site's object inventory at ``inventory`` lacks."""
    with inventory.open("rb") as file:
        documented = set(Inventory.parse_sphinx(file))
    return [name for name in exported_names() if name not in documented]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("site")
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(directory)],
        cwd=ROOT,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1", "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-6000:]
    return directory


async def test_the_api_reference_documents_every_exported_name(site):
    assert len(exported_names()) > 500
    assert undocumented(site / "objects.inv") == []


async def test_a_reference_lacking_a_module_is_caught(site, tmp_path):
    pruned = tmp_path / "objects.inv"
    with (site / "objects.inv").open("rb") as file:
        inventory = Inventory.parse_sphinx(file)
    for name in [name for name in inventory if name.startswith("programlogic.stopping")]:
        del inventory[name]
    pruned.write_bytes(inventory.format_sphinx())
    assert "programlogic.stopping.PatienceStopping" in undocumented(pruned)
