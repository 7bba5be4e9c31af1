"""The main job's terminal: the bar and the job's own lines on a terminal, progress lines
elsewhere, everything in the run's log file; TensorFlow's start-up lines only with
``--verbose``; what Keras imports for integrations the job does not use stays out."""

import fcntl
import os
import pathlib
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

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
LIBRARY_LINES = ("programlogic.evaluation: evaluation of round", "programlogic.training")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def command(root: pathlib.Path, *arguments: str) -> list[str]:
    script = str(SAMPLES / "main_job.py")
    return [sys.executable, script, "--rounds", "2", "--root", str(root), *arguments]


def environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("TF_")}


def main_job(root: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(root, *arguments), capture_output=True, text=True, timeout=300, env=environment()
    )


def on_a_terminal(root: pathlib.Path, *arguments: str) -> tuple[int, str]:
    """Run the job with stdout and stderr on a pseudo-terminal 100 columns wide; its exit
    status and everything it wrote there."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    running = subprocess.Popen(
        command(root, *arguments),
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        env=environment(),
    )
    os.close(child)
    written = bytearray()
    deadline = time.monotonic() + 300  # a hang guard
    try:
        while time.monotonic() < deadline:
            if select.select([parent], [], [], 1)[0]:
                try:
                    chunk = os.read(parent, 65536)
                except OSError:  # the job closed the terminal
                    break
                if not chunk:
                    break
                written += chunk
        status = running.wait(timeout=60)
    finally:
        running.kill()
        os.close(parent)
    return status, written.decode(errors="replace")


def screen(written: str) -> list[str]:
    """The lines a terminal keeps of ``written``: what follows each line's last carriage
    return, blank lines left out."""
    lines = [line.split("\r")[-1].rstrip() for line in written.replace("\r\n", "\n").split("\n")]
    return [line for line in lines if line]


async def test_a_terminal_shows_the_bar_and_the_job_s_own_lines_and_the_log_keeps_the_rest(
    tmp_path,
):
    root = tmp_path / "run"
    status, written = on_a_terminal(root, "--rounds", "4", "--eval-every", "1")
    assert status == 0, written
    assert not [
        line for line in LIBRARY_LINES if line in written
    ]  # never written, not even cleared
    assert not [line for line in written.splitlines() if any(n in line for n in NOISE)]
    shown = screen(written)
    assert "main_job: training 4 rounds on digits" in shown[0]
    assert "4/4" in shown[1] and "round/s" in shown[1] and "eval_acc=" in shown[1]
    final = [line.split(" main_job: ", 1)[1] for line in shown[2:]]
    assert [line.split(":")[0].split(" at ")[0] for line in final] == [
        "completed",
        "load the Keras model",
        "load the SavedModel",
        "plot the curves with",
        f"every line logged is in {root / 'main_job.log'}",
    ]
    logged = (root / "main_job.log").read_text()
    for round_num in range(5):
        assert f"programlogic.evaluation: evaluation of round {round_num} finished" in logged
    assert "main_job: completed at round 4" in logged


async def test_off_a_terminal_no_bar_but_a_progress_line_a_round_and_no_library_lines(tmp_path):
    root = tmp_path / "run"
    done = main_job(root, "--rounds", "3", "--eval-every", "1")
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "round/s" not in done.stderr
    assert not [line for line in LIBRARY_LINES if line in done.stderr]
    progress = [line for line in done.stderr.splitlines() if "main_job.progress: " in line]
    assert [line.split("main_job.progress: ")[1].split(":")[0] for line in progress] == [
        "round 1 of 3",
        "round 2 of 3",
        "round 3 of 3",
    ]
    assert "loss " in progress[-1] and "held-out accuracy 0." in progress[-1]
    logged = (root / "main_job.log").read_text()
    assert all(line in logged for line in progress)
    assert "programlogic.evaluation: evaluation of round 3 finished" in logged


async def test_off_a_terminal_a_long_run_writes_about_ten_progress_lines(tmp_path):
    done = main_job(tmp_path / "run", "--rounds", "25", "--eval-every", "25", "--epochs", "1")
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if "main_job.progress: " in line]
    rounds = [int(line.split("main_job.progress: round ")[1].split()[0]) for line in progress]
    assert rounds == [3, 6, 9, 12, 15, 18, 21, 24, 25]


async def test_by_default_no_tensorflow_start_up_lines_and_with_verbose_debug_logs(tmp_path):
    quiet = main_job(tmp_path / "quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert not [line for line in quiet.stderr.splitlines() if any(n in line for n in NOISE)]
    assert "main_job: training 2 rounds on digits" in quiet.stderr
    assert "released key" not in quiet.stderr  # a DEBUG line
    assert "released key" not in (tmp_path / "quiet" / "main_job.log").read_text()
    verbose = main_job(tmp_path / "verbose", "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert "main_job: training 2 rounds on digits" in verbose.stderr
    assert "released key" in verbose.stderr
    assert "programlogic.evaluation: evaluation of round 2 finished" in verbose.stderr
    assert "released key" in (tmp_path / "verbose" / "main_job.log").read_text()


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
