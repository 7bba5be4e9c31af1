"""The DP table of the docs' performance page: held-out accuracy against epsilon on
Fashion-MNIST, 1,000 clients.

Fashion-MNIST (Debian's ``dataset-fashion-mnist``) split into ``--clients`` training
clients (default 1,000) by Dirichlet label skew (``--alpha``, default 1.0); each round
samples clients by Poisson sampling, each with probability ``k / N`` (``--per-round``
k, default 100). The model is the MLP (``programlogic.learning.mlp``, 128 hidden
units); clients run SGD (``--client-lr``) for ``--epochs`` of batches of
``--batch-size``; the server applies the mean update with SGD and momentum
(``--server-lr``, ``--server-momentum``).

For each noise multiplier of ``--noise`` the run is the unweighted FedAvg with
``dp_mean`` (fixed ``--clip``), and for those of ``--adaptive-noise`` with
``adaptive_clipping()``; a noise multiplier of 0 is the non-private baseline: the same
process with the plain unweighted mean (no clipping, no noise). Every run starts from
the same weights and samples the same clients each round. Every ``--eval-every``
rounds and at the end the model is evaluated centrally on the 10,000 test images, and
epsilon at ``delta = 1 / N**1.1`` is noted (RDP accountant).

Clients train in compiled groups of ``--clients-per-group`` (default 25): a Poisson
round's size varies, and a fixed group size bounds the shapes that compile (a few
seconds each, the first rounds of a run; later rounds take 0.2 to 0.4 s on 2 cores).

Prints a Markdown table and writes every number to ``--out`` (JSON).

    PYTHONPATH=. python bench/studies/dp_accuracy.py [--rounds 400] [--noise 0 0.5 1 2 3]
        [--adaptive-noise 1.0] [--clip 0.5] [--out bench/results/dp_accuracy.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import numpy as np

from programlogic import LocalContext, Sampling
from programlogic.datasets import Preprocessing, load_fashion_mnist
from programlogic.learning import (
    adaptive_clipping,
    build_unweighted_fed_avg,
    dp_mean,
    mlp,
    sgd,
)
from programlogic.privacy import GaussianMechanism

FEATURE_SHAPE = (28, 28)
NUM_CLASSES = 10


def central_accuracy(
    model_fn: Any, trainable: list[np.ndarray], x: np.ndarray, y: np.ndarray
) -> float:
    """The accuracy on ``(x, y)`` of the model ``model_fn`` builds, with weights ``trainable``."""
    model = model_fn()
    for variable, value in zip(model.trainable_weights, trainable, strict=True):
        variable.assign(value)
    predictions = np.concatenate(
        [
            np.asarray(model(x[start : start + 2000], training=False))
            for start in range(0, len(x), 2000)
        ]
    )
    return float(np.mean(np.argmax(predictions, axis=1) == y))


def build(
    arguments: argparse.Namespace, model_fn: Any, num_clients: int, noise: float, adaptive: bool
) -> tuple[Any, float | None]:
    """The run's process, and delta (None for the non-private baseline)."""
    aggregator = None
    delta = None
    if noise > 0:
        delta = num_clients**-1.1
        mechanism = GaussianMechanism(noise, num_clients, arguments.per_round, sampling="poisson")
        clip = adaptive_clipping(initial_clip=arguments.clip) if adaptive else arguments.clip
        aggregator = dp_mean(mechanism, clip, delta=delta)
    process = build_unweighted_fed_avg(
        model_fn,
        sgd(arguments.client_lr),
        sgd(arguments.server_lr, momentum=arguments.server_momentum),
        model_aggregator=aggregator,
        preprocess=Preprocessing(
            epochs=arguments.epochs, batch_size=arguments.batch_size, shuffle_buffer=100
        ),
        seed=arguments.seed,
        clients_per_group=arguments.clients_per_group,
    )
    return process, delta


async def run_one(
    arguments: argparse.Namespace,
    data: Any,
    test: tuple[np.ndarray, np.ndarray],
    noise: float,
    adaptive: bool,
) -> dict[str, Any]:
    """One training run: accuracy and epsilon at each evaluated round, and the time taken."""
    model_fn = functools.partial(mlp, FEATURE_SHAPE, NUM_CLASSES, seed=arguments.seed)
    num_clients = len(data.train.client_ids)
    process, delta = build(arguments, model_fn, num_clients, noise, adaptive)
    sampler = data.train.iterator(arguments.seed)
    evaluations: list[dict[str, Any]] = []
    round_seconds: list[float] = []
    clients_seen: list[int] = []
    start = time.perf_counter()
    async with LocalContext(max_workers=arguments.workers):
        state = process.initialize()
        for round_num in range(1, arguments.rounds + 1):
            clients = sampler.select(arguments.per_round, round_num)
            clients_seen.append(len(clients))
            began = time.perf_counter()
            output = await process.next(state, clients)
            round_seconds.append(time.perf_counter() - began)
            state = output.state
            privacy = output.metrics.get("privacy", {})
            if round_num % arguments.eval_every == 0 or round_num == arguments.rounds:
                accuracy = await anyio.to_thread.run_sync(
                    central_accuracy, model_fn, process.get_model_weights(state)["trainable"], *test
                )
                row = {
                    "round": round_num,
                    "accuracy": accuracy,
                    "epsilon": privacy.get("epsilon"),
                    "clip": privacy.get("clip"),
                    "train_loss": float(output.metrics["client_work"]["train"]["loss"]),
                }
                evaluations.append(row)
                print(f"  noise {noise} adaptive={adaptive}: {json.dumps(row)}", flush=True)
    return {
        "noise_multiplier": noise,
        "clip": ("adaptive" if adaptive else arguments.clip) if noise > 0 else None,
        "delta": delta,
        "evaluations": evaluations,
        "round_seconds": round_seconds,
        "clients_per_round": clients_seen,
        "seconds": time.perf_counter() - start,
    }


def epsilon_text(value: float | None) -> str:
    if value is None:
        return "no DP"
    return f"{value:.2f}"


def print_table(arguments: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """The Markdown table: one row per run, the final and intermediate (accuracy, epsilon)."""
    evaluated = {row["round"] for row in runs[0]["evaluations"][:-1]}
    marks = [mark for mark in arguments.table_rounds if mark in evaluated]
    header = "| noise multiplier z | clip | " + " | ".join(
        f"round {mark}: accuracy (epsilon)" for mark in marks
    )
    header += f" | round {arguments.rounds}: held-out accuracy | epsilon |"
    print(header)
    print("|" + "---|" * (4 + len(marks)))
    for run in runs:
        by_round = {row["round"]: row for row in run["evaluations"]}
        cells = [
            f"{by_round[mark]['accuracy']:.4f} ({epsilon_text(by_round[mark]['epsilon'])})"
            for mark in marks
        ]
        final = run["evaluations"][-1]
        clip = "-" if run["clip"] is None else str(run["clip"])
        z = "0 (non-private)" if run["noise_multiplier"] == 0 else str(run["noise_multiplier"])
        print(
            f"| {z} | {clip} | "
            + "".join(f"{cell} | " for cell in cells)
            + f"{final['accuracy']:.4f} | {epsilon_text(final['epsilon'])} |"
        )


async def main_async(arguments: argparse.Namespace) -> None:
    data = load_fashion_mnist(
        arguments.clients, alpha=arguments.alpha, seed=arguments.seed, sampling=Sampling.POISSON
    )
    test_x = np.concatenate(
        [data.test.all_clients()[i].load().x for i in range(len(data.test.client_ids))]
    )
    test_y = np.concatenate(
        [data.test.all_clients()[i].load().y for i in range(len(data.test.client_ids))]
    )
    sizes = [len(handle.load().y) for handle in data.train.all_clients()]
    print(
        f"{len(sizes)} clients: examples min {min(sizes)}, median {int(np.median(sizes))}, "
        f"max {max(sizes)}; test {len(test_y)}",
        flush=True,
    )
    plan = [(noise, False) for noise in arguments.noise]
    plan += [(noise, True) for noise in arguments.adaptive_noise]
    runs = []
    started = time.perf_counter()
    for noise, adaptive in plan:
        runs.append(await run_one(arguments, data, (test_x, test_y), noise, adaptive))
        print(f"  took {runs[-1]['seconds']:.0f} s", flush=True)
    print_table(arguments, runs)
    result = {
        "settings": {key: value for key, value in vars(arguments).items() if key != "out"},
        "delta": len(sizes) ** -1.1,
        "client_examples": {
            "min": min(sizes),
            "median": float(np.median(sizes)),
            "max": max(sizes),
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "total_seconds": time.perf_counter() - started,
        "runs": runs,
    }
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {arguments.out}")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    import absl.logging

    absl.logging.set_verbosity("error")  # dp-accounting's notes on excluded RDP orders
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive, default=400)
    parser.add_argument("--clients", type=positive, default=1000, help="training clients N")
    parser.add_argument(
        "--per-round", type=positive, default=100, help="expected clients a round k"
    )
    parser.add_argument("--alpha", type=float, default=1.0, help="Dirichlet label skew")
    parser.add_argument("--noise", type=float, nargs="*", default=[0.0, 0.5, 1.0, 2.0, 3.0])
    parser.add_argument("--adaptive-noise", type=float, nargs="*", default=[1.0])
    parser.add_argument("--clip", type=float, default=0.5, help="fixed clip (adaptive's initial)")
    parser.add_argument("--client-lr", type=float, default=0.05)
    parser.add_argument("--server-lr", type=float, default=1.0)
    parser.add_argument("--server-momentum", type=float, default=0.9)
    parser.add_argument("--epochs", type=positive, default=1)
    parser.add_argument("--batch-size", type=positive, default=20)
    parser.add_argument("--clients-per-group", type=positive, default=25)
    parser.add_argument("--workers", type=positive, default=2)
    parser.add_argument("--eval-every", type=positive, default=50)
    parser.add_argument(
        "--table-rounds",
        type=positive,
        nargs="*",
        default=[100, 200],
        help="evaluated rounds shown in the table besides the last",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/dp_accuracy.json"))
    arguments = parser.parse_args()
    anyio.run(main_async, arguments)


if __name__ == "__main__":
    main()
