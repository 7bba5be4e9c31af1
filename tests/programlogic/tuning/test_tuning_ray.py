"""``tune`` on Ray: trials share one RayContext and end as they do on the local context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from programlogic import FederatedContext, LocalContext
from programlogic.testing import FakeDataSource, FakeEvaluationProcess, FakeLearningProcess
from programlogic.tuning import TrialProgram, TrialSpec, tune

pytestmark = pytest.mark.anyio

optuna.logging.set_verbosity(optuna.logging.WARNING)


def search_space(trial: optuna.Trial) -> None:
    trial.suggest_float("learning_rate", 0.05, 1.0, log=True)


def build(spec: TrialSpec) -> TrialProgram:
    return TrialProgram(
        train_process=FakeLearningProcess(learning_rate=spec.params["learning_rate"]),
        train_data_source=FakeDataSource(8),
        train_per_round_clients=4,
        train_total_rounds=4,
        evaluation_process=FakeEvaluationProcess(),
        evaluation_data_source=FakeDataSource(3, seed=1),
        evaluation_per_round_clients=3,
        evaluation_periodicity=2,
    )


async def study(context: FederatedContext, root: Path) -> list[tuple[Any, ...]]:
    async with context:
        result = await tune(
            search_space=search_space,
            build_trial=build,
            metric="eval/loss",
            direction="minimize",
            num_trials=4,
            root=root,
            concurrency=2,
            # Suggestions that depend on (seed, trial, parameter) only, and no pruning:
            # the study does not depend on which concurrent trial ends first.
            sampler=lambda seed: optuna.samplers.RandomSampler(seed=seed),
            pruner=optuna.pruners.NopPruner(),
        )
    return [
        (trial.number, trial.state, trial.params, trial.value, trial.intermediate_values)
        for trial in result.trials
    ]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # starting Ray is what costs
async def test_trials_on_ray_end_as_on_the_local_context(cluster: Any, tmp_path: Path) -> None:
    from programlogic.contexts.ray import RayContext

    on_ray = await study(RayContext(cluster.address, max_workers=2), tmp_path / "ray")
    local = await study(LocalContext(), tmp_path / "local")
    assert on_ray == local
    assert [state for _, state, *_ in on_ray] == ["complete"] * 4
    for number in range(4):
        trial = f"trials/{number}/metrics.csv"
        assert (tmp_path / "ray" / trial).read_text() == (tmp_path / "local" / trial).read_text()
