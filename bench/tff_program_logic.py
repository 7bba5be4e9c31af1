"""A TFF learning process under our train_model against under TFF's own program logic.

The same TFF 0.87 process (the tutorial's FedAvg: 784->10 softmax regression, zero
init, client SGD 0.02, server SGD 1.0) on the same data (``--clients`` synthetic clients
of 100 examples drawn as the anchor draws them, each ``repeat(5).shuffle(100,
seed=1).batch(5)``), every client every round, ``--rounds`` rounds, in one run:

- TFF: ``../shared/anchors/tff_program_logic.py ROUNDS CLIENTS``, run with this
  interpreter: ``tff.learning.programs.train_model`` in a ``NativeFederatedContext``
  with TFF's ``FileProgramStateManager(keep_total=3)`` and ``CSVFileReleaseManager``
  metrics, then a bare ``process.next`` loop. Errors that TFF only logs (its background
  saves race on retention) are counted from its stderr.
- ours: ``programlogic.train_model`` in a ``TFFContext`` on
  ``TFFLearningProcess(process)`` with our ``FileProgramStateManager(keep_total=3)`` and
  ``CSVFileReleaseManager`` metrics, then a bare loop of ``TFFLearningProcess.next``.

Seconds per round are counted as the anchor counts them: the whole call (initialize,
the initial save and every round) divided by the rounds, for both systems; the ratio is
ours over TFF's. Our steady rounds (the median gap between two metric releases, the
first round left out) are printed too. Prints a table, then one JSON line.

Runs in the TFF environment (``scripts/install_tff.sh``):

    python bench/tff_program_logic.py [--rounds 10] [--clients 10]

In CI: ``python bench/tff_program_logic.py --rounds 5`` (40-55 s on 2 busy cores).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

with warnings.catch_warnings():  # TensorFlow and TFF warn about their own dependencies
    warnings.simplefilter("ignore")
    import numpy as np
    import tensorflow as tf
    import tensorflow_federated as tff

from _anchor_process import run_anchor_process

import programlogic
from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    MemoryReleaseManager,
    ReleaseManager,
)
from programlogic import InMemoryDataSource, Sampling, train_model
from programlogic.contexts.tff import TFFContext, TFFLearningProcess

REPO = Path(__file__).resolve().parent.parent
ANCHOR = REPO.parent / "shared" / "anchors" / "tff_program_logic.py"
EXAMPLES_PER_CLIENT = 100


def make_datasets(count: int) -> list[tf.data.Dataset]:
    """The anchor's clients: the same draws, the same pipeline."""
    rng = np.random.default_rng(0)
    arrays = [
        (
            rng.random((EXAMPLES_PER_CLIENT, 784), dtype=np.float32),
            rng.integers(0, 10, (EXAMPLES_PER_CLIENT, 1)).astype(np.int32),
        )
        for _ in range(count)
    ]
    return [
        tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))
        .repeat(5)
        .shuffle(100, seed=1)
        .batch(5)
        for x, y in arrays
    ]


def build_process(element_spec: Any) -> tff.learning.templates.LearningProcess:
    """The anchor's FedAvg process."""

    def model_fn() -> tff.learning.models.VariableModel:
        keras_model = tf.keras.models.Sequential(
            [
                tf.keras.layers.InputLayer(input_shape=(784,)),
                tf.keras.layers.Dense(10, kernel_initializer="zeros"),
                tf.keras.layers.Softmax(),
            ]
        )
        return tff.learning.models.from_keras_model(
            keras_model,
            input_spec=element_spec,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(),
            metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
        )

    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.02),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    )


def run_anchor(rounds: int, clients: int) -> dict[str, Any]:
    """The anchor's JSON line, plus the count of errors TFF logged instead of raising."""
    if not ANCHOR.exists():
        sys.exit(f"tff_program_logic: {ANCHOR} is missing (shared/ must sit beside the repo)")
    command = [sys.executable, str(ANCHOR), str(rounds), str(clients)]
    returncode, stdout, stderr = run_anchor_process(command)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if returncode != 0 or not lines:
        sys.exit(f"tff_program_logic: {' '.join(command)} failed ({returncode}):\n{stderr[-2000:]}")
    result = json.loads(lines[-1])
    logged = [line for line in stderr.splitlines() if line.startswith("ERROR")]
    result["logged_errors"] = len(logged)
    result["first_logged_error"] = logged[0][:200] if logged else None
    return result


class ReleaseTimes(ReleaseManager):
    """Hands each release on to ``inner``, then notes when its key was released."""

    def __init__(self, inner: ReleaseManager) -> None:
        self.inner = inner
        self.times: dict[int, float] = {}

    async def release(self, value: Any, key: int | str) -> None:
        await self.inner.release(value, key)
        if isinstance(key, int):
            self.times[key] = time.perf_counter()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def run_ours(rounds: int, clients: int, directory: Path) -> dict[str, Any]:
    """Our train_model with file state and CSV metrics, then a bare loop, same process."""
    datasets = make_datasets(clients)
    process = TFFLearningProcess(build_process(datasets[0].element_spec))
    source = InMemoryDataSource(
        {f"client_{index:04d}": data for index, data in enumerate(datasets)},
        sampling=Sampling.FIXED,
    )
    async with (
        TFFContext(),
        FileProgramStateManager(directory / "state", keep_total=3) as state_manager,
        ReleaseTimes(CSVFileReleaseManager(directory / "metrics.csv")) as metrics,
    ):
        start = time.perf_counter()
        await train_model(
            train_process=process,
            train_data_source=source,
            train_per_round_clients=clients,
            train_total_rounds=rounds,
            program_state_manager=state_manager,
            model_output_manager=MemoryReleaseManager(),
            train_metrics_manager=metrics,
            seed=0,
        )
        with_logic = time.perf_counter() - start
        handles = source.iterator(0).select(clients, 1)
        start = time.perf_counter()
        state = await process.initialize()
        for _ in range(rounds):
            state = (await process.next(state, handles)).state
        bare = time.perf_counter() - start
    stamps = [metrics.times[key] for key in range(1, rounds + 1)]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "train_model_s_per_round": with_logic / rounds,
        "bare_loop_s_per_round": bare / rounds,
        "steady_round_median_s": statistics.median(gaps) if gaps else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10)
    arguments = parser.parse_args()
    if arguments.rounds < 2 or arguments.clients < 1:
        parser.error("--rounds must be at least 2 and --clients at least 1")
    load_before = os.getloadavg()[0]
    theirs = run_anchor(arguments.rounds, arguments.clients)
    with tempfile.TemporaryDirectory(prefix="tff_program_logic_") as scratch:
        ours = programlogic.run(run_ours(arguments.rounds, arguments.clients, Path(scratch)))
    row = {
        "rounds": arguments.rounds,
        "clients": arguments.clients,
        "tff_train_model_ms": theirs["train_model_s_per_round"] * 1e3,
        "tff_bare_ms": theirs["bare_loop_s_per_round"] * 1e3,
        "tff_logged_errors": theirs["logged_errors"],
        "tff_first_logged_error": theirs["first_logged_error"],
        "ours_train_model_ms": ours["train_model_s_per_round"] * 1e3,
        "ours_bare_ms": ours["bare_loop_s_per_round"] * 1e3,
        "ours_steady_round_median_ms": ours["steady_round_median_s"] * 1e3,
        "load_average_1min": [load_before, os.getloadavg()[0]],
    }
    row["ratio_ours_over_tff"] = row["ours_train_model_ms"] / row["tff_train_model_ms"]
    row["tff_logic_overhead_pct"] = 100 * (row["tff_train_model_ms"] / row["tff_bare_ms"] - 1)
    row["ours_logic_overhead_pct"] = 100 * (row["ours_train_model_ms"] / row["ours_bare_ms"] - 1)
    print(
        f"{arguments.clients} clients x {arguments.rounds} rounds, ms per round "
        "(whole call / rounds, initialize and initial save included)"
    )
    print(f"{'':32}{'train_model':>12}{'bare loop':>12}{'logic overhead':>16}")
    for name, prefix in (("TFF 0.87 program logic", "tff"), ("ours (TFFContext)", "ours")):
        print(
            f"{name:32}{row[prefix + '_train_model_ms']:12.1f}{row[prefix + '_bare_ms']:12.1f}"
            f"{row[prefix + '_logic_overhead_pct']:+15.1f}%"
        )
    print(f"ratio ours / TFF (train_model): {row['ratio_ours_over_tff']:.3f}")
    print(f"errors TFF logged without failing the run: {row['tff_logged_errors']}")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
