"""The main job's config.json: written whole or not at all, and a damaged one explained."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from samples._job_config import RUN_DEFINING, OtherRunError, check_config, write_config

pytestmark = pytest.mark.anyio

SAMPLES = pathlib.Path(__file__).parent.parent.parent / "samples"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "it is empty"),
        (b'{"model": "soft', "it is not JSON: Unterminated string starting at"),
        (b"\xff\xfe\x00", "it is not JSON: "),
        (b"[1, 2]", "it holds a list, not a JSON object"),
    ],
    ids=["empty", "cut", "binary", "list"],
)
async def test_a_damaged_config_file_gets_a_one_line_error_and_is_left_alone(
    tmp_path, content, reason
):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    failed = subprocess.run(
        [sys.executable, str(SAMPLES / "main_job.py"), "--rounds", "1", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard; it stops before loading any data
    )
    assert failed.returncode == 2
    [line] = failed.stderr.strip().splitlines()
    assert line.startswith(f"main_job: {path} is damaged ({reason}")
    assert line.endswith(
        "): restore it, or delete it and rerun with the flags the run was started with "
        "(or pick another --root to start over)"
    )
    assert path.read_bytes() == content
    assert sorted(tmp_path.iterdir()) == [path]


async def test_a_crash_before_the_rename_leaves_the_old_config_whole(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    write_config(path, {"model": "softmax"})
    before = path.read_bytes()

    def crash(source: object, destination: object) -> None:
        raise OSError("simulated crash between the write and the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write_config(path, {"model": "mlp"})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert json.loads(before) == {"model": "softmax"}
    assert sorted(tmp_path.iterdir()) == [path]  # no temporary file left behind
    write_config(path, {"model": "mlp"})
    assert json.loads(path.read_bytes()) == {"model": "mlp"}
    assert sorted(tmp_path.iterdir()) == [path]


async def test_a_run_recorded_before_the_algorithm_flag_resumes_as_fedavg(tmp_path):
    config = {name: None for name in RUN_DEFINING} | {"model": "softmax", "server_lr": 1.0}
    recorded = {name: value for name, value in config.items() if name != "algorithm"}
    del recorded["proximal_strength"]  # written before these flags existed
    write_config(tmp_path / "config.json", recorded)
    check_config(tmp_path, {**config, "algorithm": "fedavg"})  # read as FedAvg's
    with pytest.raises(OtherRunError, match="--algorithm 'fedavg' -> 'fedprox'"):
        check_config(tmp_path, {**config, "algorithm": "fedprox", "proximal_strength": 0.01})
