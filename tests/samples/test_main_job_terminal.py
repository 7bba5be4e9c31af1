"""The main job's terminal: TensorFlow's start-up lines only with ``--verbose``, and the
job's own lines; what Keras imports for integrations the job does not use stays out."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from main_job import stderr_captured

pytestmark = pytest.mark.anyio

SAMPLES = pathlib.Path(__file__).parent.parent.parent / "samples"
NOISE = (
    "absl::InitializeLog()",
    "oneDNN custom operations",
    "cudart_stub.cc",
    "cuda drivers",
    "cpu_feature_guard.cc",
    "I0000 ",
    "W0000 ",
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def main_job(root: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
    command = [sys.executable, str(SAMPLES / "main_job.py"), "--rounds", "2", "--root", str(root)]
    return subprocess.run(
        [*command, *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )


def assert_log_lines_start_lines(stderr: str) -> None:
    """Every log line, the event loop's and worker threads' alike, begins a line of its
    own: tqdm cleared its bar (a carriage return) before it, none is written into a bar."""
    logged = [line.split("\r")[-1] for line in stderr.split("\n") if re.search(r" [\w.]+: ", line)]
    assert len(logged) >= 5  # starting, training, tensorboard, evaluations, completed...
    timestamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [\w.]+: ")
    assert all(timestamp.match(line) for line in logged), logged


async def test_by_default_no_tensorflow_start_up_lines_and_with_verbose_debug_logs(tmp_path):
    quiet = main_job(tmp_path / "quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert not [line for line in quiet.stderr.splitlines() if any(n in line for n in NOISE)]
    assert "main_job: training 2 rounds on digits" in quiet.stderr
    assert "released key" not in quiet.stderr  # a DEBUG line
    assert_log_lines_start_lines(quiet.stderr)
    verbose = main_job(tmp_path / "verbose", "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert "main_job: training 2 rounds on digits" in verbose.stderr
    assert "released key" in verbose.stderr


async def test_the_job_imports_tensorflow_without_matplotlib_or_scikit_learn() -> None:
    code = (
        "import sys; from main_job import KERAS_INTEGRATIONS, import_tensorflow; "
        "import_tensorflow(without=KERAS_INTEGRATIONS); import keras; keras.layers.Dense(2); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'sklearn', "
        "'tensorflow'})); import matplotlib; print('matplotlib importable afterwards')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SAMPLES), str(SAMPLES.parent)])},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["['tensorflow']", "matplotlib importable afterwards"]


async def test_what_a_failing_block_wrote_to_descriptor_2_is_shown(capfd) -> None:
    with pytest.raises(ImportError, match="no tensorflow"), stderr_captured():
        os.write(2, b"the C++ side said why\n")
        raise ImportError("no tensorflow")
    assert "the C++ side said why" in capfd.readouterr().err


async def test_what_a_block_wrote_to_descriptor_2_is_hidden_when_it_succeeds(capfd) -> None:
    with stderr_captured():
        os.write(2, b"start-up noise\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
