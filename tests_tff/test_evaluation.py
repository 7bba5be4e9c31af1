"""Federated evaluation through tff.learning.algorithms.build_fed_eval under our
EvaluationManager, forked from our train_model.
"""

from __future__ import annotations

import datetime

import pytest
import tensorflow_federated as tff
from conftest import PER_ROUND, SEED, model_fn

from managers import FileProgramStateManager, MemoryReleaseManager
from managers.serialization import dumps
from programlogic import EvaluationManager, train_model
from programlogic.contexts.tff import (
    TFFContext,
    TFFLearningProcess,
    build_tff_evaluation,
    to_plain,
)
from programlogic.evaluation import evaluation_seed

pytestmark = pytest.mark.anyio

ROUNDS = 4
COHORT = 3


async def test_the_evaluation_manager_releases_build_fed_evals_metrics(
    fedavg, data_source, datasets, tmp_path
) -> None:
    evaluation = build_tff_evaluation(model_fn)
    aggregated = MemoryReleaseManager()
    per_round: dict[str, MemoryReleaseManager] = {}

    def create_process(name: str):
        per_round[name] = MemoryReleaseManager()
        return evaluation, per_round[name]

    manager = EvaluationManager(
        data_source=data_source,
        aggregated_metrics_manager=aggregated,
        create_state_manager_fn=lambda name: FileProgramStateManager(tmp_path / "eval" / name),
        create_process_fn=create_process,
        cohort_size=COHORT,
        duration=datetime.timedelta(0),
        seed=SEED,
    )
    process = TFFLearningProcess(fedavg)
    async with TFFContext() as context:
        result = await train_model(
            train_process=process,
            train_data_source=data_source,
            train_per_round_clients=PER_ROUND,
            train_total_rounds=ROUNDS,
            program_state_manager=FileProgramStateManager(tmp_path / "train"),
            model_output_manager=MemoryReleaseManager(),
            evaluation_manager=manager,
            evaluation_periodicity=2,
            seed=SEED,
        )

        # TFF's own evaluation of the final weights on the clients the manager sampled.
        def tff_evaluation_of(weights, train_round):
            clients = data_source.iterator(evaluation_seed(SEED, train_round)).select(COHORT, 1)
            state = evaluation.tff_process.initialize()
            state = evaluation.tff_process.set_model_weights(state, weights)
            output = evaluation.tff_process.next(state, [datasets[c.client_id] for c in clients])
            return output.metrics

        final_weights = process.to_tff_state(result.state).global_model_weights
        expected = await context.run(tff_evaluation_of, final_weights, ROUNDS)

    assert list(aggregated.values()) == [0, 2, 4]
    assert sorted(per_round) == [f"evaluation_of_round_{r}" for r in (0, 2, 4)]
    metrics = aggregated.values()
    for round_num in (0, 2, 4):
        current = metrics[round_num]["client_work"]["eval"]["current_round_metrics"]
        assert set(current) == {
            "sparse_categorical_accuracy",
            "loss",
            "num_examples",
            "num_batches",
        }
        assert current["num_examples"] > 0
    loss = lambda r: metrics[r]["client_work"]["eval"]["current_round_metrics"]["loss"]  # noqa: E731
    assert loss(4) < loss(0)
    metrics_type = evaluation.tff_process.next.type_signature.result.metrics
    assert dumps(metrics[ROUNDS]) == dumps(to_plain(expected, metrics_type))


async def test_build_tff_evaluation_checks_its_model_fn() -> None:
    with pytest.raises(TypeError, match="model_fn must be callable, got str"):
        build_tff_evaluation("model")
    assert isinstance(
        build_tff_evaluation(model_fn).tff_process, tff.learning.templates.LearningProcess
    )
