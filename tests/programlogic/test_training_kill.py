"""A real training program killed with SIGKILL at each stage of a round resumes to the
same result as the run that was never interrupted."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
import pytest

from managers.release.model_file import ModelFileReleaseManager
from programlogic import final_model_key

pytestmark = pytest.mark.anyio

PROGRAM = Path(__file__).with_name("_training_program.py")
REPOSITORY = Path(__file__).parents[2]
# The program imports the code of this checkout, not an installed copy.
ENVIRONMENT = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
}
ROUNDS = 60

# Where the successive runs of one program kill themselves (see _training_program.py),
# and the newest checkpoint each kill leaves: it loses at most the round in flight, and
# while round r computes, the save of round r - 1 may still be in flight.
KILLS = [
    ("computing", 5, (3, 4)),
    ("saving", 12, (11, 11)),
    ("saved", 20, (20, 20)),
    ("releasing", 31, (31, 31)),
    ("computing", 45, (43, 44)),
    ("final", ROUNDS, (ROUNDS, ROUNDS)),
]


async def run(
    root: Path, backend: str, *kill: str | int, every: int = 1
) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, str(PROGRAM), str(root), str(ROUNDS), backend, *map(str, kill)]
    environment = {**ENVIRONMENT, "CHECKPOINT_EVERY": str(every)}
    with anyio.fail_after(120):  # a hang guard: a run takes a few seconds
        return await anyio.run_process(command, check=False, env=environment)


def newest_version(root: Path) -> int:
    """The newest program-state version under ``root``, read from the file names."""
    names = [path.name for path in (root / "state").iterdir()]
    found = [re.fullmatch(r"program_state_(\d+)\.plstate", name) for name in names]
    return max(int(match.group(1)) for match in found if match)


async def run_to_completion(root: Path, backend: str) -> None:
    finished = await run(root, backend)
    assert finished.returncode == 0, finished.stderr.decode()
    assert finished.stdout.decode().strip() == "done"


async def test_a_program_killed_at_each_stage_resumes_to_the_uninterrupted_result(
    tmp_path: Path, anyio_backend: str
) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    await run_to_completion(reference, anyio_backend)
    for stage, round_num, (lowest, highest) in KILLS:
        stopped = await run(killed, anyio_backend, stage, round_num)
        assert stopped.returncode == -signal.SIGKILL, (stage, stopped.stderr.decode())
        assert lowest <= newest_version(killed) <= highest, (stage, round_num)
    await run_to_completion(killed, anyio_backend)
    assert (killed / "metrics.csv").read_text() == (reference / "metrics.csv").read_text()
    key = final_model_key(ROUNDS)
    ours = await ModelFileReleaseManager(killed / "models").load(key)
    theirs = await ModelFileReleaseManager(reference / "models").load(key)
    np.testing.assert_array_equal(ours, theirs)


async def test_a_program_checkpointing_every_4_rounds_killed_between_checkpoints_replays_them(
    tmp_path: Path, anyio_backend: str
) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    await run_to_completion(reference, anyio_backend)
    for stage, round_num in [("computing", 7), ("releasing", 10), ("saving", 16), ("final", 60)]:
        stopped = await run(killed, anyio_backend, stage, round_num, every=4)
        assert stopped.returncode == -signal.SIGKILL, (stage, stopped.stderr.decode())
        newest = newest_version(killed)
        assert newest % 4 == 0 and newest <= round_num, (stage, round_num, newest)
    finished = await run(killed, anyio_backend, every=4)
    assert finished.returncode == 0, finished.stderr.decode()
    # The rounds after each checkpoint were trained again and released again: the same.
    assert (killed / "metrics.csv").read_text() == (reference / "metrics.csv").read_text()
    key = final_model_key(ROUNDS)
    ours = await ModelFileReleaseManager(killed / "models").load(key)
    theirs = await ModelFileReleaseManager(reference / "models").load(key)
    np.testing.assert_array_equal(ours, theirs)
