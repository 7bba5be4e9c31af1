"""Our federated averaging against TFF 0.87's, on the same data, in the same run.

The TFF EMNIST tutorial's configuration: every round the same cohort of N clients
(``--clients``, default 10 and 100) trains the softmax regression 784->10 (zero init)
for 5 epochs of batches of 5, without shuffling (so both systems see the same batches),
with client SGD 0.02 and server SGD 1.0, example-weighted. Each client holds 100
synthetic examples: 784 uniform float32 features and a uniform label in 0..9, seeded
as the anchor's own synthetic clients are (numpy ``default_rng(0)``; the first 10
clients are exactly the anchor's). Synthetic because scikit-learn's digits are 8x8 and
the timing depends only on the shapes; the losses are compared all the same.

For each N, the clients are written to a temporary ``.npz`` in the anchor's format
(``x_0..``, ``y_0..``) and three things are timed:

- TFF: ``../shared/anchors/tff_fedavg.py --clients FILE --no-shuffle`` in the TFF venv
  (``setup_tff_venv.sh`` finds or builds it; ``--skip-tff`` skips this part);
- ours, bare: ``build_weighted_fed_avg(...).next`` in a loop inside ``LocalContext``;
- ours, the whole program: ``train_model`` with a ``FileProgramStateManager``, CSV and
  TensorBoard metrics (grouped) and a ``ModelFileReleaseManager`` in a temporary
  directory. A round's time is the time between two consecutive metric releases.

Ours runs ``--repeats`` times (default 3), bare and program alternating, after a
2-round warm-up of the program that is not counted (its first releases import
tensorboardX, about 0.2 s holding the GIL, which would otherwise slow rounds 2-3 of the
first run). Every run builds a new process, so its first round traces and compiles
(XLA) again. Medians pool the rounds after the first of every run; the first rounds
are reported apart ("first", their median). The machine's own ceiling for the round
(``roofline.quick_ceiling``: the bare SGD math at these shapes, fastest formulation) is
measured in the same run, before ours; each median round (bare, program, TFF's) is
printed as a multiple of it ("x ceiling"). The losses of every round of every run must
agree with TFF's to 1e-5 relative, or the script exits with status 1. Prints a table,
then one JSON line with every number.

    python bench/fedavg_vs_tff.py [--clients 10 100] [--rounds R] [--skip-tff]
        [--workers 2] [--clients-per-group N] [--repeats 3]

In CI: ``python bench/fedavg_vs_tff.py --clients 10 --rounds 8 --repeats 1``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import roofline
from _tff_comparison import (
    ANCHORS,
    TOLERANCE,
    WARM_ROUNDS,
    first,
    json_lines_of,
    make_clients,
    max_relative_difference,
    positive,
    print_aligned,
    steady,
    tff_python,
    write_npz,
)

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    ModelFileReleaseManager,
    ReleaseManager,
    TensorBoardReleaseManager,
)
from managers.values import materialize
from programlogic import InMemoryDataSource, LocalContext, Sampling, train_model
from programlogic.datasets.preprocessing import Preprocessing
from programlogic.learning import build_weighted_fed_avg, sgd, softmax_regression


def run_tff(python: str, npz: Path, rounds: int) -> dict[str, Any]:
    """The anchor's JSON line for ``rounds`` rounds on the clients in ``npz``."""
    command = [
        python,
        str(ANCHORS / "tff_fedavg.py"),
        "--clients",
        str(npz),
        "--rounds",
        str(rounds),
        "--no-shuffle",
    ]
    return json_lines_of("fedavg_vs_tff", command)[-1]


def build_process(clients_per_group: int | None) -> Any:
    """Our FedAvg in the tutorial's configuration, without shuffling."""
    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (784,), 10),
        sgd(0.02),
        sgd(1.0),
        preprocess=Preprocessing(epochs=5, batch_size=5, shuffle_buffer=0),
        seed=0,
        clients_per_group=clients_per_group,
    )


def loss_of(metrics: Any) -> float:
    return float(metrics["client_work"]["train"]["loss"])


async def run_bare(
    source: InMemoryDataSource, rounds: int, workers: int, clients_per_group: int | None
) -> dict[str, Any]:
    """``process.next`` in a loop: seconds of each round and its loss."""
    process = build_process(clients_per_group)
    handles = source.all_clients()
    times, cpu_times, losses = [], [], []
    async with LocalContext(max_workers=workers):
        state = process.initialize()
        for _ in range(rounds):
            start, cpu_start = time.perf_counter(), time.process_time()
            output = await process.next(state, handles)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
            state = output.state
            losses.append(loss_of(output.metrics))
    return {"round_s": times, "round_cpu_s": cpu_times, "loss": losses}


class ReleaseTimes(ReleaseManager):
    """Hands each release on to ``inner``, then notes the time and loss of its key."""

    def __init__(self, inner: ReleaseManager) -> None:
        self.inner = inner
        self.times: dict[int, float] = {}
        self.cpu_times: dict[int, float] = {}
        self.losses: dict[int, float] = {}

    async def release(self, value: Any, key: int | str) -> None:
        await self.inner.release(value, key)
        if isinstance(key, int):
            self.times[key] = time.perf_counter()
            self.cpu_times[key] = time.process_time()
            self.losses[key] = loss_of(await materialize(value))

    async def aclose(self) -> None:
        await self.inner.aclose()


async def run_program(
    source: InMemoryDataSource,
    rounds: int,
    workers: int,
    clients_per_group: int | None,
    directory: Path,
) -> dict[str, Any]:
    """``train_model`` with file state, CSV + TensorBoard metrics and model files."""
    process = build_process(clients_per_group)
    async with (
        LocalContext(max_workers=workers),
        FileProgramStateManager(directory / "state", keep_total=3) as state_manager,
        ReleaseTimes(
            GroupingReleaseManager(
                [
                    CSVFileReleaseManager(directory / "metrics.csv"),
                    TensorBoardReleaseManager(directory / "tensorboard"),
                ]
            )
        ) as metrics,
    ):
        start, cpu_start = time.perf_counter(), time.process_time()
        await train_model(
            train_process=process,
            train_data_source=source,
            train_per_round_clients=len(source.client_ids),
            train_total_rounds=rounds,
            program_state_manager=state_manager,
            model_output_manager=ModelFileReleaseManager(directory / "models"),
            train_metrics_manager=metrics,
            seed=0,
        )
        total = time.perf_counter() - start
    keys = list(range(1, rounds + 1))
    stamps = [start] + [metrics.times[key] for key in keys]
    cpu_stamps = [cpu_start] + [metrics.cpu_times[key] for key in keys]
    # Round r's time: from round r-1's metric release to round r's.
    return {
        "round_s": [b - a for a, b in itertools.pairwise(stamps)],
        "round_cpu_s": [b - a for a, b in itertools.pairwise(cpu_stamps)],
        "loss": [metrics.losses[key] for key in keys],
        "total_s": total,
    }


def steady_mean(runs: list[dict[str, Any]], series: str = "round_s") -> float:
    """Mean milliseconds of the rounds after the first :data:`WARM_ROUNDS`, over ``runs``.

    A mean over many rounds, unlike a median of gaps between releases, does not depend
    on how releases bunch: it is the time the rounds took together.
    """
    return statistics.mean(t for run in runs for t in run[series][WARM_ROUNDS:]) * 1e3


async def measure(
    count: int, rounds: int, arguments: argparse.Namespace, tff: dict[str, Any] | None
) -> dict[str, Any]:
    """Our two timings on ``count`` clients, beside TFF's (``None`` when skipped)."""
    clients = make_clients(count)
    source = InMemoryDataSource(
        {f"client_{index:04d}": client for index, client in enumerate(clients)},
        sampling=Sampling.FIXED,
    )
    row: dict[str, Any] = {
        "clients": count,
        "rounds": rounds,
        "workers": arguments.workers,
        "clients_per_group": arguments.clients_per_group,
    }
    workers, group = arguments.workers, arguments.clients_per_group
    with tempfile.TemporaryDirectory(prefix="fedavg_vs_tff_") as scratch:
        # Warm-up, not counted: the first releases import tensorboardX (about 0.2 s that
        # hold the GIL while round 2 trains) and open files for the first time.
        await run_program(source, 2, workers, group, Path(scratch) / "warm_up")
        bares, programs = [], []
        for repeat in range(arguments.repeats):  # alternate, as the machine's speed drifts
            bares.append(await run_bare(source, rounds, workers, group))
            programs.append(
                await run_program(source, rounds, workers, group, Path(scratch) / str(repeat))
            )
    row.update(
        repeats=arguments.repeats,
        ours_bare_first_ms=first(bares),
        ours_bare_median_ms=steady(bares),
        ours_program_first_ms=first(programs),
        ours_program_median_ms=steady(programs),
        ours_bare_round_ms=[[t * 1e3 for t in run["round_s"]] for run in bares],
        ours_program_round_ms=[[t * 1e3 for t in run["round_s"]] for run in programs],
        ours_loss=bares[0]["loss"],
        program_vs_bare_loss_rel_diff=max(
            max_relative_difference(run["loss"], bares[0]["loss"]) for run in bares + programs
        ),
    )
    row.update(ours_bare_mean_ms=steady_mean(bares), ours_program_mean_ms=steady_mean(programs))
    row["program_overhead_pct"] = 100 * (row["ours_program_mean_ms"] / row["ours_bare_mean_ms"] - 1)
    # Each program run against the bare run just before it: the machine's speed drifts
    # between repeats, and a pair sees the same drift.
    row["paired_overhead_pct"] = [
        100 * (steady_mean([program]) / steady_mean([bare]) - 1)
        for bare, program in zip(bares, programs, strict=True)
    ]
    row["paired_overhead_median_pct"] = statistics.median(row["paired_overhead_pct"])
    # CPU seconds of this process per round: what the program adds to the work of a round,
    # measured so that other processes competing for the cores barely move it.
    row.update(
        ours_bare_cpu_ms=steady_mean(bares, "round_cpu_s"),
        ours_program_cpu_ms=steady_mean(programs, "round_cpu_s"),
    )
    row["program_cpu_overhead_pct"] = 100 * (
        row["ours_program_cpu_ms"] / row["ours_bare_cpu_ms"] - 1
    )
    if tff is not None:
        row.update(
            tff_build_init_s=tff["build_init_s"],
            tff_first_ms=first([tff]),
            tff_median_ms=steady([tff]),
            tff_round_ms=[t * 1e3 for t in tff["round_s"]],
            tff_loss=tff["loss"],
            loss_rel_diff=max(
                max_relative_difference(run["loss"], tff["loss"]) for run in bares + programs
            ),
        )
        row["speedup_bare"] = row["tff_median_ms"] / row["ours_bare_median_ms"]
        row["speedup_program"] = row["tff_median_ms"] / row["ours_program_median_ms"]
    return row


ROUNDS = ("ours_bare", "ours_program", "tff")  # the {name}_median_ms read against the ceiling


def print_table(rows: list[dict[str, Any]]) -> None:
    def number(row: dict[str, Any], key: str, form: str) -> str:
        return format(row[key], form) if key in row else "-"

    header = (
        "clients/round",
        "rounds",
        "TFF median ms",
        "ours bare ms",
        "ours train_model ms",
        "speedup bare",
        "speedup train_model",
        "ceiling ms: x ceiling bare/program/TFF",
        "overhead % (means)",
        "paired median %",
        "CPU overhead %",
        "loss max rel diff",
        "first ms TFF/bare/program",
    )
    table = [header]
    for row in rows:
        first = "/".join(
            number(row, key, ".0f")
            for key in ("tff_first_ms", "ours_bare_first_ms", "ours_program_first_ms")
        )
        table.append(
            (
                str(row["clients"]),
                str(row["rounds"]),
                number(row, "tff_median_ms", ".1f"),
                number(row, "ours_bare_median_ms", ".1f"),
                number(row, "ours_program_median_ms", ".1f"),
                number(row, "speedup_bare", ".1f"),
                number(row, "speedup_program", ".1f"),
                roofline.multiples_text(row, ROUNDS),
                number(row, "program_overhead_pct", "+.1f"),
                number(row, "paired_overhead_median_pct", "+.1f"),
                number(row, "program_cpu_overhead_pct", "+.1f"),
                number(row, "loss_rel_diff", ".2e"),
                first,
            )
        )
    print_aligned(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=positive, nargs="+", default=[10, 100])
    parser.add_argument(
        "--rounds", type=positive, default=None, help="default: 30 for <= 10 clients, else 10"
    )
    parser.add_argument("--skip-tff", action="store_true", help="time ours only")
    parser.add_argument("--workers", type=positive, default=2, help="LocalContext max_workers")
    parser.add_argument(
        "--clients-per-group",
        type=positive,
        help="clients in one compiled call (default: the round split over the workers)",
    )
    parser.add_argument(
        "--repeats", type=positive, default=3, help="runs of ours, each bare then train_model"
    )
    arguments = parser.parse_args()
    if arguments.rounds is not None and arguments.rounds <= WARM_ROUNDS:
        parser.error(
            f"--rounds must be at least {WARM_ROUNDS + 1}: the first {WARM_ROUNDS} rounds "
            "are left out of the overhead"
        )
    python = None if arguments.skip_tff else tff_python("fedavg_vs_tff")
    rows = []
    for count in arguments.clients:
        rounds = arguments.rounds or (30 if count <= 10 else 10)
        tff = None
        if python is not None:
            with tempfile.TemporaryDirectory(prefix="fedavg_vs_tff_") as scratch:
                npz = Path(scratch) / "clients.npz"
                write_npz(npz, make_clients(count))
                tff = run_tff(python, npz, rounds)
        ceiling = roofline.quick_ceiling(count)  # before ours, in this process
        row = anyio.run(measure, count, rounds, arguments, tff)
        roofline.read_against(row, ceiling, ROUNDS)
        rows.append(row)
        print(
            f"# {count} clients done: ours {row['ours_bare_median_ms']:.1f} ms/round, "
            f"{row['ours_bare_vs_ceiling']:.2f}x the ceiling ({row['ceiling_ms']:.2f} ms)",
            file=sys.stderr,
            flush=True,
        )
    print_table(rows)
    failed = [row["clients"] for row in rows if row.get("loss_rel_diff", 0.0) > TOLERANCE]
    print(
        json.dumps(
            {
                "benchmark": "fedavg vs tff",
                "data": "synthetic, 100 examples of 784 uniform float32 per client, seed 0",
                "tolerance": TOLERANCE,
                "losses_agree": not failed,
                "rows": rows,
            }
        )
    )
    if failed:
        sys.exit(
            f"fedavg_vs_tff: losses differ from TFF's by more than {TOLERANCE} relative "
            f"at {failed} clients"
        )


if __name__ == "__main__":
    main()
