"""Held-out accuracy of FedAvg, FedAvgM, FedAdam, FedYogi and FedProx, Reddi et al. style.

What is measured: for each data set and algorithm, the MLP (``programlogic.learning.mlp``:
flatten, 128 ReLU units, softmax) is trained for ``--rounds`` rounds of
``--clients-per-round`` clients on every cell of a 3x3 grid of client and server
learning rates; the final model's accuracy on the held-out data is computed centrally
(the trained weights set on a Keras model, which predicts on all the held-out
examples). The table reports, per data set and algorithm, the best cell's accuracy and
its rates; a rate at the edge of its grid is marked ``*`` (the best may lie outside).

Data sets (``--datasets``):

- ``digits``: scikit-learn's digits split by writer (``load_digits_writers``): the 10
  training writers are the clients, the 4 held-out writers (510 digits) the test set;
  a round takes ``min(--clients-per-round, 10)`` writers;
- ``fmnist_dir0.1`` and ``fmnist_dir1.0``: Fashion-MNIST's 60,000 training images over
  100 clients with Dirichlet(0.1) or Dirichlet(1.0) label skew (``load_fashion_mnist``,
  partition seed 0); the test set is Fashion-MNIST's own 10,000 test images.

Every client trains 1 epoch of batches of 20 (shuffle buffer 100) with SGD at the client
learning rate. Servers (the main job's, ``samples/_job_algorithms.py``): FedAvg and
FedProx SGD, FedAvgM SGD with momentum 0.9, FedAdam and FedYogi Adam and Yogi with
epsilon 1e-3; FedProx's mu is 0.01. The grids (:data:`CLIENT_LRS`, :data:`SERVER_LRS`):
client lr {0.03, 0.1, 0.3} for all; server lr {0.3, 1, 3} for FedAvg and FedProx, {0.1,
0.3, 1} for FedAvgM (a steady step is 10x the rate), {0.001, 0.01, 0.1} for FedAdam and
FedYogi (Reddi et al.'s best server rates were in that range). ``--grid center`` runs
only the middle cell; ``--grid best --seed N`` runs again, with seed N, the best cell
of each data set and algorithm found with the default seed 0 (the table then adds the
mean and range over the seeds: how much of a difference is noise). ``--seed`` seeds
the model's initial weights, the Fashion-MNIST partition, the client sampling and the
client shuffles.

``--poisoning`` measures the robust aggregators instead (``--poisoning-datasets``, all
three by default): FedAvg (client SGD 0.1, server SGD 1.0, the grid's middle cell) with
the ``model_aggregator`` ``mean()``, ``median()`` or ``trimmed_mean(0.2)``, without
attack and with 20 % of every round's clients attacking. The attacker pool is the first
20 % of the training clients by id (writers 00-01; Fashion-MNIST clients 000-019) and
every round's cohort takes 20 % from it and 80 % from the others (2 + 8 of 10, drawn
with the run's seed; the no-attack cells train on the same cohorts). An attacker sends
its honest update (the delta ``initial - trained``) times -10 (``scaled``) or times -1
(``sign_flipped``), with its true example count as weight: :class:`Attack`, a
``ClientTransform`` in front of the aggregator, multiplies the first 2 rows of the
round's one group, where the cohort puts the attackers; the run checks that it counted
2 attacked clients a round.

Results are appended to ``--out`` (JSON) after every cell; a cell already there (same
data set, algorithm, rates, rounds, clients per round, seed) is skipped, so a long run
resumes where it stopped. The script prints each cell, then the Markdown tables of
``--out`` for ``--rounds`` and ``--seed``.

    python bench/studies/quality_table.py [--rounds 100] [--clients-per-round 10]
        [--datasets digits fmnist_dir0.1 fmnist_dir1.0]
        [--algorithms fedavg fedavgm fedadam fedyogi fedprox] [--grid full|center|best]
        [--seed 0] [--out bench/results/quality_table.json] [--table-only]
    python bench/studies/quality_table.py --poisoning [--poisoning-datasets ...] [--rounds 100]

Not run in CI (the full table is about half an hour of two cores);
``tests/bench/test_quality_table_script.py`` runs a 2-round, one-cell form.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import numpy as np

REPO = Path(__file__).resolve().parents[2]

import tensorflow as tf  # noqa: E402

from programlogic import LocalContext  # noqa: E402
from programlogic.data import ClientSampler  # noqa: E402
from programlogic.datasets import (  # noqa: E402
    FederatedData,
    Preprocessing,
    load_digits_writers,
    load_fashion_mnist,
)
from programlogic.learning import (  # noqa: E402
    ClientTransform,
    ModelAggregator,
    adam,
    build_weighted_fed_avg,
    build_weighted_fed_prox,
    mean,
    median,
    mlp,
    sgd,
    trimmed_mean,
    yogi,
)

SERVER_MOMENTUM = 0.9
"""FedAvgM's server momentum, as the main job's (``samples/_job_algorithms.py``)."""
ADAPTIVITY = 1e-3
"""FedAdam's and FedYogi's epsilon, as the main job's."""

DATASETS = ("digits", "fmnist_dir0.1", "fmnist_dir1.0")
ALGORITHMS = ("fedavg", "fedavgm", "fedadam", "fedyogi", "fedprox")


def server_optimizer(algorithm: str, learning_rate: float) -> Any:
    """The server optimizer of ``algorithm`` with ``learning_rate``, as the main job's."""
    if algorithm == "fedavgm":
        return sgd(learning_rate, momentum=SERVER_MOMENTUM)
    if algorithm == "fedadam":
        return adam(learning_rate, epsilon=ADAPTIVITY)
    if algorithm == "fedyogi":
        return yogi(learning_rate, epsilon=ADAPTIVITY)
    return sgd(learning_rate)


CLIENT_LRS = (0.03, 0.1, 0.3)
"""The client SGD learning rates of the grid, for every algorithm."""
SERVER_LRS = {
    "fedavg": (0.3, 1.0, 3.0),
    "fedprox": (0.3, 1.0, 3.0),
    "fedavgm": (0.1, 0.3, 1.0),
    "fedadam": (0.001, 0.01, 0.1),
    "fedyogi": (0.001, 0.01, 0.1),
}
"""The server learning rates of the grid, per algorithm."""
PROXIMAL_STRENGTH = 0.01
EPOCHS = 1
BATCH_SIZE = 20
SHUFFLE_BUFFER = 100
DEFAULT_SEED = 0
FASHION_CLIENTS = 100
DEFAULT_OUT = REPO / "bench" / "results" / "quality_table.json"


def load_dataset(name: str, seed: int) -> FederatedData:
    """The federated data set ``name`` (one of :data:`DATASETS`); ``seed`` draws the
    Dirichlet partition of Fashion-MNIST."""
    if name == "digits":
        return load_digits_writers()
    if name.startswith("fmnist_dir"):
        alpha = float(name.removeprefix("fmnist_dir"))
        return load_fashion_mnist(FASHION_CLIENTS, alpha=alpha, seed=seed)
    raise ValueError(f"unknown data set {name!r}")


def held_out_arrays(data: FederatedData) -> tuple[np.ndarray, np.ndarray]:
    """All the held-out examples of ``data``, concatenated (x, y)."""
    parts = [handle.load() for handle in data.test.all_clients()]
    x = np.concatenate([np.asarray(part.x, dtype=np.float32) for part in parts])
    y = np.concatenate([np.asarray(part.y) for part in parts])
    return x, y


def held_out_accuracy(
    model_fn: Callable[[], Any], weights: dict[str, Any], x: np.ndarray, y: np.ndarray
) -> float:
    """Accuracy on ``(x, y)`` of the model ``model_fn`` builds, holding ``weights``."""
    model = model_fn()
    for variable, value in zip(model.trainable_variables, weights["trainable"], strict=True):
        variable.assign(value)
    for variable, value in zip(
        model.non_trainable_variables, weights["non_trainable"], strict=True
    ):
        variable.assign(value)
    predicted = [
        np.argmax(np.asarray(model(x[start : start + 2048], training=False)), axis=1)
        for start in range(0, len(y), 2048)
    ]
    return float(np.mean(np.concatenate(predicted) == y))


def build_process(
    algorithm: str,
    model_fn: Callable[[], Any],
    client_lr: float,
    server_lr: float,
    seed: int,
    **extra: Any,
) -> Any:
    """The training process of ``algorithm`` with the two learning rates (``extra`` goes
    to the builder, e.g. ``model_aggregator=``)."""
    preprocess = Preprocessing(epochs=EPOCHS, batch_size=BATCH_SIZE, shuffle_buffer=SHUFFLE_BUFFER)
    server = server_optimizer(algorithm, server_lr)
    if algorithm == "fedprox":
        return build_weighted_fed_prox(
            model_fn,
            PROXIMAL_STRENGTH,
            sgd(client_lr),
            server,
            preprocess=preprocess,
            seed=seed,
            **extra,
        )
    return build_weighted_fed_avg(
        model_fn, sgd(client_lr), server, preprocess=preprocess, seed=seed, **extra
    )


async def train(
    process: Any, data: FederatedData, rounds: int, clients_per_round: int, seed: int
) -> tuple[dict[str, Any], float, int]:
    """Run ``rounds`` rounds of ``process``; the final weights, the last round's training
    loss and how many rounds ended with a non-finite update (left unapplied)."""
    sampler = data.train.iterator(seed)
    state = process.initialize()
    loss = float("nan")
    non_finite = 0
    async with LocalContext(max_workers=2):
        for round_num in range(1, rounds + 1):
            output = await process.next(state, sampler.select(clients_per_round, round_num))
            state = output.state
            loss = float(output.metrics["client_work"]["train"]["loss"])
            non_finite += int(output.metrics["finalizer"]["update_non_finite"])
    return process.get_model_weights(state), loss, non_finite


ATTACK_FACTORS = {"none": 1.0, "scaled": -10.0, "sign_flipped": -1.0}
"""What the attackers multiply their update (the delta ``initial - trained``) by."""
AGGREGATORS = ("mean", "median", "trimmed_mean")
ATTACKER_FRACTION = 0.2
POISONING_CLIENT_LR = 0.1
POISONING_SERVER_LR = 1.0


@dataclasses.dataclass(frozen=True)
class Attack(ClientTransform):
    """``inner`` behind a transform that multiplies the deltas of the first ``attackers``
    clients of every group by ``factor``, keeping their weights (example counts).

    :func:`poisoning_cohort` puts a round's attackers first and the round runs as one
    group (``clients_per_group`` = the round's size), so these are exactly the
    attackers: the simulated clients send ``factor`` times their honest update. The
    measurements: ``attacked_count``, a round's attacked clients, and
    ``attacked_weighted``, those of them that weighed in (a client whose delta is not
    finite weighs 0: once the mean diverges, most do).
    """

    inner: ModelAggregator
    attackers: int
    factor: float

    def transform(
        self, params: dict[str, Any], deltas: list[Any], weights: Any
    ) -> tuple[list[Any], Any, dict[str, Any]]:
        """The first ``attackers`` deltas multiplied by ``factor``; counts them."""
        rows = tf.range(tf.shape(weights)[0]) < self.attackers
        scale = tf.where(rows, tf.constant(self.factor), tf.constant(1.0))
        scaled = [
            delta * tf.reshape(tf.cast(scale, delta.dtype), [-1] + [1] * (len(delta.shape) - 1))
            for delta in deltas
        ]
        weighed = tf.logical_and(rows, weights > 0)
        counts = {
            "attacked_count": tf.cast(rows, tf.float64),
            "attacked_weighted": tf.cast(weighed, tf.float64),
        }
        return scaled, weights, counts

    def describe(self) -> dict[str, Any]:
        """The attack and the inner aggregator's description."""
        return {
            "aggregator": "attack",
            "attackers": self.attackers,
            "factor": self.factor,
            "inner": self.inner.describe(),
        }


def make_aggregator(name: str) -> ModelAggregator:
    """The aggregator ``name`` (one of :data:`AGGREGATORS`): trimmed mean with beta 0.2."""
    if name == "median":
        return median()
    if name == "trimmed_mean":
        return trimmed_mean(0.2)
    return mean()


def poisoning_cohort(
    data: FederatedData, per_round: int, attackers: int, seed: int
) -> Callable[[int], list[Any]]:
    """The cohort of a round: ``attackers`` clients drawn from the attacker pool, then
    ``per_round - attackers`` from the others, both seeded per round.

    The pool is the first ``ATTACKER_FRACTION`` of the training clients in id order
    (writers 00-01 of the digits; clients 000-019 of Fashion-MNIST), so a round's cohort
    holds 20 % attackers exactly, as the paper-style "20 % malicious clients" means.
    """
    handles = data.train.all_clients()
    pool_size = round(ATTACKER_FRACTION * len(handles))
    pool = ClientSampler(handles[:pool_size], seed)
    honest = ClientSampler(handles[pool_size:], seed)

    def cohort(round_num: int) -> list[Any]:
        chosen = pool.select(attackers, round_num) if attackers else []
        return chosen + honest.select(per_round - attackers, round_num)

    return cohort


async def train_cohorts(
    process: Any, rounds: int, cohort: Callable[[int], list[Any]]
) -> tuple[dict[str, Any], float, dict[str, int]]:
    """Like :func:`train`, on the clients ``cohort(round)`` gives, in that order: the
    final weights, the last round's training loss and counts summed over the rounds
    (``non_finite_rounds``, ``non_finite_clients`` and the :class:`Attack`
    measurements)."""
    state = process.initialize()
    loss = float("nan")
    totals = dict.fromkeys(
        ("non_finite_rounds", "non_finite_clients", "attacked_count", "attacked_weighted"), 0
    )
    async with LocalContext(max_workers=1):
        for round_num in range(1, rounds + 1):
            output = await process.next(state, cohort(round_num))
            state = output.state
            train = output.metrics["client_work"]["train"]
            loss = float(train["loss"])
            totals["non_finite_rounds"] += int(output.metrics["finalizer"]["update_non_finite"])
            totals["non_finite_clients"] += int(train["num_non_finite_clients"])
            for name in ("attacked_count", "attacked_weighted"):
                totals[name] += int(output.metrics.get("aggregator", {}).get(name, 0))
    return process.get_model_weights(state), loss, totals


async def run_poisoning(arguments: argparse.Namespace, results: Results) -> None:
    """FedAvg (client SGD 0.1, server SGD 1.0) with each aggregator, without attackers
    and with 20 % of each round's clients sending scaled or sign-flipped updates."""
    for dataset in arguments.poisoning_datasets:
        data = load_dataset(dataset, arguments.seed)
        test_x, test_y = held_out_arrays(data)
        per_round = min(arguments.clients_per_round, len(data.train.client_ids))
        attackers = round(ATTACKER_FRACTION * per_round)
        model_fn = functools.partial(mlp, data.feature_shape, data.num_classes, seed=arguments.seed)
        for aggregator in AGGREGATORS:
            for attack, factor in ATTACK_FACTORS.items():
                key = cell_key(
                    "poisoning",
                    dataset,
                    aggregator,
                    attack,
                    arguments.rounds,
                    per_round,
                    arguments.seed,
                )
                if key in results.cells:
                    continue
                start = time.perf_counter()
                count = 0 if attack == "none" else attackers
                process = build_process(
                    "fedavg",
                    model_fn,
                    POISONING_CLIENT_LR,
                    POISONING_SERVER_LR,
                    arguments.seed,
                    model_aggregator=Attack(make_aggregator(aggregator), count, factor),
                    clients_per_group=per_round,
                )
                weights, loss, totals = await train_cohorts(
                    process,
                    arguments.rounds,
                    poisoning_cohort(data, per_round, attackers, arguments.seed),
                )
                hits = totals["attacked_count"]
                if hits != count * arguments.rounds:
                    raise RuntimeError(
                        f"expected {count} attacked clients a round, counted {hits} in "
                        f"{arguments.rounds} rounds"
                    )
                accuracy = held_out_accuracy(model_fn, weights, test_x, test_y)
                record = {
                    "part": "poisoning",
                    "dataset": dataset,
                    "aggregator": aggregator,
                    "attack": attack,
                    "attack_factor": factor,
                    "attackers_per_round": count,
                    "rounds": arguments.rounds,
                    "clients_per_round": per_round,
                    "client_lr": POISONING_CLIENT_LR,
                    "server_lr": POISONING_SERVER_LR,
                    "seed": arguments.seed,
                    "held_out_accuracy": accuracy,
                    "held_out_examples": int(test_y.size),
                    "final_train_loss": loss,
                    **totals,
                    "seconds": round(time.perf_counter() - start, 2),
                }
                results.add(key, record)
                print(
                    f"{dataset:14} {aggregator:12} {attack:12} accuracy {accuracy:.4f} "
                    f"loss {loss:.4g} ({record['seconds']} s)",
                    flush=True,
                )


def poisoning_table(cells: Sequence[dict[str, Any]], rounds: int, seed: int) -> str:
    """The Markdown table of the poisoning cells of ``rounds`` rounds: one row per data
    set and aggregator, one column per attack; the accuracy with ``seed``, or, when the
    cell also ran with other seeds, the mean over all its seeds and their range."""
    by_cell: dict[tuple[str, str, str], dict[int, float]] = {}
    for cell in cells:
        if cell["part"] == "poisoning" and cell["rounds"] == rounds:
            key = (cell["dataset"], cell["aggregator"], cell["attack"])
            by_cell.setdefault(key, {})[cell["seed"]] = cell["held_out_accuracy"]
    if not any(seed in seeds for seeds in by_cell.values()):
        return ""
    lines = [
        "| data set | aggregator | no attack | 20 % scaled x-10 | 20 % sign-flipped |",
        "|---|---|---|---|---|",
    ]
    for dataset in DATASETS:
        for aggregator in AGGREGATORS:
            row = []
            for attack in ATTACK_FACTORS:
                seeds = by_cell.get((dataset, aggregator, attack), {})
                if seed not in seeds:
                    row.append("not run")
                elif len(seeds) == 1:
                    row.append(f"{seeds[seed]:.3f}")
                else:
                    values = sorted(seeds.values())
                    row.append(
                        f"{float(np.mean(values)):.3f} [{values[0]:.3f}-{values[-1]:.3f}], "
                        f"{len(values)} seeds"
                    )
            if any(entry != "not run" for entry in row):
                lines.append(f"| {dataset} | {aggregator} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def cell_key(*parts: Any) -> str:
    """The key of a cell in the results file."""
    return "/".join(str(part) for part in parts)


class Results:
    """The results file: a JSON object ``{"cells": {key: record}}``, rewritten after
    every cell (atomically, through a temporary file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cells: dict[str, dict[str, Any]] = {}
        if path.exists():
            self.cells = json.loads(path.read_text())["cells"]

    def add(self, key: str, record: dict[str, Any]) -> None:
        self.cells[key] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"cells": self.cells}, indent=1, sort_keys=True) + "\n")
        temporary.replace(self.path)


def grid(
    algorithm: str, kind: str, best: dict[str, Any] | None = None
) -> list[tuple[float, float]]:
    """The (client lr, server lr) cells of ``algorithm``: all 9, the middle one, or
    (``"best"``) the cell ``best`` (none when it is None)."""
    servers = SERVER_LRS[algorithm]
    if kind == "best":
        return [] if best is None else [(best["client_lr"], best["server_lr"])]
    if kind == "center":
        return [(CLIENT_LRS[1], servers[1])]
    return [(client, server) for client in CLIENT_LRS for server in servers]


def table_cells(
    cells: Sequence[dict[str, Any]], rounds: int, seed: int | None = None
) -> list[dict[str, Any]]:
    """The cells of the table part run for ``rounds`` rounds (and with ``seed``)."""
    return [
        cell
        for cell in cells
        if cell["part"] == "table"
        and cell["rounds"] == rounds
        and (seed is None or cell["seed"] == seed)
    ]


async def run_table(arguments: argparse.Namespace, results: Results) -> None:
    """Every cell of the table not in ``results`` yet, each added as it finishes."""
    for dataset in arguments.datasets:
        data = load_dataset(dataset, arguments.seed)
        test_x, test_y = held_out_arrays(data)
        per_round = min(arguments.clients_per_round, len(data.train.client_ids))
        model_fn = functools.partial(mlp, data.feature_shape, data.num_classes, seed=arguments.seed)
        best = best_cells(table_cells(list(results.cells.values()), arguments.rounds, DEFAULT_SEED))
        for algorithm in arguments.algorithms:
            chosen = grid(algorithm, arguments.grid, best.get((dataset, algorithm)))
            for client_lr, server_lr in chosen:
                key = cell_key(
                    "table", dataset, algorithm, client_lr, server_lr,
                    arguments.rounds, per_round, arguments.seed,
                )  # fmt: skip
                if key in results.cells:
                    continue
                start = time.perf_counter()
                process = build_process(algorithm, model_fn, client_lr, server_lr, arguments.seed)
                weights, loss, non_finite = await train(
                    process, data, arguments.rounds, per_round, arguments.seed
                )
                accuracy = held_out_accuracy(model_fn, weights, test_x, test_y)
                record = {
                    "part": "table",
                    "dataset": dataset,
                    "algorithm": algorithm,
                    "client_lr": client_lr,
                    "server_lr": server_lr,
                    "rounds": arguments.rounds,
                    "clients_per_round": per_round,
                    "seed": arguments.seed,
                    "held_out_accuracy": accuracy,
                    "held_out_examples": int(test_y.size),
                    "final_train_loss": loss,
                    "non_finite_rounds": non_finite,
                    "seconds": round(time.perf_counter() - start, 2),
                }
                results.add(key, record)
                print(
                    f"{dataset:14} {algorithm:8} client {client_lr:<5} server {server_lr:<6}"
                    f" accuracy {accuracy:.4f} loss {loss:.4f} ({record['seconds']} s)",
                    flush=True,
                )


def best_cells(
    cells: Sequence[dict[str, Any]],
) -> dict[tuple[str, str], dict[str, Any]]:
    """The best cell (highest held-out accuracy) per (data set, algorithm)."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for cell in cells:
        group = (cell["dataset"], cell["algorithm"])
        if group not in best or cell["held_out_accuracy"] > best[group]["held_out_accuracy"]:
            best[group] = cell
    return best


def _rate(value: float, choices: Sequence[float], full: bool) -> str:
    edge = full and value in (choices[0], choices[-1])
    return f"{value:g}{'*' if edge else ''}"


def markdown_table(cells: Sequence[dict[str, Any]], rounds: int, seed: int) -> str:
    """The Markdown table of the best cells of ``seed`` at ``rounds`` rounds: one row per
    algorithm, one column per data set, ``accuracy (client lr / server lr)``; ``*``
    marks a rate at the grid's edge. When the best cell also ran with other seeds
    (``--grid best --seed N``), the mean and spread (min-max) over all its seeds follow."""
    everything = table_cells(cells, rounds)
    chosen = table_cells(cells, rounds, seed)
    best = best_cells(chosen)
    if not best:
        return ""
    datasets = [name for name in DATASETS if any(group[0] == name for group in best)]
    counts: dict[tuple[str, str], int] = {}
    for cell in chosen:
        group = (cell["dataset"], cell["algorithm"])
        counts[group] = counts.get(group, 0) + 1
    lines = [
        "| algorithm | " + " | ".join(datasets) + " |",
        "|---|" + "---|" * len(datasets),
    ]
    for algorithm in ALGORITHMS:
        row = []
        for dataset in datasets:
            cell = best.get((dataset, algorithm))
            if cell is None:
                row.append("not run")
                continue
            full = counts[(dataset, algorithm)] == 9
            rates = (
                f"{_rate(cell['client_lr'], CLIENT_LRS, full)} / "
                f"{_rate(cell['server_lr'], SERVER_LRS[algorithm], full)}"
            )
            cells_note = "" if full else f", {counts[(dataset, algorithm)]} cells"
            entry = f"{cell['held_out_accuracy']:.3f} ({rates}{cells_note})"
            same = sorted(
                other["held_out_accuracy"]
                for other in everything
                if all(
                    other[name] == cell[name]
                    for name in ("dataset", "algorithm", "client_lr", "server_lr")
                )
                and other["clients_per_round"] == cell["clients_per_round"]
            )
            if len(same) > 1:
                entry += (
                    f"; {len(same)} seeds {float(np.mean(same)):.3f} [{same[0]:.3f}-{same[-1]:.3f}]"
                )
            row.append(entry)
        if any(entry != "not run" for entry in row):
            lines.append(f"| {algorithm} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def grid_tables(cells: Sequence[dict[str, Any]], rounds: int, seed: int) -> str:
    """Every cell of ``rounds`` rounds and ``seed``: per data set, one row per algorithm
    and one column per cell of the grid (client lr / server lr, in grid order)."""
    chosen = {
        (cell["dataset"], cell["algorithm"], cell["client_lr"], cell["server_lr"]): cell
        for cell in table_cells(cells, rounds, seed)
    }
    blocks = []
    for dataset in DATASETS:
        if not any(key[0] == dataset for key in chosen):
            continue
        lines = [
            f"{dataset}: held-out accuracy of every cell; c1-c3 are the client rates "
            f"{', '.join(f'{rate:g}' for rate in CLIENT_LRS)}, s1-s3 the algorithm's "
            "server rates from low to high",
            "",
            "| algorithm | "
            + " | ".join(f"c{i} s{j}" for i in (1, 2, 3) for j in (1, 2, 3))
            + " |",
            "|---|" + "---|" * 9,
        ]
        for algorithm in ALGORITHMS:
            row = []
            for client_lr, server_lr in grid(algorithm, "full"):
                cell = chosen.get((dataset, algorithm, client_lr, server_lr))
                row.append("" if cell is None else f"{cell['held_out_accuracy']:.3f}")
            if any(row):
                lines.append(f"| {algorithm} | " + " | ".join(row) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--grid", choices=("full", "center", "best"), default="full")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="seeds the model, the partition, the client sampling and shuffles (default 0)",
    )
    parser.add_argument(
        "--poisoning",
        action="store_true",
        help="run the poisoning test of the robust aggregators instead of the table",
    )
    parser.add_argument("--poisoning-datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument(
        "--table-only", action="store_true", help="print the table of --out, train nothing"
    )
    parser.add_argument(
        "--all-cells", action="store_true", help="also print every cell of the grids"
    )
    arguments = parser.parse_args(argv)
    if arguments.rounds < 1 or arguments.clients_per_round < 1:
        parser.error("--rounds and --clients-per-round must be at least 1")
    return arguments


def main(argv: Sequence[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    results = Results(arguments.out)
    if not arguments.table_only:
        anyio.run(run_poisoning if arguments.poisoning else run_table, arguments, results)
    cells = list(results.cells.values())
    for table in (
        markdown_table(cells, arguments.rounds, arguments.seed),
        poisoning_table(cells, arguments.rounds, arguments.seed),
        grid_tables(cells, arguments.rounds, arguments.seed) if arguments.all_cells else "",
    ):
        if table:
            print(table)


if __name__ == "__main__":
    main()
