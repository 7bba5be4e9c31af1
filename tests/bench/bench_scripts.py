"""Running a bench script as its users do: a fresh Python, this checkout importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
STUDIES = BENCH / "studies"


def run_bench(script: str, *arguments: str) -> str:
    """What ``bench/<script> arguments...`` prints (``studies/<script>`` for a study);
    fails the test if the script fails."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout
