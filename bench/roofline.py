"""The machine's own ceiling for a FedAvg round: FLOPs, the FLOP floor, the per-step cost.

A round of FedAvg trains N clients for E epochs of ``examples / B`` batches each: per
client, ``steps = E * examples / B`` dependent SGD steps, which run side by side across
clients. Two bounds limit how fast a round can be on this machine:

- the FLOP floor: the round's FLOPs (per step the forward products, the gradient
  products and the update: :func:`flops_per_step`; activations, the loss and bias
  additions are left out) over the machine's matmul throughput on both cores (a large
  float32 matmul in NumPy, GFLOP/s);
- the latency of the dependent steps: each formulation of the bare SGD math of one
  round (``_roofline_formulations``), at the round's exact shapes, timed as a whole
  round: its per-step cost is the round time over ``steps``.

Each formulation runs with the clients in one call (``split`` 1) and split in two
halves run by two threads at once (``split`` 2: both cores; NumPy and TensorFlow
release the GIL while they compute). Every one is warmed up (compiled) first; the
round time is the median of ``--repeats`` rounds. The ceiling is the fastest
formulation's round time. The repeats go round-robin over the formulations, so a
burst of other work on the machine slows each alike. Prints a table, then one JSON line.

    python bench/roofline.py [--clients 10 100] [--model softmax|mlp|cnn]
        [--features 784] [--formulations ...] [--unrolled] [--repeats 5]

:func:`measure` is what ``fedavg_vs_tff.py`` calls to read its round times against.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
from _roofline_formulations import (
    KERAS_FORMULATIONS,
    SOFTMAX_FORMULATIONS,
    Run,
    blas_threads,
    build_keras,
    softmax_data,
)

MODELS = ("softmax", "mlp", "cnn")


@dataclasses.dataclass(frozen=True)
class Workload:
    """One round's shape: the tutorial's by default (100 examples, 5 epochs of batches of 5)."""

    clients: int
    model: str = "softmax"
    features: int = 784
    classes: int = 10
    epochs: int = 5
    examples: int = 100
    batch: int = 5
    hidden: int = 128
    filters: int = 32

    @property
    def steps(self) -> int:
        """Each client's dependent steps a round."""
        return self.epochs * math.ceil(self.examples / self.batch)


def layers(workload: Workload) -> list[tuple[int, int]]:
    """``(multiply-adds per example, parameters)`` of each layer of the model, in order.

    The models of ``programlogic.learning.models``: ``cnn`` reads the features as a
    square image (two 3x3 convolutions, the second strided, then the dense layer).
    """
    d, k = workload.features, workload.classes
    if workload.model == "softmax":
        return [(d * k, d * k + k)]
    if workload.model == "mlp":
        h = workload.hidden
        return [(d * h, d * h + h), (h * k, h * k + k)]
    side, f = math.isqrt(d), workload.filters
    if side * side != d:
        raise ValueError(f"cnn needs a square image, got {d} features")
    half = math.ceil(side / 2)
    return [
        (side * side * f * 9, 9 * f + f),
        (half * half * 2 * f * 9 * f, 9 * f * 2 * f + 2 * f),
        (half * half * 2 * f * k, half * half * 2 * f * k + k),
    ]


def flops_per_step(workload: Workload) -> int:
    """One client's FLOPs for one batch: per layer, 2 per multiply-add for the forward
    product, the weight gradient and (but for the first layer) the input gradient, times
    the batch; plus 2 per parameter for the SGD update."""
    total = 0
    for index, (macs, parameters) in enumerate(layers(workload)):
        products = 2 if index == 0 else 3
        total += 2 * macs * workload.batch * products + 2 * parameters
    return total


def flops_per_round(workload: Workload) -> int:
    return flops_per_step(workload) * workload.steps * workload.clients


def matmul_gflops(threads: int, size: int = 2048, repeats: int = 3) -> float:
    """GFLOP/s of a ``size`` x ``size`` float32 NumPy matmul on ``threads`` BLAS threads."""
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    times = []
    with blas_threads(threads):
        a @ b
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times) / 1e9


def build(workload: Workload, formulation: str, data: dict[str, Any]) -> Run:
    if formulation in SOFTMAX_FORMULATIONS:
        if workload.model != "softmax":
            raise ValueError(f"{formulation} is written for the softmax layer only")
        return SOFTMAX_FORMULATIONS[formulation](data, workload.steps, workload.batch)
    from programlogic.learning import models

    input_shape = (workload.features,)
    if workload.model == "softmax":
        model = models.softmax_regression(input_shape, workload.classes)
    elif workload.model == "mlp":
        model = models.mlp(input_shape, workload.classes, hidden=workload.hidden)
    else:
        model = models.cnn(input_shape, workload.classes, filters=workload.filters)
    over_clients = KERAS_FORMULATIONS[formulation]
    return build_keras(data, workload.steps, workload.batch, model, over_clients)


def round_timer(run: Run, clients: int, split: int, pool: ThreadPoolExecutor) -> Any:
    """A function timing one round of ``run``, the clients in ``split`` concurrent calls,
    already warmed up (each part's shapes traced and compiled)."""
    bounds = np.linspace(0, clients, split + 1).round().astype(int)
    parts = [slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]

    def once() -> float:
        start = time.perf_counter()
        for future in [pool.submit(run, part) for part in parts]:
            future.result()
        return time.perf_counter() - start

    once()
    return once


def default_formulations(model: str, unrolled: bool = False) -> list[str]:
    softmax = ["numpy", "xla_matmul", "xla_bmr", "c_loop"] + (["xla_unrolled"] if unrolled else [])
    return softmax + list(KERAS_FORMULATIONS) if model == "softmax" else list(KERAS_FORMULATIONS)


def measure(
    workload: Workload,
    formulations: Sequence[str] | None = None,
    splits: Sequence[int] = (1, 2),
    repeats: int = 5,
    matmul_size: int = 2048,
) -> dict[str, Any]:
    """The roofline of ``workload``: FLOPs, the FLOP floor and each formulation's round.

    ``ceiling_ms`` is the fastest formulation's round (``ceiling`` names it and its split).
    """
    names = list(formulations or default_formulations(workload.model))
    gflops = {threads: matmul_gflops(threads, matmul_size) for threads in (1, 2)}
    flops = flops_per_round(workload)
    floor_ms = flops / (max(gflops.values()) * 1e9) * 1e3
    data = softmax_data(workload.clients, workload.examples, workload.features, workload.classes)
    with ThreadPoolExecutor(max(splits), thread_name_prefix="roofline") as pool:
        runs = {name: build(workload, name, data) for name in names}
        timers = {
            (name, split): round_timer(run, workload.clients, split, pool)
            for name, run in runs.items()
            for split in splits
        }
        # Round-robin, so that a burst of other work on the machine hits every one alike.
        times: dict[tuple[str, int], list[float]] = {key: [] for key in timers}
        for _ in range(repeats):
            for key, timer in timers.items():
                times[key].append(timer())
    rows = []
    for (name, split), seconds in ((key, statistics.median(t)) for key, t in times.items()):
        rows.append(
            {
                "formulation": name,
                "split": split,
                "round_ms": seconds * 1e3,
                "step_us": seconds / workload.steps * 1e6,
                "gflops": flops / seconds / 1e9,
                "floor_fraction": floor_ms / (seconds * 1e3),
            }
        )
    best = min(rows, key=lambda row: row["round_ms"])
    return {
        "workload": {**dataclasses.asdict(workload), "steps": workload.steps},
        "flops_per_step": flops_per_step(workload),
        "flops_per_round": flops,
        "matmul_gflops_1_thread": gflops[1],
        "matmul_gflops_2_threads": gflops[2],
        "floor_ms": floor_ms,
        "rows": rows,
        "ceiling": f"{best['formulation']} split {best['split']}",
        "ceiling_ms": best["round_ms"],
        "ceiling_step_us": best["step_us"],
    }


QUICK_FORMULATIONS = ("numpy", "xla_matmul", "xla_bmr", "keras_vmap", "c_loop")
"""What ``fedavg_vs_tff.py`` times: the fastest at the tutorial's shapes, quick to compile."""


def quick_ceiling(clients: int) -> dict[str, Any]:
    """The roofline of a tutorial round of ``clients`` clients in a few seconds, printed."""
    result = measure(Workload(clients), QUICK_FORMULATIONS, repeats=5 if clients <= 10 else 3)
    print_roofline(result)
    return result


def read_against(row: dict[str, Any], result: dict[str, Any], names: Sequence[str]) -> None:
    """Adds to ``row`` the roofline ``result`` and, for each ``name`` with a
    ``{name}_median_ms``, that round as a multiple of the ceiling: ``{name}_vs_ceiling``."""
    row.update(
        ceiling=result["ceiling"],
        ceiling_ms=result["ceiling_ms"],
        flops_per_round=result["flops_per_round"],
        floor_ms=result["floor_ms"],
        roofline=result,
    )
    for name in names:
        if f"{name}_median_ms" in row:
            row[f"{name}_vs_ceiling"] = row[f"{name}_median_ms"] / result["ceiling_ms"]


def multiples_text(row: dict[str, Any], names: Sequence[str]) -> str:
    """``"<ceiling ms>: <multiple>/<multiple>..."``, one multiple for each of ``names``."""
    multiples = (row.get(f"{name}_vs_ceiling") for name in names)
    text = "/".join("-" if value is None else f"{value:.2f}" for value in multiples)
    return f"{row['ceiling_ms']:.2f}: {text}"


def print_roofline(result: dict[str, Any]) -> None:
    """The workload, its FLOPs and floor, then a table of the formulations."""
    w = result["workload"]
    print(
        f"{w['model']} {w['features']}->{w['classes']}, {w['clients']} clients x {w['steps']} "
        f"steps (batch {w['batch']}): {result['flops_per_round'] / 1e6:.1f} MFLOP a round; "
        f"matmul {result['matmul_gflops_1_thread']:.0f} GFLOP/s on 1 thread, "
        f"{result['matmul_gflops_2_threads']:.0f} on 2: FLOP floor {result['floor_ms']:.2f} ms"
    )
    header = ("formulation", "split", "round ms", "per step us", "GFLOP/s", "floor fraction")
    table = [header] + [
        (
            row["formulation"],
            str(row["split"]),
            f"{row['round_ms']:.2f}",
            f"{row['step_us']:.1f}",
            f"{row['gflops']:.2f}",
            f"{row['floor_fraction']:.3f}",
        )
        for row in result["rows"]
    ]
    widths = [max(len(line[column]) for line in table) for column in range(len(header))]
    for index, line in enumerate(table):
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))
    print(f"ceiling: {result['ceiling']}, {result['ceiling_ms']:.2f} ms a round")


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--model", choices=MODELS, default="softmax")
    parser.add_argument("--features", type=int, default=784)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--filters", type=int, default=32, help="cnn's first convolution")
    parser.add_argument("--hidden", type=int, default=128, help="mlp's hidden units")
    parser.add_argument("--formulations", nargs="+", help="default: all for the model")
    parser.add_argument("--unrolled", action="store_true", help="add xla_unrolled (softmax)")
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--matmul-size", type=int, default=2048)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    names = arguments.formulations or default_formulations(arguments.model, arguments.unrolled)
    results = []
    for clients in arguments.clients:
        workload = Workload(
            clients,
            arguments.model,
            arguments.features,
            arguments.classes,
            arguments.epochs,
            arguments.examples,
            arguments.batch,
            arguments.hidden,
            arguments.filters,
        )
        result = measure(
            workload, names, arguments.splits, arguments.repeats, arguments.matmul_size
        )
        print_roofline(result)
        results.append(result)
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(json.dumps({"benchmark": "roofline", "load_average": load, "results": results}))


if __name__ == "__main__":
    main()
