"""What a round's durable work costs: CPU time per round of file state, CSV and TensorBoard.

Runs ``train_model`` with a process that computes nothing (its state is the softmax
layer's 7,850 float32 weights, returned unchanged) so that a round's CPU time is the
program's own. Three configurations alternate, ``--repeats`` times each:

- ``memory``: memory state and metrics managers, the baseline;
- ``every round``: a ``FileProgramStateManager`` (fsync'd saves) and metrics to a CSV
  file and TensorBoard (grouped), a checkpoint every round;
- ``every 10``: the same with ``checkpoint_every=10``.

The durable CPU time per round is a configuration's process CPU time per round (all
threads) less the baseline's; the wall-clock time per round beside it.

Then the same three configurations around a real round: the tutorial FedAvg of
``bench/fedavg_vs_tff.py`` at 10 clients, ``--fedavg-rounds`` rounds a run (0 skips
it), alternating ``--repeats`` times. A run's round time is the time from its
``WARM_ROUNDS``-th metric release to its last, over the rounds between; the overhead of
a durable configuration is its round time over the memory run's of the same repeat.

Prints two tables, then one JSON line with medians and the (min, max) over repeats.

    python bench/durable_cost.py [--rounds 1000] [--repeats 5] [--fedavg-rounds 60]

``--against REF`` compares this tree with the code of the git revision ``REF`` in the
same run: it checks ``REF`` out in a temporary worktree (with this tree's built
extensions) and runs both trees' own ``bench/durable_cost.py`` as processes, alternating,
``--repeats`` pairs of one repeat each; then prints, per configuration, both sides'
durable CPU a round and wall overhead around FedAvg, medians over the pairs. That is
how the cost of a change to the durable path (such as how writes are batched) is shown.

    python bench/durable_cost.py --against HEAD~1 [--repeats 5] ...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from _tff_comparison import WARM_ROUNDS, make_clients

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    TensorBoardReleaseManager,
)
from programlogic import (
    InMemoryDataSource,
    LearningProcessOutput,
    LocalContext,
    Sampling,
    train_model,
)
from programlogic.testing import FakeDataSource

CONFIGURATIONS = ("memory", "every round", "every 10")
ROOT = Path(__file__).resolve().parent.parent


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


def managers_of(configuration: str, directory: Path) -> tuple[Any, Any]:
    """The state and metrics managers of ``configuration``."""
    if configuration == "memory":
        return MemoryProgramStateManager(keep_total=3), MemoryReleaseManager(max_entries=100)
    state = FileProgramStateManager(directory / "state", keep_total=3)
    metrics = GroupingReleaseManager(
        [
            CSVFileReleaseManager(directory / "metrics.csv"),
            TensorBoardReleaseManager(directory / "tensorboard"),
        ]
    )
    return state, metrics


async def train(
    configuration: str, process: Any, source: Any, rounds: int, state: Any, metrics: Any
) -> None:
    """``rounds`` rounds of ``process`` at 10 clients, saved as ``configuration`` says."""
    await train_model(
        train_process=process,
        train_data_source=source,
        train_per_round_clients=10,
        train_total_rounds=rounds,
        program_state_manager=state,
        model_output_manager=MemoryReleaseManager(max_entries=1),
        train_metrics_manager=metrics,
        checkpoint_every=10 if configuration == "every 10" else 1,
    )


async def one_run(configuration: str, rounds: int, directory: Path) -> tuple[float, float]:
    """CPU seconds and wall seconds of ``rounds`` rounds in ``configuration``."""
    state, metrics = managers_of(configuration, directory)
    async with LocalContext(), state, metrics:
        cpu, wall = time.process_time(), time.perf_counter()
        await train(configuration, StillProcess(), FakeDataSource(100), rounds, state, metrics)
        return time.process_time() - cpu, time.perf_counter() - wall


async def one_fedavg_run(
    configuration: str, rounds: int, source: InMemoryDataSource, directory: Path
) -> float:
    """Wall milliseconds of a FedAvg round at 10 clients in ``configuration``, after warm-up."""
    from fedavg_vs_tff import ReleaseTimes, build_process  # TensorFlow: only for this part

    state, metrics = managers_of(configuration, directory)
    timed = ReleaseTimes(metrics)
    async with LocalContext(), state, timed:
        await train(configuration, build_process(None), source, rounds, state, timed)
    steady = timed.times[rounds] - timed.times[WARM_ROUNDS]
    return steady / (rounds - WARM_ROUNDS) * 1e3


async def measure_fedavg(rounds: int, repeats: int) -> dict[str, Any]:
    """Per configuration, the FedAvg round's wall milliseconds and overhead % by repeat."""
    clients = make_clients(10)
    source = InMemoryDataSource(
        {f"client_{index:04d}": client for index, client in enumerate(clients)},
        sampling=Sampling.FIXED,
    )
    wall: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    for _ in range(repeats):
        for name in CONFIGURATIONS:
            with tempfile.TemporaryDirectory() as directory:
                wall[name].append(await one_fedavg_run(name, rounds, source, Path(directory)))
    rows = {}
    for name in CONFIGURATIONS:
        overheads = [
            100 * (ms / base - 1) for ms, base in zip(wall[name], wall["memory"], strict=True)
        ]
        rows[name] = {
            "round_ms": round(statistics.median(wall[name]), 3),
            "round_ms_range": [round(min(wall[name]), 3), round(max(wall[name]), 3)],
            "overhead_pct": round(statistics.median(overheads), 2),
            "overhead_pct_range": [round(min(overheads), 2), round(max(overheads), 2)],
        }
    return {"clients": 10, "rounds": rounds, "repeats": repeats, "rows": rows}


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


def run_tree(tree: Path, rounds: int, fedavg_rounds: int) -> dict[str, Any]:
    """One repeat of ``tree``'s own ``bench/durable_cost.py``, in a process of its own."""
    command = [sys.executable, str(tree / "bench" / "durable_cost.py"), "--rounds", str(rounds)]
    command += ["--repeats", "1", "--fedavg-rounds", str(fedavg_rounds)]
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {tree}:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def compare(against: str, rounds: int, pairs: int, fedavg_rounds: int) -> dict[str, Any]:
    """Both trees' figures, ``pairs`` alternating pairs; medians and ranges per side."""
    with tempfile.TemporaryDirectory() as scratch:
        baseline = Path(scratch) / "baseline"
        git = ["git", "-C", str(ROOT)]
        subprocess.run(
            [*git, "worktree", "add", "--detach", "-q", str(baseline), against], check=True
        )
        try:
            for built in ROOT.glob("programlogic/**/*.so"):
                shutil.copy2(built, baseline / built.relative_to(ROOT))
            runs: dict[str, list[dict[str, Any]]] = {"this tree": [], against: []}
            for _ in range(pairs):
                runs["this tree"].append(run_tree(ROOT, rounds, fedavg_rounds))
                runs[against].append(run_tree(baseline, rounds, fedavg_rounds))
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(baseline)], check=True)
    sides = {}
    for side, results in runs.items():
        row = {}
        for name in CONFIGURATIONS:
            durable = [result["rows"][name]["durable_cpu_ms_per_round"] for result in results]
            row[name] = {"durable_cpu_ms": _spread(durable, 4)}
            if fedavg_rounds:
                overhead = [result["fedavg"]["rows"][name]["overhead_pct"] for result in results]
                row[name]["fedavg_overhead_pct"] = _spread(overhead, 2)
        sides[side] = row
    return {
        "benchmark": "durable cost against",
        "against": against,
        "pairs": pairs,
        "rounds": rounds,
        "fedavg_rounds": fedavg_rounds,
        "sides": sides,
    }


def _spread(values: list[float], digits: int) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "range": [round(min(values), digits), round(max(values), digits)],
    }


def print_comparison(result: dict[str, Any]) -> None:
    print("| configuration | side | durable CPU ms a round | FedAvg wall overhead |")
    print("|---|---|---|---|")
    for name in CONFIGURATIONS[1:]:
        for side, rows in result["sides"].items():
            cpu = rows[name]["durable_cpu_ms"]
            cells = f"{cpu['median']:.3f} ({cpu['range'][0]:.3f}-{cpu['range'][1]:.3f})"
            overhead = rows[name].get("fedavg_overhead_pct")
            wall = (
                ""
                if overhead is None
                else (
                    f"{overhead['median']:+.1f} % ({overhead['range'][0]:+.1f} to "
                    f"{overhead['range'][1]:+.1f})"
                )
            )
            print(f"| {name} | {side} | {cells} | {wall} |")
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fedavg-rounds", type=int, default=60)
    parser.add_argument("--against", metavar="REF", help="compare with git revision REF")
    arguments = parser.parse_args()
    if arguments.fedavg_rounds and arguments.fedavg_rounds <= WARM_ROUNDS + 1:
        parser.error(f"--fedavg-rounds must be 0 or more than {WARM_ROUNDS + 1}")
    if arguments.against:
        print_comparison(
            compare(arguments.against, arguments.rounds, arguments.repeats, arguments.fedavg_rounds)
        )
        return
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
    if arguments.fedavg_rounds:
        fedavg = anyio.run(measure_fedavg, arguments.fedavg_rounds, arguments.repeats)
        result["fedavg"] = fedavg
        print("\n| FedAvg, 10 clients | wall ms a round | overhead over memory managers |")
        print("|---|---|---|")
        for name, row in fedavg["rows"].items():
            low, high = row["overhead_pct_range"]
            print(
                f"| {name} | {row['round_ms']:.2f} ({row['round_ms_range'][0]:.2f}-"
                f"{row['round_ms_range'][1]:.2f}) | {row['overhead_pct']:+.1f} % "
                f"({low:+.1f} to {high:+.1f}) |"
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
