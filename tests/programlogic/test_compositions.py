"""Promises that cross pieces, over the matrix of compositions.

For program state in memory and on disk, a failure at each place a program can fail
(the process's ``next``, a save, a metrics release, the final model release, an
evaluation, the stopping policy), under asyncio and trio, in a LocalContext (and a
reduced set in a RayContext):

- ``train_model`` fails with that same exception object, and nothing else (no error
  caused by the first one reaches the caller, not even when the context is left);
- nothing is left running: no evaluation in the context's background work, no state
  directory locked;
- the same program run again in the same process (same directories, new manager
  objects, no garbage collection in between) resumes and ends as an uninterrupted run
  does: same final state, same released metrics, evaluations and model.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from managers import MemoryProgramStateManager, MemoryReleaseManager, ProgramStateManager
from managers.release.base import ReleaseManager
from managers.state.file import FileProgramStateManager
from programlogic import (
    EvaluationManager,
    FederatedContext,
    LocalContext,
    TrainingResult,
    final_model_key,
    train_model,
)
from programlogic.stopping import StoppingPolicy, StopReason
from programlogic.testing import (
    CrashingStateManager,
    FakeClock,
    FakeDataSource,
    FakeLearningProcess,
)

pytestmark = pytest.mark.anyio

ROUNDS = 4
FAILING_ROUND = 3
EVALUATED_ROUND = 2  # every second round is evaluated; this one's evaluation may fail

FAILURES = ["next", "save", "metrics release", "model release", "evaluation", "stopping policy"]


class Boom(Exception):
    """The failure injected into a program."""


class Failing(ReleaseManager):
    """Releases into ``inner``, except at ``key``, where it raises ``error``."""

    def __init__(self, inner: ReleaseManager, key: int | str, error: Exception) -> None:
        self.inner, self.key, self.error = inner, key, error

    async def release(self, value: Any, key: int | str) -> None:
        if key == self.key:
            raise self.error
        await self.inner.release(value, key)


class NeverStops(StoppingPolicy):
    """A stopping policy that never stops, and fails when asked about ``failing_round``."""

    def __init__(self, error: Exception | None, failing_round: int) -> None:
        self.error, self.failing_round = error, failing_round

    async def before_round(self, round_num: int) -> StopReason | None:
        if self.error is not None and round_num == self.failing_round:
            raise self.error
        return None


class Program:
    """One program's durable parts, which survive its reruns in this process.

    ``state`` is ``"memory"`` (the memory managers, one per name, are the durable
    store) or ``"file"`` (directories under ``root``; every call makes a new manager).
    """

    def __init__(self, state: str, root: Path) -> None:
        self.kind, self.root = state, root
        self.memory: dict[str, MemoryProgramStateManager] = {}
        self.metrics = MemoryReleaseManager()
        self.evaluations = MemoryReleaseManager()
        self.models = MemoryReleaseManager()
        self.clock = FakeClock()
        self.left_running: int | None = None
        self.cancel_scope: anyio.CancelScope | None = None  # cancelled by the "cancellation"
        self.evaluation_managers: list[EvaluationManager] = []  # kept referenced

    def state_manager(self, name: str) -> ProgramStateManager:
        if self.kind == "file":
            return FileProgramStateManager(self.root / name, keep_total=3)
        return self.memory.setdefault(name, MemoryProgramStateManager())

    async def run(
        self, context: FederatedContext, failure: str | None = None, boom: Exception | None = None
    ) -> TrainingResult:
        """Run the program once in ``context``, with ``failure`` raising ``boom``."""

        def fails(where: str) -> bool:
            return failure == where

        program = self

        class Process(FakeLearningProcess):
            async def next(self, state, clients):
                if state["rounds"] + 1 == FAILING_ROUND:
                    if fails("next"):
                        raise boom
                    if fails("cancellation") and program.cancel_scope is not None:
                        program.cancel_scope.cancel()
                        await anyio.lowlevel.checkpoint()
                return await super().next(state, clients)

        class EvaluationProcess(FakeLearningProcess):
            def __init__(self, name: str) -> None:
                super().__init__()
                self.name = name

            async def next(self, state, clients):
                if fails("evaluation") and self.name == f"evaluation_of_round_{EVALUATED_ROUND}":
                    raise boom
                return await super().next(state, clients)

        evaluation_manager = EvaluationManager(
            data_source=FakeDataSource(4),
            aggregated_metrics_manager=self.evaluations,
            create_state_manager_fn=lambda name: self.state_manager(f"evaluation/{name}"),
            create_process_fn=lambda name: (EvaluationProcess(name), MemoryReleaseManager()),
            cohort_size=2,
            duration=datetime.timedelta(0),
            clock=self.clock,
        )
        self.evaluation_managers.append(evaluation_manager)
        metrics: ReleaseManager = self.metrics
        if fails("metrics release"):
            metrics = Failing(self.metrics, FAILING_ROUND, boom)
        models: ReleaseManager = self.models
        if fails("model release"):
            models = Failing(self.models, final_model_key(ROUNDS), boom)
        async with context, self.state_manager("training") as training:
            state = training
            if fails("save"):
                state = CrashingStateManager(training, FAILING_ROUND, error=boom)
            try:
                return await train_model(
                    train_process=Process(),
                    train_data_source=FakeDataSource(6),
                    train_per_round_clients=2,
                    train_total_rounds=ROUNDS,
                    program_state_manager=state,
                    model_output_manager=models,
                    train_metrics_manager=metrics,
                    evaluation_manager=evaluation_manager,
                    evaluation_periodicity=EVALUATED_ROUND,
                    clock=self.clock,
                    stopping=NeverStops(boom if fails("stopping policy") else None, FAILING_ROUND),
                    seed=5,
                )
            finally:
                self.left_running = context.background.running

    async def assert_unlocked(self) -> None:
        """Every state directory can be opened by a new manager: none is held."""
        if self.kind != "file":
            return
        for lock in sorted(self.root.rglob(".plstate.lock")):
            async with FileProgramStateManager(lock.parent) as manager:
                await manager.get_versions()


_references: dict[str, tuple[TrainingResult, Program]] = {}


async def reference(
    make_context: Callable[[], FederatedContext], tmp_path: Path, name: str
) -> tuple[TrainingResult, Program]:
    """The outcome of an uninterrupted run (computed once per kind of context)."""
    if name not in _references:
        program = Program("memory", tmp_path / "reference")
        _references[name] = (await program.run(make_context()), program)
    return _references[name]


async def check_composition(
    state: str,
    failure: str,
    make_context: Callable[[], FederatedContext],
    tmp_path: Path,
    name: str,
) -> None:
    expected, uninterrupted = await reference(make_context, tmp_path, name)
    program = Program(state, tmp_path / "program")
    boom = Boom(f"injected into {failure}")

    with pytest.raises(Boom) as excinfo:
        await program.run(make_context(), failure, boom)
    assert excinfo.value is boom
    assert program.left_running == 0
    await program.assert_unlocked()

    result = await program.run(make_context())
    assert len(program.evaluation_managers) == 2  # the failed run's manager is still referenced
    assert program.left_running == 0
    await program.assert_unlocked()
    assert result.round_num == expected.round_num == ROUNDS
    np.testing.assert_array_equal(result.state["weights"], expected.state["weights"])
    assert program.metrics.values() == uninterrupted.metrics.values()
    assert sorted(program.evaluations.values()) == [0, EVALUATED_ROUND, ROUNDS]
    assert program.evaluations.values() == uninterrupted.evaluations.values()
    (key, weights), *others = program.models.values().items()
    assert key == final_model_key(ROUNDS) and not others
    np.testing.assert_array_equal(weights, uninterrupted.models.values()[key])


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("state", ["memory", "file"])
async def test_a_failure_fails_train_model_alone_and_a_rerun_resumes_to_the_same_end(
    state: str, failure: str, tmp_path: Path
) -> None:
    await check_composition(state, failure, LocalContext, tmp_path, "local")


@pytest.mark.parametrize("state", ["memory", "file"])
async def test_a_cancelled_run_leaves_nothing_running_and_a_rerun_resumes_to_the_same_end(
    state: str, tmp_path: Path
) -> None:
    expected, uninterrupted = await reference(LocalContext, tmp_path, "local")
    program = Program(state, tmp_path / "program")
    with anyio.CancelScope() as program.cancel_scope:
        await program.run(LocalContext(), "cancellation")
    assert program.cancel_scope.cancelled_caught
    assert program.left_running == 0
    await program.assert_unlocked()
    result = await program.run(LocalContext())
    assert result.resumed_from is not None and result.resumed_from < FAILING_ROUND
    np.testing.assert_array_equal(result.state["weights"], expected.state["weights"])
    assert program.metrics.values() == uninterrupted.metrics.values()
    assert program.evaluations.values() == uninterrupted.evaluations.values()
    assert program.models.values().keys() == uninterrupted.models.values().keys()


# Ray: file state, failures of the process and of a release, under asyncio only
# (starting Ray is what costs; trio is covered above).
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # The workers import this module's functions by value: they cannot import the tests.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("failure", ["next", "metrics release"])
async def test_on_ray_a_failure_fails_train_model_alone_and_a_rerun_resumes_to_the_same_end(
    failure: str, ray_cluster: Any, tmp_path: Path
) -> None:
    from programlogic.contexts.ray import RayContext

    def make_context() -> FederatedContext:
        return RayContext(ray_cluster.address, max_workers=2)

    await check_composition("file", failure, make_context, tmp_path, "ray")
