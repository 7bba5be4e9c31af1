"""A TensorFlow Federated program moved to programlogic: TFF's FedAvg, our program logic.

The program a TFF user has (TFF 0.87, ``tff.program`` style) trains
``tff.learning.algorithms.build_weighted_fed_avg`` on federated data and runs it with
``tff.learning.programs.train_model`` inside a ``tff.program.NativeFederatedContext``,
checkpointing with ``tff.program.FileProgramStateManager`` and writing metrics with
``tff.program.CSVFileReleaseManager``. Here the same TFF process (built by the same
code, :func:`build_process`) runs under :func:`programlogic.train_model`:

==========================================  ============================================
TFF program                                  this program
==========================================  ============================================
``NativeFederatedContext(...)``              ``TFFContext()`` (``async with``)
the ``LearningProcess`` itself               ``TFFLearningProcess(process, client_data_fn)``
``DatasetDataSource(datasets)``              ``load_digits_writers().train`` (our source)
``FileProgramStateManager(dir)``             ``managers.FileProgramStateManager(dir)``
``CSVFileReleaseManager(path)``              ``managers.CSVFileReleaseManager(path)``
``train_model(...)``                         ``programlogic.train_model(..., seed=)``
``build_fed_eval`` + ``EvaluationManager``   ``build_tff_evaluation`` + ``evaluate_once``
``asyncio.run(main())``                      ``programlogic.run(main())``
==========================================  ============================================

The data is scikit-learn's bundled handwritten digits split by writer (10 training
writers, 4 held out; :func:`programlogic.datasets.load_digits_writers`). Each round
``--clients-per-round`` writers, sampled from ``--seed`` and the round, train a softmax
regression for ``--epochs`` epochs of batches of ``--batch-size`` with SGD 0.02; the
server applies their example-weighted mean update (SGD 1.0). Under ``--root`` (default
``runs/tff_program``): ``state/`` (a checkpoint per round, the newest 3 kept),
``metrics.csv`` (a row per round, columns ``client_work/train/...`` as TFF names the
metrics) and ``models/`` (the final weights). Stop it and run it again: it resumes after
the last saved round, with the clients the uninterrupted run would have sampled.

Needs the TFF environment (``scripts/install_tff.sh``) with scikit-learn.

    python samples/tff_program.py [--rounds 10] [--clients-per-round 5] [--root DIR]
"""

from __future__ import annotations

import argparse
import collections
import csv
import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

with warnings.catch_warnings():  # TensorFlow and TFF warn about their own dependencies
    warnings.simplefilter("ignore")
    import tensorflow as tf
    import tensorflow_federated as tff

import programlogic
from managers import CSVFileReleaseManager, FileProgramStateManager, ModelFileReleaseManager
from programlogic import TrainingResult, evaluate_once, final_model_key, train_model
from programlogic.contexts.tff import TFFContext, TFFLearningProcess, build_tff_evaluation
from programlogic.datasets import load_digits_writers
from programlogic.datasets.arrays import ClientArrays

FEATURES = 64
CLASSES = 10
ELEMENT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, FEATURES], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def model_fn() -> tff.learning.models.VariableModel:
    """The tutorial's softmax regression, zero-initialized, as a TFF model."""
    keras_model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
            tf.keras.layers.Dense(CLASSES, kernel_initializer="zeros"),
        ]
    )
    return tff.learning.models.from_keras_model(
        keras_model,
        input_spec=ELEMENT_SPEC,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )


def build_process() -> tff.learning.templates.LearningProcess:
    """TFF's FedAvg, exactly as the TFF program builds it."""
    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.02),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    )


def client_dataset(arrays: ClientArrays, *, epochs: int, batch_size: int) -> tf.data.Dataset:
    """A writer's digits as the dataset TFF's process trains on (no shuffle: reproducible)."""
    examples = collections.OrderedDict(x=arrays.x, y=arrays.y)
    return tf.data.Dataset.from_tensor_slices(examples).repeat(epochs).batch(batch_size)


async def main(arguments: argparse.Namespace) -> tuple[TrainingResult, dict[str, Any]]:
    """Train, checkpoint and release as the TFF program did; the result, held-out metrics."""
    root = Path(arguments.root)
    data = load_digits_writers()
    train_data = functools.partial(
        client_dataset, epochs=arguments.epochs, batch_size=arguments.batch_size
    )
    process = TFFLearningProcess(build_process(), client_data_fn=train_data)
    async with (
        TFFContext(),
        FileProgramStateManager(root / "state", keep_total=3) as state_manager,
        CSVFileReleaseManager(root / "metrics.csv") as metrics,
    ):
        result = await train_model(
            train_process=process,
            train_data_source=data.train,
            train_per_round_clients=arguments.clients_per_round,
            train_total_rounds=arguments.rounds,
            program_state_manager=state_manager,
            model_output_manager=ModelFileReleaseManager(root / "models"),
            train_metrics_manager=metrics,
            seed=arguments.seed,
        )
        evaluation = build_tff_evaluation(
            model_fn, client_data_fn=functools.partial(client_dataset, epochs=1, batch_size=32)
        )
        weights = await process.get_model_weights(result.state)
        return result, await evaluate_once(evaluation, weights, data.test)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds to train in all")
    parser.add_argument("--clients-per-round", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5, help="local epochs per round")
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampling of clients")
    parser.add_argument("--root", default="runs/tff_program", help="where state and files go")
    return parser.parse_args(argv)


def main_cli(argv: list[str] | None = None) -> None:
    """Run the program; print each round's training loss and the held-out accuracy."""
    arguments = parse_arguments(argv)
    result, held_out = programlogic.run(main(arguments))
    if result.resumed_from is not None:
        print(f"resumed after round {result.resumed_from}")
    with open(Path(arguments.root) / "metrics.csv", newline="") as file:
        for row in csv.DictReader(file):
            print(f"round {row['key']}: loss {float(row['client_work/train/loss']):.4f}")
    accuracy = held_out["client_work"]["eval"]["current_round_metrics"]
    print(f"held-out accuracy {float(accuracy['sparse_categorical_accuracy']):.4f}")
    print(f"final model: {Path(arguments.root) / 'models'} ({final_model_key(arguments.rounds)})")


if __name__ == "__main__":
    sys.exit(main_cli())
