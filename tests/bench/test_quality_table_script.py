"""bench/studies/quality_table.py in its tiny form: 2 rounds, FedAvg, the middle grid cell, digits.

The script runs in a subprocess (as it is run outside CI) and writes its results to a
file in a temporary directory; a second run with the same arguments resumes and trains
nothing. The two runs happen once per module (a module fixture), not once per backend:
each imports TensorFlow, which takes seconds.
"""

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.bench_scripts import run_bench

pytestmark = pytest.mark.anyio

TINY = ("--rounds", "2", "--datasets", "digits", "--algorithms", "fedavg", "--grid", "center")
KEY = "table/digits/fedavg/0.1/1.0/2/10/0"


def run_script(out: Path) -> str:
    return run_bench("studies/quality_table.py", *TINY, "--out", str(out))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("quality") / "quality.json"
    first = run_script(out)
    cells_after_first = json.loads(out.read_text())["cells"]
    second = run_script(out)
    return {
        "first": first,
        "second": second,
        "cells_after_first": cells_after_first,
        "cells_after_second": json.loads(out.read_text())["cells"],
    }


async def test_tiny_run_writes_its_cell_and_prints_the_table(two_runs: dict[str, Any]) -> None:
    cells = two_runs["cells_after_first"]
    assert list(cells) == [KEY]
    cell = cells[KEY]
    assert cell["part"] == "table"
    assert (cell["dataset"], cell["algorithm"]) == ("digits", "fedavg")
    assert (cell["client_lr"], cell["server_lr"]) == (0.1, 1.0)
    assert (cell["rounds"], cell["clients_per_round"], cell["seed"]) == (2, 10, 0)
    assert cell["held_out_examples"] == 510  # the 4 held-out writers
    assert 0.0 <= cell["held_out_accuracy"] <= 1.0
    assert "digits         fedavg" in two_runs["first"]
    assert "| fedavg | " in two_runs["first"]


async def test_a_second_run_resumes_and_trains_nothing(two_runs: dict[str, Any]) -> None:
    assert "digits         fedavg" not in two_runs["second"]
    assert two_runs["cells_after_second"] == two_runs["cells_after_first"]
    assert "| fedavg | " in two_runs["second"]
