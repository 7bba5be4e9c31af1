"""Our FedAvg round split into a cost per dependent step and a cost per round.

``fedavg_vs_tff.py``'s bare round (``process.next`` in ``LocalContext``, 2 workers,
the tutorial's configuration) timed at two numbers of local epochs: the difference is
the steps alone, so the cost of a step (the compiled client loop's, clients side by
side) is the difference over the extra steps, and what is left of the round (stacking
clients, aggregation, the server update, threads' hand-offs) is its fixed cost. Set
beside ``roofline.py``'s per-step cost of the bare SGD math at the same shapes, it says
how far the client update is from the machine's ceiling. Prints one JSON line.

``--client-update`` picks the builders' client update (default ``auto``: the compiled
loop for this model); ``--gather-ahead-bytes 0`` makes the traced update gather each
batch inside its loop instead of ahead (``client_update.traced.GATHER_AHEAD_BYTES``),
to check what gathering ahead saves a step.

    python bench/fedavg_step_cost.py [--clients 10 100] [--epochs 1 5] [--rounds 10]
        [--client-update traced] [--gather-ahead-bytes 0]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import roofline
from _tff_comparison import make_clients

from programlogic import InMemoryDataSource, LocalContext, Sampling
from programlogic.datasets.preprocessing import Preprocessing
from programlogic.learning import CLIENT_UPDATES, build_weighted_fed_avg, sgd, softmax_regression
from programlogic.learning.client_update import traced

WARM_ROUNDS = 2


async def round_ms(count: int, epochs: int, rounds: int, client_update: str) -> float:
    """Median ms of the bare rounds after the first :data:`WARM_ROUNDS`."""
    process = build_weighted_fed_avg(
        functools.partial(softmax_regression, (784,), 10),
        sgd(0.02),
        sgd(1.0),
        preprocess=Preprocessing(epochs=epochs, batch_size=5, shuffle_buffer=0),
        seed=0,
        client_update=client_update,
    )
    clients = make_clients(count)
    source = InMemoryDataSource(
        {f"client_{index:04d}": client for index, client in enumerate(clients)},
        sampling=Sampling.FIXED,
    )
    times = []
    async with LocalContext(max_workers=2):
        state = process.initialize()
        for _ in range(rounds):
            start = time.perf_counter()
            state = (await process.next(state, source.all_clients())).state
            times.append(time.perf_counter() - start)
    return statistics.median(times[WARM_ROUNDS:]) * 1e3


def split(count: int, epochs: tuple[int, int], rounds: int, client_update: str) -> dict[str, Any]:
    """The per-step and fixed cost of a round of ``count`` clients, and the ceiling's."""
    low, high = (anyio.run(round_ms, count, e, rounds, client_update) for e in epochs)
    steps = [roofline.Workload(count, epochs=e).steps for e in epochs]
    step_ms = (high - low) / (steps[1] - steps[0])
    ceiling = roofline.quick_ceiling(count)
    return {
        "clients": count,
        "epochs": list(epochs),
        "round_ms": [low, high],
        "step_us": step_ms * 1e3,
        "fixed_ms": low - steps[0] * step_ms,
        "ceiling": ceiling["ceiling"],
        "ceiling_step_us": ceiling["ceiling_step_us"],
        "step_vs_ceiling": step_ms * 1e3 / ceiling["ceiling_step_us"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--epochs", type=int, nargs=2, default=[1, 5])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--client-update", choices=CLIENT_UPDATES, default="auto")
    parser.add_argument("--gather-ahead-bytes", type=int, default=traced.GATHER_AHEAD_BYTES)
    arguments = parser.parse_args()
    traced.GATHER_AHEAD_BYTES = arguments.gather_ahead_bytes  # read where the graph traces
    rows = []
    for count in arguments.clients:
        row = split(count, tuple(arguments.epochs), arguments.rounds, arguments.client_update)
        print(
            f"{count} clients: a step {row['step_us']:.0f} us ({row['step_vs_ceiling']:.2f}x "
            f"the ceiling's {row['ceiling_step_us']:.0f} us), fixed {row['fixed_ms']:.1f} ms"
        )
        rows.append(row)
    load = os.getloadavg()
    settings = {"client_update": arguments.client_update,
                "gather_ahead_bytes": arguments.gather_ahead_bytes}  # fmt: skip
    print(json.dumps({"benchmark": "fedavg step cost", **settings, "load_average": load,
                      "rows": rows}))  # fmt: skip


if __name__ == "__main__":
    main()
