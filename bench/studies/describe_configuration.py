"""What recording a run's configuration costs, against building the process it describes.

``train_model`` describes the learning process and the data source once per call (on a
worker thread). This times, for FedAvg on the example CNN with ``--clients`` in-memory
clients of 28x28 images (sizes 10 to 400), the description of the process and the
description of the data source (a hash of every client's data shapes): the process's
against the time to build the FedAvg process (a Keras model; its compiled function is
shared), the data's against the time to build the data source, which every run pays
anyway. (The check of a loaded state against the initial one is ``train_model``'s own,
with no public name, and is not timed here.) Prints one JSON line: milliseconds (medians of
``--repeats``) and ratios.

    python bench/studies/describe_configuration.py [--clients 3400] [--repeats 20]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from programlogic import InMemoryDataSource
from programlogic.datasets import ClientArrays
from programlogic.learning import build_weighted_fed_avg, cnn


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``fn()`` over ``repeats`` calls, in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3400)
    parser.add_argument("--repeats", type=int, default=20)
    arguments = parser.parse_args()
    rng = np.random.default_rng(0)
    clients = {}
    for index in range(arguments.clients):
        count = int(rng.integers(10, 400))
        x = np.zeros((count, 28, 28), np.float32)
        clients[f"client_{index:05d}"] = ClientArrays(x, np.zeros(count, np.int32))
    source = InMemoryDataSource(clients)
    model_fn = functools.partial(cnn, (28, 28, 1), 10)

    def build() -> Any:
        return build_weighted_fed_avg(model_fn)

    process = build()
    build_ms = median_ms(build, max(3, arguments.repeats // 4))
    source_ms = median_ms(lambda: InMemoryDataSource(clients), arguments.repeats)
    process_ms = median_ms(process.describe_configuration, arguments.repeats)
    data_ms = median_ms(source.describe_configuration, arguments.repeats)
    print(
        json.dumps(
            {
                "clients": arguments.clients,
                "build_process_ms": round(build_ms, 2),
                "build_source_ms": round(source_ms, 2),
                "describe_process_ms": round(process_ms, 3),
                "describe_data_ms": round(data_ms, 2),
                "describe_process_to_build": round(process_ms / build_ms, 4),
                "describe_data_to_build_source": round(data_ms / source_ms, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
