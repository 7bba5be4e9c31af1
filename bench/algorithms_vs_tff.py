"""Our learning algorithms against TFF 0.87's, on the same data, in the same run.

``fedavg_vs_tff.py`` extended to the other algorithms both systems build (described
once, for both sides, in ``_algorithms.py``):

- FedAvg with server SGD momentum 0.9, Adam, Adagrad and Yogi
  (``build_weighted_fed_avg`` with TFF's ``build_sgdm/build_adam/build_adagrad/build_yogi``
  and our ``sgd/adam/adagrad/yogi``);
- unweighted FedAvg (``build_unweighted_fed_avg``);
- FedProx (``build_weighted_fed_prox``, strength 0.1 in TFF's sign: TFF 0.87 adds
  ``strength * (w_server - w)`` to client gradients, the opposite of the proximal term's
  gradient, so ours is :class:`~programlogic.learning.FedProx` with the strength
  negated, which only the class accepts);
- FedSGD (``build_fed_sgd``);
- FedAvg whose client deltas are clipped to an L2 global norm before the weighted mean
  (TFF's ``model_aggregator=clipping_factory(norm, MeanFactory())``, our
  ``model_aggregator=clipping(norm)``); the number of clients clipped each round must
  be TFF's too.

The clients are ``fedavg_vs_tff.py``'s (N synthetic clients of 100 examples, 784
uniform float32 features, seed 0; all of equal size, so unweighted FedAvg computes the
weighted one's numbers by another path). Every round trains all of them, each on its
examples repeated for 5 epochs in batches of 5 without shuffling (so both systems see
the same batches), client SGD 0.02, from the zero-initialized 784->10 softmax regression.

For each algorithm in turn: TFF's process runs ``--rounds`` rounds in the TFF venv
(``_tff_algorithms.py --serve``, one Python process for all the algorithms, each
algorithm a new TFF process; ``$PROGRAMLOGIC_TFF_PYTHON`` or else
``../shared/anchors/setup_tff_venv.sh`` gives its Python; ``--skip-tff`` skips it), then
ours runs them ``--repeats`` times: a new process each time, bare ``process.next`` in a
loop inside ``LocalContext``. TFF and ours alternate algorithm by algorithm, so both
see the machine at about the same moment. A round's time is its ``next`` call; the
medians are of the rounds after the first (TFF traces, ours compiles with XLA, in the
first), pooled over the repeats; the first rounds are reported apart (ours: of the
first repeat; later ones, and processes of an algorithm with the same model, loss,
metrics, client optimizer and aggregator as an earlier one, reuse its compiled
function). Every round's
loss (``client_work/train/loss``) of every run of ours must agree with TFF's to 1e-5
relative, or the script exits with status 1. Prints a table, then one JSON line with
every number.

    python bench/algorithms_vs_tff.py [--algorithms NAME ...] [--clients 10]
        [--rounds 30] [--repeats 3] [--workers 2] [--skip-tff]

The defaults take 2.7 minutes (3.8 under heavy load). In CI (1.5 minutes under load):
``python bench/algorithms_vs_tff.py --rounds 3 --repeats 1``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
from _algorithms import ALGORITHMS, BATCH_SIZE, CLIENT_RATE, EPOCHS, Algorithm, Optimizer
from _tff_comparison import (
    TOLERANCE,
    AnchorSession,
    anchor_session,
    first,
    make_clients,
    max_relative_difference,
    positive,
    print_aligned,
    steady,
    tff_python,
    write_npz,
)

import programlogic.learning as learning
from programlogic import InMemoryDataSource, LocalContext, Sampling
from programlogic.datasets.preprocessing import Preprocessing
from programlogic.learning import (
    FedProx,
    FunctionalModel,
    build_fed_sgd,
    build_unweighted_fed_avg,
    build_weighted_fed_avg,
    softmax_regression,
)
from programlogic.learning.keras_model import DEFAULT_LOSS
from programlogic.privacy import GaussianMechanism

PROGRAM = "algorithms_vs_tff"
TFF_SCRIPT = Path(__file__).with_name("_tff_algorithms.py")
TARGET_SPEEDUP = 10.0
METRICS = ("sparse_categorical_accuracy",)


def our_optimizer(spec: Optimizer) -> learning.Optimizer:
    """``programlogic.learning``'s ``sgd``, ``adam``, ``adagrad`` or ``yogi``."""
    rule, learning_rate, keywords = spec
    return getattr(learning, rule)(learning_rate, **keywords)


def build_ours(algorithm: Algorithm, clients_per_group: int | None, num_clients: int) -> Any:
    """Our process for ``algorithm``, configured as ``_tff_algorithms.build`` builds TFF's."""
    model_fn = functools.partial(softmax_regression, (784,), 10)
    preprocess = Preprocessing(epochs=EPOCHS, batch_size=BATCH_SIZE, shuffle_buffer=0)
    common: dict[str, Any] = {
        "preprocess": preprocess,
        "seed": 0,
        "clients_per_group": clients_per_group,
    }
    server = our_optimizer(algorithm.server)
    if algorithm.builder == "fed_sgd":
        return build_fed_sgd(model_fn, server, **common)
    client = our_optimizer(algorithm.client)
    if algorithm.builder == "weighted_fed_prox":
        # TFF's sign: our FedProx with the strength negated (the builders refuse it).
        return FedProx(
            FunctionalModel(model_fn, DEFAULT_LOSS, METRICS),
            client,
            server,
            preprocess,
            0,
            clients_per_group,
            proximal_strength=-float(algorithm.proximal_strength or 0.0),
            client_weighting="num_examples",
        )
    if algorithm.private:
        cohort = GaussianMechanism(0.0, num_clients, num_clients, sampling="fixed")
        common["model_aggregator"] = learning.dp_mean(cohort, algorithm.clip_norm, delta=1e-5)
    elif algorithm.clip_norm is not None:
        common["model_aggregator"] = learning.clipping(algorithm.clip_norm)
    if algorithm.builder == "weighted_fed_avg":
        return build_weighted_fed_avg(model_fn, client, server, **common)
    if algorithm.builder == "unweighted_fed_avg":
        return build_unweighted_fed_avg(model_fn, client, server, **common)
    raise ValueError(f"unknown builder {algorithm.builder!r}")


async def run_ours(
    algorithm: Algorithm,
    source: InMemoryDataSource,
    rounds: int,
    workers: int,
    clients_per_group: int | None,
) -> dict[str, Any]:
    """A new process of ours, ``rounds`` bare ``next`` calls: each one's seconds and loss."""
    handles = source.all_clients()
    process = build_ours(algorithm, clients_per_group, len(handles))
    result: dict[str, Any] = {"round_s": [], "loss": []}
    async with LocalContext(max_workers=workers):
        state = process.initialize()
        for _ in range(rounds):
            start = time.perf_counter()
            output = await process.next(state, handles)
            result["round_s"].append(time.perf_counter() - start)
            state = output.state
            result["loss"].append(float(output.metrics["client_work"]["train"]["loss"]))
            if algorithm.counts_clipped:
                clipped = output.metrics["aggregator"]["clipped_count"]
                result.setdefault("clipped_count", []).append(int(clipped))
    return result


def compare(
    algorithm: Algorithm, arguments: argparse.Namespace, tff_session: AnchorSession | None
) -> dict[str, Any]:
    """TFF's run then ours on ``algorithm``: the row of the table (and of the JSON)."""
    row: dict[str, Any] = {"algorithm": algorithm.name, "label": algorithm.label}
    row["configuration"] = {
        "builder": algorithm.builder,
        "client_optimizer": list(algorithm.client),
        "server_optimizer": list(algorithm.server),
        "proximal_strength_tff_sign": algorithm.proximal_strength,
        "clip_norm": algorithm.clip_norm,
    }
    tff = None if tff_session is None else tff_session.ask(algorithm.name)
    source = InMemoryDataSource(
        {
            f"client_{index:04d}": client
            for index, client in enumerate(make_clients(arguments.clients))
        },
        sampling=Sampling.FIXED,
    )
    runs = [
        anyio.run(
            run_ours,
            algorithm,
            source,
            arguments.rounds,
            arguments.workers,
            arguments.clients_per_group,
        )
        for _ in range(arguments.repeats)
    ]
    if "clipped_count" in runs[0]:
        row["ours_clipped_count"] = runs[0]["clipped_count"]
    row.update(
        ours_first_ms=first(runs[:1]),  # later repeats reuse the compiled function
        ours_median_ms=steady(runs) if arguments.rounds > 1 else None,
        ours_round_ms=[[t * 1e3 for t in run["round_s"]] for run in runs],
        ours_loss=runs[0]["loss"],
        repeats_loss_rel_diff=max(
            max_relative_difference(run["loss"], runs[0]["loss"]) for run in runs
        ),
    )
    if tff is not None:
        row.update(
            tff_build_init_s=tff["build_init_s"],
            tff_first_ms=first([tff]),
            tff_median_ms=steady([tff]) if arguments.rounds > 1 else None,
            tff_round_ms=[t * 1e3 for t in tff["round_s"]],
            tff_loss=tff["loss"],
            loss_rel_diff=max(max_relative_difference(run["loss"], tff["loss"]) for run in runs),
        )
        if "clipped_count" in tff:
            row["tff_clipped_count"] = tff["clipped_count"]
            row["clipped_counts_agree"] = all(
                run["clipped_count"] == tff["clipped_count"] for run in runs
            )
        if row["tff_median_ms"] is not None:
            row["speedup"] = row["tff_median_ms"] / row["ours_median_ms"]
    return row


def clipped_cell(row: dict[str, Any]) -> str:
    """Clipped clients over all rounds, TFF's then ours in parentheses when they differ."""
    cells = []
    for key in ("tff_clipped_count", "ours_clipped_count"):
        if key in row:
            counts = row[key]
            cells.append(f"{sum(counts)} in {sum(1 for c in counts if c)} rounds")
    if len(cells) == 2 and row["tff_clipped_count"] == row["ours_clipped_count"]:
        return cells[0] + " (same)"
    return cells[0] if len(cells) == 1 else f"{cells[0]} ({cells[1]})"


def print_table(rows: list[dict[str, Any]]) -> None:
    def number(row: dict[str, Any], key: str, form: str) -> str:
        value = row.get(key)
        return "-" if value is None else format(value, form)

    header = (
        "algorithm",
        "TFF median ms",
        "ours median ms",
        "speed-up",
        "loss max rel diff",
        "first ms TFF/ours",
        "clipped clients TFF (ours)",
    )
    table = [header]
    for row in rows:
        speedup = number(row, "speedup", ".1f")
        if row.get("speedup") is not None and row["speedup"] < TARGET_SPEEDUP:
            speedup += " (<10x)"
        clipped = row.get("tff_clipped_count", row.get("ours_clipped_count"))
        table.append(
            (
                row["algorithm"],
                number(row, "tff_median_ms", ".1f"),
                number(row, "ours_median_ms", ".1f"),
                speedup,
                number(row, "loss_rel_diff", ".2e"),
                f"{number(row, 'tff_first_ms', '.0f')}/{number(row, 'ours_first_ms', '.0f')}",
                "-" if clipped is None else clipped_cell(row),
            )
        )
    print_aligned(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--algorithms", nargs="+", choices=list(ALGORITHMS), default=list(ALGORITHMS)
    )
    parser.add_argument("--clients", type=positive, default=10, help="clients, all every round")
    parser.add_argument("--rounds", type=positive, default=30)
    parser.add_argument("--repeats", type=positive, default=3, help="runs of ours per algorithm")
    parser.add_argument("--workers", type=positive, default=2, help="LocalContext max_workers")
    parser.add_argument(
        "--clients-per-group",
        type=positive,
        help="clients in one compiled call (default: the round split over the workers)",
    )
    parser.add_argument("--skip-tff", action="store_true", help="time ours only")
    arguments = parser.parse_args()
    rows = []
    with contextlib.ExitStack() as stack:
        tff_session = None
        if not arguments.skip_tff:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{PROGRAM}_"))
            npz = Path(scratch) / "clients.npz"
            write_npz(npz, make_clients(arguments.clients))
            command = [tff_python(PROGRAM), str(TFF_SCRIPT), "--clients", str(npz)]
            command += ["--rounds", str(arguments.rounds), "--serve"]
            tff_session = stack.enter_context(anchor_session(PROGRAM, command))
        for name in arguments.algorithms:
            row = compare(ALGORITHMS[name], arguments, tff_session)
            rows.append(row)
            print(f"# {name}: done", file=sys.stderr, flush=True)
    print_table(rows)
    failed = [
        row["algorithm"]
        for row in rows
        if row.get("loss_rel_diff", 0.0) > TOLERANCE or not row.get("clipped_counts_agree", True)
    ]
    slow = [row["algorithm"] for row in rows if row.get("speedup", TARGET_SPEEDUP) < TARGET_SPEEDUP]
    print(
        json.dumps(
            {
                "benchmark": "algorithms vs tff",
                "data": "synthetic, 100 examples of 784 uniform float32 per client, seed 0",
                "clients": arguments.clients,
                "rounds": arguments.rounds,
                "repeats": arguments.repeats,
                "workers": arguments.workers,
                "clients_per_group": arguments.clients_per_group,
                "epochs": EPOCHS,
                "batch_size": BATCH_SIZE,
                "client_rate": CLIENT_RATE,
                "tolerance": TOLERANCE,
                "losses_agree": not failed,
                "below_target_speedup": slow,
                "rows": rows,
            }
        )
    )
    if failed:
        sys.exit(
            f"{PROGRAM}: losses differ from TFF's by more than {TOLERANCE} relative, or "
            f"clipped counts differ: {failed}"
        )


if __name__ == "__main__":
    main()
