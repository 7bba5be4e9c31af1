"""Clients per second of FedAvg on RayContext, LocalContext and Flower; driver memory on Ray.

A round trains ``--clients`` clients (default 1,000) of 20 synthetic examples each
(784 features, 10 classes) with the tutorial's softmax regression, one local epoch of
batches of 5, client SGD 0.02, on this machine:

- LocalContext (2 worker threads) and RayContext (a local cluster started by the
  context, 2 actors) run the same built-in FedAvg with the same grouping; a first
  round compiles and is not timed. Clients per second = clients x timed rounds /
  their seconds.
- Flower 1.42's simulation engine (Ray) runs the same configuration through
  ../shared/anchors/flower_fedavg.py in its own venv (built by
  setup_flower_venv.sh); its clients per second use its median round, and its
  startup (Ray, actors, TensorFlow) is reported apart.
- Driver memory: the USS (psutil) of this process after RayContext's first round
  and after its last of ``--memory-rounds`` (default 50); the bench fails when the
  last is more than 10% above the first.

Prints one JSON line with the figures and the ratios. ``--short`` (CI): 3 timed rounds,
10 memory rounds, no Flower.

    python bench/ray_clients.py [--clients 1000] [--rounds 5] [--memory-rounds 50]
                                [--flower-rounds 2] [--no-flower] [--short]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import numpy as np
import psutil

from programlogic import InMemoryDataSource, LocalContext
from programlogic.contexts.ray import RayContext
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.learning import build_weighted_fed_avg, sgd, softmax_regression

ANCHORS = Path(__file__).resolve().parents[2] / "shared" / "anchors"
EXAMPLES, FEATURES, CLASSES, EPOCHS, BATCH = 20, 784, 10, 1, 5


def make_data(num_clients: int) -> dict[str, ClientArrays]:
    rng = np.random.default_rng(0)
    return {
        f"client_{index:05d}": ClientArrays(
            rng.random((EXAMPLES, FEATURES), dtype=np.float32),
            rng.integers(0, CLASSES, EXAMPLES).astype(np.int32),
        )
        for index in range(num_clients)
    }


def make_process() -> Any:
    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (FEATURES,), CLASSES),
        sgd(0.02),
        sgd(1.0),
        preprocess=Preprocessing(epochs=EPOCHS, batch_size=BATCH, shuffle_buffer=0),
        seed=0,
    )


def uss() -> int:
    gc.collect()
    return psutil.Process().memory_full_info().uss


async def run_context(context: Any, data: dict[str, ClientArrays], rounds: int) -> dict[str, Any]:
    """Round 1 untimed, then ``rounds - 1`` timed rounds; USS after the first and last."""
    process = make_process()
    clients = InMemoryDataSource(data).all_clients()
    async with context:
        state = process.initialize()
        state = (await process.next(state, clients)).state
        first_uss = uss()
        started = time.perf_counter()
        for _ in range(rounds - 1):
            output = await process.next(state, clients)
            state = output.state
        seconds = time.perf_counter() - started
        last_uss = uss()
    return {
        "clients_per_s": len(clients) * (rounds - 1) / seconds,
        "round_s": seconds / (rounds - 1),
        "loss": output.metrics["client_work"]["train"]["loss"],
        "first_uss_mb": first_uss / 2**20,
        "last_uss_mb": last_uss / 2**20,
    }


def run_flower(data: dict[str, ClientArrays], rounds: int) -> dict[str, Any]:
    setup = subprocess.run(
        ["bash", str(ANCHORS / "setup_flower_venv.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    python = Path(setup.stdout.strip().splitlines()[-1]) / "bin" / "python"
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "clients.npz"
        arrays = {}
        for index, client in enumerate(data.values()):
            arrays[f"x_{index}"], arrays[f"y_{index}"] = client.x, client.y
        np.savez(path, **arrays)
        done = subprocess.run(
            [
                str(python),
                str(ANCHORS / "flower_fedavg.py"),
                "--clients",
                str(path),
                "--rounds",
                str(rounds),
                "--epochs",
                str(EPOCHS),
                "--batch",
                str(BATCH),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "clients_per_s": len(data) / result["median_round_s"],
        "median_round_s": result["median_round_s"],
        "startup_s": result["startup_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000, help="clients per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds on LocalContext")
    parser.add_argument("--memory-rounds", type=int, default=50, help="rounds on RayContext")
    parser.add_argument("--flower-rounds", type=int, default=2, help="rounds under Flower")
    parser.add_argument("--no-flower", action="store_true", help="skip Flower")
    parser.add_argument("--short", action="store_true", help="CI: 3 + 10 rounds, no Flower")
    arguments = parser.parse_args()
    if arguments.short:
        arguments.rounds, arguments.memory_rounds, arguments.no_flower = 3, 10, True
    for name in ("clients", "rounds", "memory_rounds", "flower_rounds"):
        if getattr(arguments, name) < (2 if "rounds" in name else 1):
            parser.error(f"--{name.replace('_', '-')} is too small: {getattr(arguments, name)}")
    data = make_data(arguments.clients)
    local = anyio.run(run_context, LocalContext(max_workers=2), data, arguments.rounds)
    ray = anyio.run(run_context, RayContext(max_workers=2), data, arguments.memory_rounds)
    figures: dict[str, Any] = {
        "clients_per_round": arguments.clients,
        "local": local,
        "ray": ray,
        "ray_vs_local": ray["clients_per_s"] / local["clients_per_s"],
        "driver_uss_ratio": ray["last_uss_mb"] / ray["first_uss_mb"],
        "memory_rounds": arguments.memory_rounds,
    }
    if not arguments.no_flower:
        flower = run_flower(data, arguments.flower_rounds)
        figures["flower"] = flower
        figures["ray_vs_flower"] = ray["clients_per_s"] / flower["clients_per_s"]
        figures["local_vs_flower"] = local["clients_per_s"] / flower["clients_per_s"]
    print(json.dumps(figures), flush=True)
    if figures["driver_uss_ratio"] > 1.10:
        sys.exit(f"ray_clients: driver memory grew by {figures['driver_uss_ratio']:.3f}x")


if __name__ == "__main__":
    main()
