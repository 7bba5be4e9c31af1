"""What the benchmarks against TFF 0.87 share: their clients, TFF's Python, medians.

``fedavg_vs_tff.py`` and ``algorithms_vs_tff.py`` train on the same synthetic clients,
find the TFF venv the same way and summarize rounds the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
from _anchor_process import run_anchor_process

from programlogic.datasets.arrays import ClientArrays

REPO = Path(__file__).resolve().parent.parent
ANCHORS = REPO.parent / "shared" / "anchors"
EXAMPLES_PER_CLIENT = 100
TOLERANCE = 1e-5
WARM_ROUNDS = 3
"""Rounds of our FedAvg left out of a steady round time: compilation, first file opens,
threads' first calls."""
TFF_PYTHON_VARIABLE = "PROGRAMLOGIC_TFF_PYTHON"
"""The TFF venv's interpreter, when set; otherwise ``setup_tff_venv.sh`` finds or builds it."""


def make_clients(count: int) -> list[ClientArrays]:
    """``count`` clients of 100 synthetic examples, drawn as the anchor draws its own."""
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(count):
        x = rng.random((EXAMPLES_PER_CLIENT, 784), dtype=np.float32)
        y = rng.integers(0, 10, (EXAMPLES_PER_CLIENT, 1)).astype(np.int32).reshape(-1)
        clients.append(ClientArrays(x, y))
    return clients


def write_npz(path: Path, clients: list[ClientArrays]) -> None:
    """The clients in the anchor's format: ``x_i`` float32 [m, 784], ``y_i`` int32 [m]."""
    arrays: dict[str, np.ndarray] = {}
    for index, client in enumerate(clients):
        arrays[f"x_{index}"] = client.x
        arrays[f"y_{index}"] = client.y
    np.savez(path, **arrays)


def tff_python(program: str) -> str:
    """The TFF venv's interpreter: ``$PROGRAMLOGIC_TFF_PYTHON``, or else the venv that
    ``setup_tff_venv.sh`` prints on its last line. ``program`` names the caller in errors."""
    configured = os.environ.get(TFF_PYTHON_VARIABLE)
    if configured:
        if not Path(configured).exists():
            sys.exit(f"{program}: {TFF_PYTHON_VARIABLE}={configured} does not exist")
        return configured
    setup = ANCHORS / "setup_tff_venv.sh"
    if not setup.exists():
        sys.exit(f"{program}: {setup} is missing (shared/ must sit beside the repo)")
    done = subprocess.run(["bash", str(setup)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{program}: {setup} failed:\n{done.stderr[-2000:]}")
    venv = done.stdout.strip().splitlines()[-1].strip()
    return str(Path(venv) / "bin" / "python")


def json_lines_of(program: str, command: list[str]) -> list[dict[str, Any]]:
    """The JSON lines ``command`` (a TFF script) prints; exits if it fails or prints none."""
    returncode, stdout, stderr = run_anchor_process(command)
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if returncode != 0 or not lines:
        sys.exit(f"{program}: {' '.join(command)} failed ({returncode}):\n{stderr[-2000:]}")
    return lines


class AnchorSession:
    """A TFF script that answers each line written to its stdin with one JSON line.

    Its stdout is read by a thread: TFF's worker_binary keeps that pipe open after the
    script has ended, so a script that dies is noticed by polling it, not by the end of
    its output.
    """

    def __init__(self, program: str, command: list[str], stderr: IO[str]) -> None:
        self.program, self.command, self.stderr = program, command, stderr
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, name="anchor-stdout", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.lines.put(line)

    def ask(self, line: str) -> dict[str, Any]:
        """Writes ``line``; the next JSON line the script prints (exits if it ends first)."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        while True:
            try:
                return json.loads(self.lines.get(timeout=1.0))
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
        self.stderr.seek(0)
        sys.exit(
            f"{self.program}: {' '.join(self.command)} ended ({self.process.returncode}) "
            f"before answering {line!r}:\n{self.stderr.read()[-2000:]}"
        )

    def close(self) -> None:
        """Ends the script's stdin, waits for it, then ends what is left of its session."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait()


@contextlib.contextmanager
def anchor_session(program: str, command: list[str]) -> Iterator[AnchorSession]:
    """``command`` running in a session of its own (see
    ``_anchor_process.run_anchor_process``) until the block ends."""
    with tempfile.TemporaryFile("w+") as stderr:
        session = AnchorSession(program, command, stderr)
        try:
            yield session
        finally:
            session.close()


def max_relative_difference(ours: list[float], theirs: list[float]) -> float:
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} losses against {len(theirs)}")
    return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(ours, theirs, strict=True))


def first(runs: list[dict[str, Any]]) -> float:
    """Median milliseconds of the first round (tracing, compilation) of ``runs``."""
    return statistics.median(run["round_s"][0] for run in runs) * 1e3


def steady(runs: list[dict[str, Any]]) -> float:
    """Median milliseconds of the rounds after the first, pooled over ``runs``."""
    return statistics.median(t for run in runs for t in run["round_s"][1:]) * 1e3


def print_aligned(table: list[tuple[str, ...]]) -> None:
    """Print ``table`` (its first line the header) with right-aligned columns, the
    header underlined."""
    widths = [max(len(line[column]) for line in table) for column in range(len(table[0]))]
    for index, line in enumerate(table):
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
