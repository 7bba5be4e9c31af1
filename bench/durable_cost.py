"""What a round's durable work costs: CPU time per round of file state, CSV and TensorBoard.

Runs ``train_model`` with a process that computes nothing (its state is the softmax
layer's 7,850 float32 weights, returned unchanged) so that a round's CPU time is the
program's own. Three configurations alternate, ``--repeats`` times each:

- ``memory``: memory state and metrics managers, the baseline;
- ``every round``: a ``FileProgramStateManager`` (fsync'd saves) and metrics to a CSV
  file and TensorBoard (grouped), a checkpoint every round;
- ``every 10``: the same with ``checkpoint_every=10``.

The durable CPU time per round is a configuration's process CPU time per round (all
threads) less the baseline's; the wall-clock time per round beside it. Prints a table,
then one JSON line with medians and the (min, max) over repeats.

    python bench/durable_cost.py [--rounds 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    TensorBoardReleaseManager,
)
from programlogic import LearningProcessOutput, LocalContext, train_model
from programlogic.testing import FakeDataSource

CONFIGURATIONS = ("memory", "every round", "every 10")


class StillProcess:
    """Returns its state unchanged: a round costs only what the program does around it."""

    async def initialize(self) -> dict[str, Any]:
        return {"kernel": np.zeros((784, 10), np.float32), "bias": np.zeros(10, np.float32)}

    async def next(self, state: dict[str, Any], clients: Any) -> LearningProcessOutput:
        metrics = {"client_work": {"train": {"loss": 0.5, "num_examples": 1000}}}
        return LearningProcessOutput(state, metrics)

    async def get_model_weights(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    async def set_model_weights(self, state: dict[str, Any], weights: Any) -> dict[str, Any]:
        return weights


async def one_run(configuration: str, rounds: int, directory: Path) -> tuple[float, float]:
    """CPU seconds and wall seconds of ``rounds`` rounds in ``configuration``."""
    if configuration == "memory":
        state: Any = MemoryProgramStateManager(keep_total=3)
        metrics: Any = MemoryReleaseManager(max_entries=100)
    else:
        state = FileProgramStateManager(directory / "state", keep_total=3)
        metrics = GroupingReleaseManager(
            [
                CSVFileReleaseManager(directory / "metrics.csv"),
                TensorBoardReleaseManager(directory / "tensorboard"),
            ]
        )
    async with LocalContext(), state, metrics:
        cpu, wall = time.process_time(), time.perf_counter()
        await train_model(
            train_process=StillProcess(),
            train_data_source=FakeDataSource(100),
            train_per_round_clients=10,
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=MemoryReleaseManager(max_entries=1),
            train_metrics_manager=metrics,
            checkpoint_every=10 if configuration == "every 10" else 1,
        )
        return time.process_time() - cpu, time.perf_counter() - wall


async def measure(rounds: int, repeats: int) -> dict[str, Any]:
    """Per configuration, CPU and wall milliseconds per round over alternating repeats."""
    cpu: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    wall: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    await one_run("every round", 20, Path(tempfile.mkdtemp()))  # imports, first writes
    for _ in range(repeats):
        for name in CONFIGURATIONS:
            with tempfile.TemporaryDirectory() as directory:
                used, took = await one_run(name, rounds, Path(directory))
            cpu[name].append(used / rounds * 1e3)
            wall[name].append(took / rounds * 1e3)
    baseline = statistics.median(cpu["memory"])
    rows = {}
    for name in CONFIGURATIONS:
        rows[name] = {
            "cpu_ms_per_round": round(statistics.median(cpu[name]), 4),
            "cpu_ms_range": [round(min(cpu[name]), 4), round(max(cpu[name]), 4)],
            "durable_cpu_ms_per_round": round(statistics.median(cpu[name]) - baseline, 4),
            "wall_ms_per_round": round(statistics.median(wall[name]), 4),
            "wall_ms_range": [round(min(wall[name]), 4), round(max(wall[name]), 4)],
        }
    return {"benchmark": "durable cost", "rounds": rounds, "repeats": repeats, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    result = anyio.run(measure, arguments.rounds, arguments.repeats)
    print("| configuration | CPU ms a round | durable CPU ms a round | wall ms a round |")
    print("|---|---|---|---|")
    for name, row in result["rows"].items():
        print(
            f"| {name} | {row['cpu_ms_per_round']:.3f} ({row['cpu_ms_range'][0]:.3f}-"
            f"{row['cpu_ms_range'][1]:.3f}) | {row['durable_cpu_ms_per_round']:.3f} | "
            f"{row['wall_ms_per_round']:.3f} ({row['wall_ms_range'][0]:.3f}-"
            f"{row['wall_ms_range'][1]:.3f}) |"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
