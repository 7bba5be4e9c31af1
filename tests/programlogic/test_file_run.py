"""FileRun: a train_model run's files under one root, found again by a rerun."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from managers import MemoryReleaseManager
from programlogic import (
    FileRun,
    FileRunEvaluation,
    LocalContext,
    final_model_key,
    train_model,
)
from programlogic.testing import FakeDataSource, FakeEvaluationProcess, FakeLearningProcess

pytestmark = pytest.mark.anyio

ROUNDS = 4


def evaluation(**overrides: Any) -> FileRunEvaluation:
    arguments: dict[str, Any] = {
        "process": FakeEvaluationProcess(),
        "data_source": FakeDataSource(4, seed=1),
        "cohort_size": 2,
        **overrides,
    }
    return FileRunEvaluation(**arguments)


async def train(run: FileRun, rounds: int = ROUNDS) -> Any:
    return await train_model(
        train_process=FakeLearningProcess(),
        train_data_source=FakeDataSource(),
        train_per_round_clients=3,
        train_total_rounds=rounds,
        evaluation_periodicity=2,
        **run.train_model_arguments(),
    )


def csv_keys(path: Path) -> list[str]:
    with path.open(newline="") as file:
        return [row["key"] for row in csv.DictReader(file)]


async def test_a_run_keeps_its_state_metrics_evaluations_and_model_under_its_root(
    tmp_path: Path,
) -> None:
    root = tmp_path / "a" / "run"  # parents are created
    extra = MemoryReleaseManager()
    async with LocalContext():
        async with FileRun(
            root,
            metrics_formats=("csv", "jsonl"),
            metrics_managers=[extra],
            evaluation=evaluation(),
        ) as run:
            result = await train(run)
            final = await run.model_files.load(final_model_key(result.round_num))
            released = await run.model_files.keys()
    assert csv_keys(root / "metrics.csv") == [str(r) for r in range(1, ROUNDS + 1)]
    lines = (root / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == list(range(1, ROUNDS + 1))
    assert list(extra.values()) == list(range(1, ROUNDS + 1))
    assert csv_keys(root / "evaluation.csv") == ["0", "2", "4"]
    assert (root / "evaluation.jsonl").exists()
    assert sorted(path.name for path in (root / "state").iterdir())
    assert (root / "evaluation").is_dir()
    assert final_model_key(ROUNDS) in released
    assert np.asarray(final).shape == (2,) and np.isfinite(final).all()


async def test_a_rerun_on_the_same_root_resumes(tmp_path: Path) -> None:
    async with LocalContext():
        async with FileRun(tmp_path, evaluation=evaluation()) as run:
            await train(run, rounds=2)
        async with FileRun(tmp_path, evaluation=evaluation()) as run:
            result = await train(run)
    assert result.resumed_from == 2
    assert csv_keys(tmp_path / "metrics.csv") == [str(r) for r in range(1, ROUNDS + 1)]
    assert csv_keys(tmp_path / "evaluation.csv") == ["0", "2", "4"]


async def test_without_an_evaluation_train_model_gets_no_evaluation_manager(
    tmp_path: Path,
) -> None:
    async with FileRun(tmp_path) as run:
        assert "evaluation_manager" not in run.train_model_arguments()
        assert run.evaluations is None
    assert not (tmp_path / "evaluation.csv").exists()


async def test_the_managers_passed_in_stay_open_after_the_run(tmp_path: Path) -> None:
    class Closing(MemoryReleaseManager):
        closed = False

        async def aclose(self) -> None:
            self.closed = True

    mine = Closing()
    async with FileRun(tmp_path, metrics_managers=[mine], model_managers=[mine]):
        pass
    assert not mine.closed


async def test_a_root_that_is_a_file_is_named(tmp_path: Path) -> None:
    root = tmp_path / "taken"
    root.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match="taken"):
        async with FileRun(root):
            pass


@pytest.mark.parametrize(
    ("arguments", "error", "named"),
    [
        ({"root": 3}, TypeError, "root"),
        ({"root": ""}, ValueError, "root"),
        ({"metrics_formats": "csv"}, TypeError, "metrics_formats"),
        ({"metrics_formats": ("csv", "xml")}, ValueError, "metrics_formats"),
        ({"metrics_formats": ()}, ValueError, "metrics_formats"),
        ({"tensorboard": "yes"}, TypeError, "tensorboard"),
        ({"state_keep_total": 0}, ValueError, "state_keep_total"),
        ({"metrics_managers": [object()]}, TypeError, r"metrics_managers\[0\]"),
        ({"evaluation": object()}, TypeError, "evaluation"),
    ],
)
async def test_bad_arguments_are_named(
    tmp_path: Path, arguments: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        FileRun(**{"root": tmp_path, **arguments})


@pytest.mark.parametrize(
    ("overrides", "error", "named"),
    [
        ({"process": object()}, TypeError, "process"),
        ({"cohort_size": 0}, ValueError, "cohort_size"),
        ({"state_keep_total": 0}, ValueError, "state_keep_total"),
        ({"per_round_metrics_manager": 1}, TypeError, "per_round_metrics_manager"),
    ],
)
async def test_bad_evaluation_arguments_are_named(
    overrides: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        evaluation(**overrides)


async def test_tensorboard_gets_training_and_evaluation_metrics(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    async with LocalContext():
        async with FileRun(tmp_path, tensorboard=True, evaluation=evaluation()) as run:
            await train(run)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and all(path.stat().st_size > 0 for path in events)
