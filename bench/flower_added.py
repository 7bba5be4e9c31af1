"""What programlogic adds to a Flower round: train_model on FlowerContext against Flower's FedAvg.

Both run in one process on one federation of Flower's own machinery
(:class:`~programlogic.contexts.flower.InProcessFederation`: its ``InMemoryGrid`` and
link state, a thread a node), 10 nodes each holding one writer of the bundled digits,
every node sampled every round, no evaluation:

- Flower: its Message API strategy ``flwr.serverapp.strategy.FedAvg`` (``strategy.start``)
  and a ClientApp that trains a Keras softmax regression with ``model.fit`` (1 epoch,
  batch 10, SGD 0.05);
- ours: ``train_model`` on ``FlowerContext`` with file program state (fsynced, every
  round) and a CSV metrics file, FedAvg of the same model and settings through the
  ClientApp of ``make_client_app``.

The client work differs (Keras's fit against our compiled client update), so besides
the median round of each, the bench measures each side's *added* time the same way: a
round's wall time minus the time of its client call (Flower: ``send_and_receive``; ours:
``FlowerContext.stream_units``), which holds the messages, the nodes' work and the
polling. What is left is the server side: aggregation, checkpoints, releases, the
strategy or the loop. Both Grids poll every ``--poll`` seconds. Prints one JSON line.

    python bench/flower_added.py [--rounds 12] [--warmup 2] [--poll 0.01]

Run it with an interpreter that has the ``flower`` and ``learning`` extras.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import numpy as np

import programlogic
from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    MemoryReleaseManager,
)
from programlogic import train_model
from programlogic.contexts.flower import (
    FlowerContext,
    InProcessFederation,
    make_client_app,
    node_data_source,
)
from programlogic.datasets import Preprocessing, load_digits_writers
from programlogic.learning import build_weighted_fed_avg, sgd, softmax_regression

DIGITS = load_digits_writers()
WRITERS = DIGITS.train.client_ids
LEARNING_RATE = 0.05
BATCH = 10


def load(node_config: Mapping[str, Any], split: str) -> Any:
    """A node's writer's digits (the data hook of both sides' nodes)."""
    (handle,) = [h for h in DIGITS.train.all_clients() if h.client_id == node_config["client-id"]]
    return handle.load()


class _Timed:
    """Round ends, and the (start, end) of each client call, in seconds."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.calls: list[tuple[float, float]] = []

    def added_ms(self, warmup: int) -> tuple[list[float], list[float]]:
        """Each round's wall time, and that time less its client calls' (in ms)."""
        rounds, added = [], []
        for start, end in zip(self.ends, self.ends[1:], strict=False):
            inside = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.calls)
            rounds.append(1000 * (end - start))
            added.append(1000 * (end - start - inside))
        return rounds[warmup:], added[warmup:]


def flower_fed_avg(rounds: int, poll: float) -> _Timed:
    import tensorflow as tf
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp.strategy import FedAvg

    timed = _Timed()
    models: dict[str, Any] = {}
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        client_id = context.node_config["client-id"]
        if client_id not in models:
            model = tf.keras.Sequential(
                [
                    tf.keras.Input(DIGITS.feature_shape),
                    tf.keras.layers.Dense(DIGITS.num_classes, kernel_initializer="zeros"),
                    tf.keras.layers.Softmax(),
                ]
            )
            model.compile(tf.keras.optimizers.SGD(LEARNING_RATE), "sparse_categorical_crossentropy")
            models[client_id] = model
        model = models[client_id]
        data = load(context.node_config, "train")
        model.set_weights(message.content["arrays"].to_numpy_ndarrays())
        model.fit(data.x, data.y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        metrics = MetricRecord({"num-examples": len(data.y)})
        return Message(
            RecordDict({"arrays": ArrayRecord(model.get_weights()), "metrics": metrics}),
            reply_to=message,
        )

    class TimedFedAvg(FedAvg):
        def aggregate_train(self, server_round: int, replies: Any) -> Any:
            result = super().aggregate_train(server_round, replies)
            timed.ends.append(time.perf_counter())
            return result

    with InProcessFederation(app, WRITERS) as federation:
        grid = federation.grid
        grid.pull_interval = poll
        send_and_receive = grid.send_and_receive

        def timed_send_and_receive(messages: Any, *, timeout: float | None = None) -> Any:
            start = time.perf_counter()
            try:
                return send_and_receive(messages, timeout=timeout)
            finally:
                timed.calls.append((start, time.perf_counter()))

        grid.send_and_receive = timed_send_and_receive
        weights = [
            np.zeros((int(np.prod(DIGITS.feature_shape)), DIGITS.num_classes), np.float32),
            np.zeros(DIGITS.num_classes, np.float32),
        ]
        strategy = TimedFedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=len(WRITERS),
            min_available_nodes=len(WRITERS),
        )
        timed.ends.append(time.perf_counter())
        strategy.start(grid, ArrayRecord(weights), num_rounds=rounds, train_config=ConfigRecord({}))
    return timed


class _TimedContext(FlowerContext):
    timed: _Timed

    async def stream_units(self, *args: Any) -> None:
        start = time.perf_counter()
        try:
            await super().stream_units(*args)
        finally:
            self.timed.calls.append((start, time.perf_counter()))


class _RoundEnds(MemoryReleaseManager):
    def __init__(self, timed: _Timed) -> None:
        super().__init__()
        self.timed = timed

    async def release(self, value: Any, key: Any) -> None:
        self.timed.ends.append(time.perf_counter())
        await super().release(value, key)


async def _ours(grid: Any, rounds: int, poll: float, root: Path) -> _Timed:
    timed = _Timed()
    model_fn = functools.partial(softmax_regression, DIGITS.feature_shape, DIGITS.num_classes)
    process = build_weighted_fed_avg(
        model_fn,
        client_optimizer=sgd(LEARNING_RATE),
        server_optimizer=sgd(1.0),
        preprocess=Preprocessing(epochs=1, batch_size=BATCH),
    )
    context = _TimedContext(grid, poll_interval=poll)
    context.timed = timed
    async with (
        context,
        FileProgramStateManager(root / "state") as state,
        CSVFileReleaseManager(root / "metrics.csv") as csv,
    ):
        timed.ends.append(time.perf_counter())
        await train_model(
            train_process=process,
            train_data_source=node_data_source(WRITERS, "train"),
            train_per_round_clients=len(WRITERS),
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=MemoryReleaseManager(),
            train_metrics_manager=GroupingReleaseManager([csv, _RoundEnds(timed)]),
        )
    return timed


def ours(rounds: int, poll: float) -> _Timed:
    with (
        tempfile.TemporaryDirectory() as root,
        InProcessFederation(make_client_app(load), WRITERS) as federation,
    ):
        return programlogic.run(_ours(federation.grid, rounds, poll, Path(root)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--poll", type=float, default=0.01)
    arguments = parser.parse_args()
    figures: dict[str, Any] = {"clients": len(WRITERS), "poll_s": arguments.poll}
    for name, run in (("flower", flower_fed_avg), ("ours", ours)):
        round_ms, added_ms = run(arguments.rounds, arguments.poll).added_ms(arguments.warmup)
        figures[f"{name}_median_round_ms"] = round(statistics.median(round_ms), 2)
        figures[f"{name}_median_added_ms"] = round(statistics.median(added_ms), 2)
        figures[f"{name}_added_ms"] = [round(value, 2) for value in added_ms]
    figures["ours_minus_flower_added_ms"] = round(
        figures["ours_median_added_ms"] - figures["flower_median_added_ms"], 2
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
