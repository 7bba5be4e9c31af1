"""samples/tff_program.py, run as a user runs it: a process, stopped and continued."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from managers import ModelFileReleaseManager

pytestmark = pytest.mark.anyio

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "tff_program.py"


def run_sample(root: Path, rounds: int) -> str:
    done = subprocess.run(
        [sys.executable, str(SAMPLE), "--rounds", str(rounds), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


async def test_the_tff_program_trains_checkpoints_and_continues(tmp_path: Path) -> None:
    if importlib.util.find_spec("sklearn") is None:
        pytest.fail(
            "samples/tff_program.py trains on scikit-learn's digits: install scikit-learn "
            "in the TFF environment (pip install -c <its pip freeze> scikit-learn)"
        )
    first = run_sample(tmp_path, 2)
    assert "resumed" not in first
    second = run_sample(tmp_path, 3)
    assert "resumed after round 2" in second
    with open(tmp_path / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["key"] for row in rows] == ["1", "2", "3"]
    losses = [float(row["client_work/train/loss"]) for row in rows]
    assert losses[2] < losses[1] < losses[0]
    accuracy = float(second.rsplit("held-out accuracy ", 1)[1].split()[0])
    assert 0.5 < accuracy <= 1.0
    weights = await ModelFileReleaseManager(tmp_path / "models").load(
        "final_training_checkpoint_round_3"
    )
    assert [w.shape for w in weights["trainable"]] == [(64, 10), (10,)]
    saved = {path.name for path in (tmp_path / "state").iterdir()}
    assert "program_state_3.plstate" in saved
