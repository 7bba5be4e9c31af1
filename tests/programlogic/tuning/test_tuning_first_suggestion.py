"""A trial's first suggestion need not read the study: a sampler that reads nothing
(Optuna's RandomSampler), or a parameter of a single value, still makes trials."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

from programlogic import LocalContext
from programlogic.testing import FakeDataSource, FakeEvaluationProcess, FakeLearningProcess
from programlogic.tuning import TrialProgram, TrialSpec, tune

pytestmark = pytest.mark.anyio


def build(spec: TrialSpec) -> TrialProgram:
    return TrialProgram(
        train_process=FakeLearningProcess(learning_rate=spec.params["learning_rate"]),
        train_data_source=FakeDataSource(10),
        train_per_round_clients=2,
        train_total_rounds=2,
        evaluation_process=FakeEvaluationProcess(),
        evaluation_data_source=FakeDataSource(10, seed=1),
        evaluation_per_round_clients=2,
    )


def random_sampler(seed: int) -> Any:
    return optuna.samplers.RandomSampler(seed=seed)


@pytest.mark.parametrize(
    ("search_space", "sampler", "learning_rates"),
    [
        (lambda trial: trial.suggest_float("learning_rate", 0.5, 0.5), None, {0.5}),
        (lambda trial: trial.suggest_float("learning_rate", 0.1, 0.9), random_sampler, None),
    ],
    ids=["single-value", "random-sampler"],
)
async def test_a_first_suggestion_that_reads_no_trials_makes_a_trial(
    tmp_path: Path,
    search_space: Callable[[Any], Any],
    sampler: Callable[[int], Any] | None,
    learning_rates: set[float] | None,
) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    async with LocalContext():
        result = await tune(
            search_space=search_space,
            build_trial=build,
            metric="eval/loss",
            direction="minimize",
            num_trials=2,
            root=tmp_path,
            sampler=sampler,
        )
    assert [trial.state for trial in result.trials] == ["complete", "complete"]
    rates = {trial.params["learning_rate"] for trial in result.trials}
    assert rates == learning_rates if learning_rates else len(rates) == 2
