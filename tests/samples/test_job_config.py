"""The main job's config.json: written whole or not at all, and a damaged one explained."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from main_job_flags import record_config

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


async def test_a_crash_before_the_rename_leaves_no_config_and_the_first_one_stays(
    tmp_path, monkeypatch
):
    root = tmp_path / "run"

    def crash(source: object, destination: object) -> None:
        raise OSError("simulated crash between the write and the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        record_config(root, {"model": "softmax"})
    monkeypatch.undo()
    assert list(root.iterdir()) == []  # no config, no temporary file left behind
    record_config(root, {"model": "softmax"})
    record_config(root, {"model": "mlp"})  # a rerun never rewrites the run's flags
    assert json.loads((root / "config.json").read_bytes()) == {"model": "softmax"}
    assert sorted(root.iterdir()) == [root / "config.json"]
