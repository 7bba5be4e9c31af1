"""docs/how-to/migrating-from-tff.md maps every public name of tff.program, tff.learning.programs
and tff.learning.optimizers."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import tensorflow_federated as tff

pytestmark = pytest.mark.anyio

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "migrating-from-tff.md"


def public_names(module: object) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }


def first_column_names(section: str) -> set[str]:
    """The code names in the first cell of each table row of ``section``."""
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Za-z_]+)", first_cell))
    return names


@pytest.mark.parametrize(
    ("heading", "module"),
    [
        ("### `tff.program`", tff.program),
        ("### `tff.learning.programs`", tff.learning.programs),
        ("### `tff.learning.optimizers`", tff.learning.optimizers),
    ],
)
async def test_every_public_name_has_a_row(heading: str, module: object) -> None:
    text = GUIDE.read_text()
    section = text.split(heading, 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    missing = public_names(module) - first_column_names(section)
    assert not missing, f"{heading} lacks rows for {sorted(missing)}"


async def test_the_algorithms_we_have_natively_have_rows() -> None:
    text = GUIDE.read_text()
    section = text.split("### `tff.learning.algorithms`", 1)[1].split("\n## ", 1)[0]
    builders = {
        "build_weighted_fed_avg",
        "build_unweighted_fed_avg",
        "build_weighted_fed_prox",
        "build_unweighted_fed_prox",
        "build_fed_sgd",
        "build_fed_eval",
    }
    assert builders <= public_names(tff.learning.algorithms)
    assert builders <= first_column_names(section)


async def test_the_aggregators_we_have_have_rows() -> None:
    text = GUIDE.read_text()
    section = text.split("### `tff.aggregators`", 1)[1].split("\n## ", 1)[0]
    factories = {
        "MeanFactory",
        "UnweightedMeanFactory",
        "clipping_factory",
        "zeroing_factory",
        "DifferentiallyPrivateFactory",
    }
    assert factories <= public_names(tff.aggregators)
    assert factories <= first_column_names(section)
