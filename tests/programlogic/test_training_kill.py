"""A real training program killed with SIGKILL at random instants resumes to the same result."""

import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from managers.release.model_file import ModelFileReleaseManager
from programlogic import final_model_key

pytestmark = pytest.mark.anyio

PROGRAM = Path(__file__).with_name("_training_program.py")
ROUNDS = 60


def run(root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(PROGRAM), str(root), str(ROUNDS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def newest_version(root: Path) -> int:
    """The newest program-state version under ``root``, read from the file names."""
    state = root / "state"
    names = [p.name for p in state.iterdir()] if state.is_dir() else []
    found = [re.match(r"program_state_(\d+)", name) for name in names]
    return max((int(match.group(1)) for match in found if match), default=-1)


def run_to_completion(root: Path) -> None:
    process = run(root)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert stdout.strip() == "done"


async def test_a_killed_program_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    run_to_completion(reference)
    chance = random.Random(20261202)
    kills = 0
    for _ in range(4):
        process = run(killed)
        started = newest_version(killed)
        while process.poll() is None and newest_version(killed) <= started:
            time.sleep(0.005)  # until this run has saved a round of its own
        time.sleep(chance.uniform(0.0, 0.2))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.communicate(timeout=60)
    run_to_completion(killed)
    assert kills >= 3
    assert (killed / "metrics.csv").read_text() == (reference / "metrics.csv").read_text()
    key = final_model_key(ROUNDS)
    ours = await ModelFileReleaseManager(killed / "models").load(key)
    theirs = await ModelFileReleaseManager(reference / "models").load(key)
    np.testing.assert_array_equal(ours, theirs)
