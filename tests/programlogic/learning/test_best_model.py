"""The best model by a held-out metric: FedAvg on the digits, an evaluation every round,
and on disk the rounds that were the best when evaluated, the best of all the highest.

A run stopped after round 3 and continued keeps the best so far: a worse round after the
restart is not written.
"""

import datetime
import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from managers import (
    BestModelReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    ModelFileReleaseManager,
    ProgramStateManager,
)
from programlogic import EvaluationManager, LocalContext, train_model
from programlogic.datasets import Preprocessing, load_digits_writers
from programlogic.learning import (
    KerasModelReleaseManager,
    build_fed_eval,
    build_weighted_fed_avg,
    sgd,
    softmax_regression,
)
from programlogic.learning._tensorflow import keras

# Keras' .keras writer reads a TensorFlow variable with np.array(variable, copy=False),
# which NumPy 2 warns about (TensorFlow's variables predate the copy keyword).
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings(
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
    ),
]

ACCURACY = "client_work/eval/total_rounds_metrics/sparse_categorical_accuracy"
DIGITS = load_digits_writers()
MODEL_FN = functools.partial(softmax_regression, DIGITS.feature_shape, DIGITS.num_classes)
PROCESS = build_weighted_fed_avg(
    MODEL_FN,
    sgd(1.0),  # large steps: held-out accuracy goes down as well as up
    sgd(1.0),
    preprocess=Preprocessing(epochs=1, batch_size=20, shuffle_buffer=100),
)
EVALUATION = build_fed_eval(MODEL_FN, train_process=PROCESS)


def accuracy(metrics: Any) -> float:
    return metrics["client_work"]["eval"]["total_rounds_metrics"]["sparse_categorical_accuracy"]


async def train(root: Path, rounds: int) -> tuple[dict[int, Any], Any]:
    """Train up to ``rounds`` under ``root``, a restart when ``root`` holds a run.

    Returns the evaluated models by round ({"weights", "metrics"}) and what the best
    manager names the best.
    """
    async with (
        FileProgramStateManager(root / "state") as state,
        FileProgramStateManager(root / "best_so_far", keep_total=1) as best_so_far,
    ):
        return await train_with(root, rounds, state, best_so_far)


async def train_with(
    root: Path, rounds: int, state: ProgramStateManager, best_so_far: ProgramStateManager
) -> tuple[dict[int, Any], Any]:
    evaluated = MemoryReleaseManager()
    best = BestModelReleaseManager(
        KerasModelReleaseManager(root, MODEL_FN, formats=("keras",), name="best"),
        ACCURACY,
        state_manager=best_so_far,
    )
    evaluations = EvaluationManager(
        data_source=DIGITS.test,
        aggregated_metrics_manager=MemoryReleaseManager(),
        create_state_manager_fn=lambda name: FileProgramStateManager(root / "evaluation" / name),
        create_process_fn=lambda name: (EVALUATION, MemoryReleaseManager()),
        cohort_size=4,
        duration=datetime.timedelta(0),
        max_concurrent=1,  # evaluations finish in round order
        evaluated_model_manager=GroupingReleaseManager([best, evaluated]),
    )
    async with LocalContext(max_workers=2):
        await train_model(
            train_process=PROCESS,
            train_data_source=DIGITS.train,
            train_per_round_clients=3,
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=ModelFileReleaseManager(root / "final"),
            evaluation_manager=evaluations,
        )
    return evaluated.values(), await best.best()


def running_bests(evaluated: dict[int, Any]) -> list[int]:
    """The rounds whose accuracy beat every round before them."""
    bests, top = [], -1.0
    for round_num in sorted(evaluated):
        if accuracy(evaluated[round_num]["metrics"]) > top:
            bests.append(round_num)
            top = accuracy(evaluated[round_num]["metrics"])
    return bests


def on_disk(root: Path) -> list[int]:
    return sorted(int(version.name) for version in (root / "best").iterdir())


def kernel(root: Path, round_num: int) -> np.ndarray:
    return keras.saving.load_model(root / "best" / str(round_num) / "best.keras").get_weights()[0]


async def test_the_best_model_on_disk_is_the_round_with_the_best_metric(tmp_path: Path) -> None:
    evaluated, best = await train(tmp_path, 8)
    assert sorted(evaluated) == list(range(9))  # the initial model and every round
    accuracies = {r: accuracy(value["metrics"]) for r, value in evaluated.items()}
    top = max(accuracies, key=lambda r: (accuracies[r], -r))  # the first to reach the top
    assert on_disk(tmp_path) == running_bests(evaluated)
    assert on_disk(tmp_path)[-1] == top and top != 8  # not merely the last round
    assert best == (top, accuracies[top])
    for round_num in on_disk(tmp_path):
        np.testing.assert_array_equal(
            kernel(tmp_path, round_num), evaluated[round_num]["weights"]["trainable"][0]
        )


async def test_a_restart_in_the_middle_keeps_the_best_so_far(tmp_path: Path) -> None:
    whole, _ = await train(tmp_path / "whole", 8)
    first, _ = await train(tmp_path / "pieces", 3)
    second, best = await train(tmp_path / "pieces", 8)
    assert sorted(first) == [0, 1, 2, 3] and sorted(second) == [4, 5, 6, 7, 8]
    # A round after the restart is worse than the best before it: only the saved best
    # keeps it off the disk.
    best_before = max(accuracy(first[r]["metrics"]) for r in first)
    assert accuracy(second[4]["metrics"]) < best_before
    assert on_disk(tmp_path / "pieces") == on_disk(tmp_path / "whole") == running_bests(whole)
    assert best is not None and best[0] == on_disk(tmp_path / "whole")[-1]
    for round_num in on_disk(tmp_path / "whole"):
        np.testing.assert_array_equal(
            kernel(tmp_path / "pieces", round_num), kernel(tmp_path / "whole", round_num)
        )


async def test_a_worse_or_missing_metric_is_not_released() -> None:
    memory = MemoryReleaseManager()
    saved = MemoryProgramStateManager(keep_total=1)

    def evaluated(loss: float) -> dict[str, Any]:
        return {"weights": [np.full(2, loss)], "metrics": {"eval": {"loss": loss}}}

    async with BestModelReleaseManager(memory, "eval/loss", "min", state_manager=saved) as best:
        await best.release(evaluated(0.5), 1)
        await best.release(evaluated(0.7), 2)  # worse
        await best.release(evaluated(float("nan")), 3)  # never the best
        await best.release(evaluated(0.4), 4)
        await best.release(evaluated(0.45), 4)  # the best's key again: replaces it
        with pytest.raises(ValueError, match="hold no 'eval/loss'"):
            await best.release({"weights": [], "metrics": {"eval": {}}}, 5)
        with pytest.raises(TypeError, match=r"releases \{'weights'"):
            await best.release([np.zeros(2)], 6)
    async with BestModelReleaseManager(memory, "eval/loss", "min", state_manager=saved) as again:
        assert await again.best() == (4, 0.45)
        await again.release(evaluated(0.46), 7)  # worse than the best before the restart
        await again.release(evaluated(0.3), 8)
    held = memory.values()
    assert sorted(held) == [1, 4, 8]
    assert held[4][0].tolist() == [0.45, 0.45]
