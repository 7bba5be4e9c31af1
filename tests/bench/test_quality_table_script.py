"""bench/quality_table.py in its tiny form: 2 rounds, FedAvg, the middle grid cell, digits.

The script runs in a subprocess (as it is run outside CI) and writes its results to a
file in tmp_path; a second run with the same arguments resumes and trains nothing.
"""

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "quality_table.py"


async def run_script(*arguments: str) -> str:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = await anyio.run_process(
        [sys.executable, str(SCRIPT), *arguments], env=environment, check=False
    )
    assert completed.returncode == 0, completed.stderr.decode()
    return completed.stdout.decode()


async def test_tiny_run_writes_its_cell_and_a_rerun_resumes_it(tmp_path: Path) -> None:
    out = tmp_path / "quality.json"
    tiny = ("--rounds", "2", "--datasets", "digits", "--algorithms", "fedavg")
    first = await run_script(*tiny, "--grid", "center", "--out", str(out))

    cells = json.loads(out.read_text())["cells"]
    assert list(cells) == ["table/digits/fedavg/0.1/1.0/2/10/0"]
    cell = cells["table/digits/fedavg/0.1/1.0/2/10/0"]
    assert cell["rounds"] == 2 and cell["clients_per_round"] == 10
    assert cell["held_out_examples"] == 510
    assert 0.0 <= cell["held_out_accuracy"] <= 1.0
    assert "digits         fedavg" in first
    assert "| fedavg | 0." in first

    second = await run_script(*tiny, "--grid", "center", "--out", str(out))
    assert "digits         fedavg" not in second  # nothing trained again
    assert json.loads(out.read_text())["cells"] == cells
