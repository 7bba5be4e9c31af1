from __future__ import annotations

import datetime
import re
import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from managers import (
    AllVersionsDamagedError,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    ReleaseManager,
)
from managers.state.file import FileProgramStateManager
from managers.testing import FakeValueReference
from programlogic import (
    InMemoryDataSource,
    LearningProcessOutput,
    LocalContext,
    NoFederatedContextError,
    ResumeError,
    StopReason,
    final_model_key,
    train_model,
)
from programlogic.testing import (
    CrashingStateManager,
    FakeClock,
    FakeDataSource,
    FakeLearningProcess,
    SimulatedCrash,
)

pytestmark = pytest.mark.anyio

ROUNDS = 6


class RecordingEvaluationManager:
    """Records which rounds were started (once each), like an idempotent evaluation manager."""

    def __init__(self, fail_with: Exception | None = None) -> None:
        self.started: dict[int, tuple[int, Any]] = {}
        self.resumed = 0
        self.waited = 0
        self.fail_with = fail_with

    async def resume_from_previous_state(self) -> None:
        self.resumed += 1

    async def start_evaluation(
        self, train_round: int, start_timestamp: int, model_weights: Any
    ) -> None:
        self.started.setdefault(train_round, (start_timestamp, np.array(model_weights)))

    async def wait_for_evaluations_to_finish(self) -> None:
        self.waited += 1
        if self.fail_with is not None:
            raise self.fail_with


class FailingReleaseManager(ReleaseManager):
    def __init__(self, error: Exception, on_key: int | str) -> None:
        self.error, self.on_key = error, on_key

    async def release(self, value: Any, key: int | str) -> None:
        if key == self.on_key:
            raise self.error


class Run:
    """The managers of one program, kept across restarts."""

    def __init__(self) -> None:
        self.state = MemoryProgramStateManager()
        self.metrics = MemoryReleaseManager()
        self.models = MemoryReleaseManager()

    async def train(self, state_manager=None, **overrides: Any):
        arguments: dict[str, Any] = {
            "train_process": FakeLearningProcess(),
            "train_data_source": FakeDataSource(10),
            "train_per_round_clients": 3,
            "train_total_rounds": ROUNDS,
            "program_state_manager": state_manager or self.state,
            "model_output_manager": self.models,
            "train_metrics_manager": self.metrics,
            "seed": 11,
        }
        arguments.update(overrides)
        async with LocalContext():
            return await train_model(**arguments)


async def uninterrupted() -> Run:
    run = Run()
    await run.train()
    return run


def assert_same_outcome(run: Run, reference: Run) -> None:
    assert list(run.metrics.values()) == list(reference.metrics.values())
    assert run.metrics.values() == reference.metrics.values()
    ((key, weights),) = run.models.values().items()
    ((reference_key, reference_weights),) = reference.models.values().items()
    assert key == reference_key == final_model_key(ROUNDS)
    np.testing.assert_array_equal(weights, reference_weights)


async def test_a_run_saves_every_round_and_releases_metrics_and_the_final_model() -> None:
    run = Run()
    result = await run.train()
    assert await run.state.get_versions() == list(range(ROUNDS + 1))
    assert list(run.metrics.values()) == list(range(1, ROUNDS + 1))
    for metrics in run.metrics.values().values():
        assert metrics["client_work"]["train"]["num_examples"] == 15
    assert list(run.models.values()) == ["final_training_checkpoint_round_6"]
    assert result.round_num == ROUNDS
    assert result.stop_reason is StopReason.COMPLETED
    assert result.resumed_from is None
    assert result.state["rounds"] == ROUNDS
    saved, version = await run.state.load_latest()
    assert version == ROUNDS and saved["round"] == ROUNDS
    np.testing.assert_array_equal(saved["train_state"]["weights"], result.state["weights"])
    assert saved["metrics"] == run.metrics.values()[ROUNDS]


async def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    first, second, other = Run(), Run(), Run()
    await first.train()
    await second.train()
    await other.train(seed=12)
    assert_same_outcome(second, first)
    assert other.metrics.values() != first.metrics.values()


@pytest.mark.parametrize("crash_round", [0, 3, ROUNDS])
@pytest.mark.parametrize("after_save", [False, True], ids=["before-save", "after-save"])
async def test_a_crash_at_any_save_then_resume_equals_an_uninterrupted_run(
    crash_round: int, after_save: bool
) -> None:
    reference = await uninterrupted()
    run = Run()
    crashing = CrashingStateManager(run.state, crash_round, after_save=after_save)
    with pytest.raises(SimulatedCrash):
        await run.train(state_manager=crashing)
    assert crashing.crashed
    assert final_model_key(ROUNDS) not in run.models.values()
    result = await run.train()
    expected_resume = crash_round if after_save else crash_round - 1
    assert result.resumed_from == (None if expected_resume < 0 else expected_resume)
    assert_same_outcome(run, reference)
    assert await run.state.get_versions() == list(range(ROUNDS + 1))


async def test_a_crash_after_the_last_save_still_releases_the_final_model_on_rerun() -> None:
    reference = await uninterrupted()
    run = Run()
    with pytest.raises(SimulatedCrash):
        await run.train(state_manager=CrashingStateManager(run.state, ROUNDS, after_save=True))
    result = await run.train()
    assert result.stop_reason is StopReason.ALREADY_COMPLETED
    assert result.resumed_from == ROUNDS
    assert_same_outcome(run, reference)


async def test_a_failing_release_fails_train_model_with_that_exception() -> None:
    error = OSError("metrics sink is down")
    with pytest.raises(OSError) as caught:
        await Run().train(train_metrics_manager=FailingReleaseManager(error, on_key=2))
    assert caught.value is error


async def test_a_failing_final_model_release_fails_train_model() -> None:
    error = PermissionError("model store is read-only")
    with pytest.raises(PermissionError) as caught:
        await Run().train(
            model_output_manager=FailingReleaseManager(error, final_model_key(ROUNDS))
        )
    assert caught.value is error


async def test_a_failing_save_fails_train_model_with_that_exception_and_stops_training() -> None:
    run = Run()
    error = OSError(28, "No space left on device")
    with pytest.raises(OSError) as caught:
        await run.train(state_manager=CrashingStateManager(run.state, 2, error=error))
    assert caught.value is error
    assert await run.state.get_versions() == [0, 1]
    assert max(run.metrics.values()) <= 3


async def test_an_exception_from_the_process_propagates_unchanged() -> None:
    error = ArithmeticError("diverged")

    class Diverging(FakeLearningProcess):
        async def next(self, state, clients):
            if state["rounds"] == 2:
                raise error
            return await super().next(state, clients)

    run = Run()
    with pytest.raises(ArithmeticError) as caught:
        await run.train(train_process=Diverging())
    assert caught.value is error
    assert await run.state.get_versions() == [0, 1, 2]


async def test_a_larger_total_continues_training() -> None:
    reference = await uninterrupted()
    run = Run()
    first = await run.train(train_total_rounds=3)
    assert first.round_num == 3
    run.models = MemoryReleaseManager()
    second = await run.train()
    assert second.resumed_from == 3 and second.stop_reason is StopReason.COMPLETED
    assert_same_outcome(run, reference)


async def test_rerunning_a_finished_run_trains_nothing_and_releases_the_final_model() -> None:
    run = await uninterrupted()
    versions = await run.state.get_versions()
    run.models = MemoryReleaseManager()
    result = await run.train()
    assert result.stop_reason is StopReason.ALREADY_COMPLETED
    assert await run.state.get_versions() == versions
    assert list(run.models.values()) == [final_model_key(ROUNDS)]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"seed": 12}, "seed=11 (this run: 12)"),
        ({"train_per_round_clients": 4}, "train_per_round_clients=3 (this run: 4)"),
        ({"train_data_source": FakeDataSource(11)}, "number of clients=10 (this run: 11)"),
        (
            {
                "train_data_source": InMemoryDataSource(
                    {f"other_{i}": np.ones((2, 2)) for i in range(10)}
                )
            },
            "another set of client ids",
        ),
        ({"train_data_source": FakeDataSource(10, sampling="fixed")}, "sampling='uniform'"),
        ({"train_total_rounds": 2}, "beyond train_total_rounds=2"),
    ],
)
async def test_resuming_with_another_configuration_names_what_differs(
    overrides: dict[str, Any], named: str
) -> None:
    run = Run()
    await run.train(train_total_rounds=3)
    with pytest.raises(ResumeError, match=named.replace("(", r"\(").replace(")", r"\)")):
        await run.train(**overrides)


async def test_state_not_written_by_train_model_is_refused() -> None:
    state = MemoryProgramStateManager()
    await state.save({"something": "else"}, 4)
    with pytest.raises(ResumeError, match="not written by train_model"):
        await Run().train(state_manager=state)


async def test_train_model_outside_a_context_is_a_clear_error() -> None:
    with pytest.raises(NoFederatedContextError, match="async with LocalContext"):
        await train_model(
            train_process=FakeLearningProcess(),
            train_data_source=FakeDataSource(),
            train_per_round_clients=2,
            train_total_rounds=2,
            program_state_manager=MemoryProgramStateManager(),
            model_output_manager=MemoryReleaseManager(),
        )


BAD_ARGUMENTS = [
    ({"train_process": object()}, TypeError, "train_process must be a LearningProcess"),
    ({"train_data_source": {"a": 1}}, TypeError, "train_data_source must be a FederatedDataSource"),
    ({"train_per_round_clients": 2.5}, TypeError, "train_per_round_clients must be an int"),
    ({"train_per_round_clients": True}, TypeError, "train_per_round_clients must be an int"),
    (
        {"train_per_round_clients": 0},
        ValueError,
        "train_per_round_clients must be an int >= 1, got 0",
    ),
    ({"train_per_round_clients": 11}, ValueError, "train_per_round_clients=11: cannot select 11"),
    ({"train_total_rounds": 0}, ValueError, "train_total_rounds must be an int >= 1, got 0"),
    ({"train_total_rounds": "5"}, TypeError, "train_total_rounds must be an int"),
    ({"seed": -1}, ValueError, "seed must be an int >= 0, got -1"),
    ({"program_state_manager": MemoryReleaseManager()}, TypeError, "program_state_manager must be"),
    ({"model_output_manager": None}, TypeError, "model_output_manager must be a ReleaseManager"),
    (
        {"train_metrics_manager": object()},
        TypeError,
        "train_metrics_manager must be a ReleaseManager",
    ),
    (
        {"evaluation_manager": object()},
        TypeError,
        "evaluation_manager must be an EvaluationManager",
    ),
    (
        {"evaluation_periodicity": 0},
        ValueError,
        "evaluation_periodicity must be an int >= 1, got 0",
    ),
    ({"evaluation_periodicity": -3}, ValueError, "evaluation_periodicity must be an int >= 1"),
    (
        {"evaluation_periodicity": datetime.timedelta(0)},
        ValueError,
        "evaluation_periodicity must be a timedelta > 0, got datetime.timedelta",
    ),
    (
        {"evaluation_periodicity": datetime.timedelta(seconds=-1)},
        ValueError,
        "must be a timedelta > 0",
    ),
    ({"evaluation_periodicity": 1.5}, TypeError, "evaluation_periodicity must be an int"),
    ({"clock": object()}, TypeError, "clock must be a Clock"),
]


@pytest.mark.parametrize("with_evaluation", [False, True])
@pytest.mark.parametrize(("overrides", "error", "message"), BAD_ARGUMENTS)
async def test_bad_arguments_are_rejected_before_anything_starts(
    overrides: dict[str, Any], error: type[Exception], message: str, with_evaluation: bool
) -> None:
    state = MemoryProgramStateManager()
    arguments: dict[str, Any] = {
        "train_process": FakeLearningProcess(),
        "train_data_source": FakeDataSource(10),
        "train_per_round_clients": 3,
        "train_total_rounds": 3,
        "program_state_manager": state,
        "model_output_manager": MemoryReleaseManager(),
    }
    if with_evaluation:
        arguments["evaluation_manager"] = RecordingEvaluationManager()
    arguments.update(overrides)
    with pytest.raises(error, match=message):
        await train_model(**arguments)  # outside a context: validation comes first
    assert await state.get_versions() == []


async def test_evaluations_start_every_n_rounds_and_on_the_last_round() -> None:
    evaluations = RecordingEvaluationManager()
    await Run().train(
        evaluation_manager=evaluations, evaluation_periodicity=4, train_total_rounds=9
    )
    assert sorted(evaluations.started) == [0, 4, 8, 9]
    assert evaluations.resumed == 1 and evaluations.waited == 1


async def test_evaluated_weights_are_those_of_the_round() -> None:
    evaluations, run = RecordingEvaluationManager(), Run()
    result = await run.train(evaluation_manager=evaluations)
    np.testing.assert_array_equal(evaluations.started[ROUNDS][1], result.state["weights"])
    np.testing.assert_array_equal(evaluations.started[0][1], np.zeros(2))


async def test_a_timedelta_periodicity_follows_the_clock() -> None:
    clock = FakeClock()
    evaluations = RecordingEvaluationManager()
    process = FakeLearningProcess(clock=clock, round_duration=datetime.timedelta(minutes=2))
    await Run().train(
        train_process=process,
        evaluation_manager=evaluations,
        evaluation_periodicity=datetime.timedelta(minutes=5),
        train_total_rounds=10,
        clock=clock,
    )
    start = int(datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp())
    assert sorted(evaluations.started) == [0, 3, 6, 9, 10]
    assert evaluations.started[3][0] == start + 6 * 60


async def test_a_resumed_run_keeps_the_evaluation_clock() -> None:
    clock = FakeClock()
    process = FakeLearningProcess(clock=clock, round_duration=datetime.timedelta(minutes=2))
    evaluations = RecordingEvaluationManager()
    run = Run()
    common = {
        "train_process": process,
        "evaluation_manager": evaluations,
        "evaluation_periodicity": datetime.timedelta(minutes=5),
        "train_total_rounds": 10,
        "clock": clock,
    }
    with pytest.raises(SimulatedCrash):
        await run.train(state_manager=CrashingStateManager(run.state, 3, after_save=True), **common)
    assert 3 not in evaluations.started
    await run.train(**common)
    assert sorted(evaluations.started) == [0, 3, 6, 9, 10]


async def test_a_failed_evaluation_fails_train_model() -> None:
    error = RuntimeError("evaluation of round 4 failed")
    with pytest.raises(RuntimeError) as caught:
        await Run().train(evaluation_manager=RecordingEvaluationManager(fail_with=error))
    assert caught.value is error


async def test_a_synchronous_process_runs_off_the_event_loop() -> None:
    loop_thread = threading.current_thread()
    threads: set[threading.Thread] = set()

    class Sync:
        def initialize(self) -> dict[str, Any]:
            return {"total": 0}

        def next(self, state, clients):
            threads.add(threading.current_thread())
            total = state["total"] + sum(int(c.load()[0, 0]) for c in clients)
            return LearningProcessOutput(
                {"total": total}, {"client_work": {"train": {"total": total}}}
            )

        def get_model_weights(self, state):
            return state["total"]

        def set_model_weights(self, state, weights):
            return {"total": weights}

    run = Run()
    result = await run.train(train_process=Sync())
    assert loop_thread not in threads
    assert run.models.values()[final_model_key(ROUNDS)] == result.state["total"]


async def test_next_must_return_a_learning_process_output() -> None:
    class Wrong(FakeLearningProcess):
        async def next(self, state, clients):
            return state

    with pytest.raises(TypeError, match="must return a LearningProcessOutput"):
        await Run().train(train_process=Wrong())


async def test_value_references_in_metrics_are_materialized_before_saving() -> None:
    class Referencing(FakeLearningProcess):
        async def next(self, state, clients):
            output = await super().next(state, clients)
            loss = FakeValueReference(state["rounds"] + 0.5)
            return LearningProcessOutput(output.state, {"loss": loss})

    run = Run()
    await run.train(train_process=Referencing())
    assert run.metrics.values()[2] == {"loss": 1.5}
    saved, _ = await run.state.load_latest()
    assert saved["metrics"] == {"loss": ROUNDS - 0.5}


class SignallingProcess(FakeLearningProcess):
    """Sets ``computed(r)`` once round r's ``next`` has returned."""

    def __init__(self) -> None:
        super().__init__()
        self._computed: dict[int, anyio.Event] = {}

    def computed(self, round_num: int) -> anyio.Event:
        return self._computed.setdefault(round_num, anyio.Event())

    async def next(self, state, clients):
        output = await super().next(state, clients)
        self.computed(state["rounds"] + 1).set()
        return output


class SlowStateManager(MemoryProgramStateManager):
    """Holds each save while training goes as far as it can meanwhile: until nothing else
    can run and, given the process and the last round, until the next round is computed."""

    def __init__(
        self, log: list[str], process: SignallingProcess | None = None, last_round: int = 0
    ) -> None:
        super().__init__()
        self.log = log
        self.process, self.last_round = process, last_round
        self.in_flight = self.peak = 0

    async def save(self, state: Any, version: int) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.process is not None and 0 < version < self.last_round:
            await self.process.computed(version + 1).wait()
        await anyio.wait_all_tasks_blocked()
        await super().save(state, version)
        self.log.append(f"saved {version}")
        self.in_flight -= 1


class LoggingReleaseManager(MemoryReleaseManager):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def release(self, value: Any, key: int | str) -> None:
        self.log.append(f"released {key}")
        await super().release(value, key)


async def test_at_most_one_save_is_in_flight_and_releases_follow_their_save() -> None:
    log: list[str] = []
    process = SignallingProcess()
    state = SlowStateManager(log, process, last_round=8)
    await Run().train(
        train_process=process,
        state_manager=state,
        train_metrics_manager=LoggingReleaseManager(log),
        train_total_rounds=8,
    )
    assert state.peak == 1
    for round_num in range(1, 9):
        assert log.index(f"saved {round_num}") < log.index(f"released {round_num}")
    assert log.index("saved 0") < log.index("saved 1")


async def test_a_cancelled_run_leaves_a_loadable_checkpoint_and_resumes_to_the_same_result() -> (
    None
):
    reference = await uninterrupted()
    scope = anyio.CancelScope()

    class CancelledInRound4(FakeLearningProcess):
        async def next(self, state, clients):
            if state["rounds"] + 1 == 4:
                scope.cancel()
                await anyio.sleep_forever()
            return await super().next(state, clients)

    run = Run()
    run.state = SlowStateManager([])
    with scope:
        await run.train(train_process=CancelledInRound4())
    assert scope.cancelled_caught
    saved, version = await run.state.load_latest()
    assert 2 <= version <= 3 and saved["round"] == version  # round 3's save may be cut short
    result = await run.train()
    assert result.resumed_from == version
    assert_same_outcome(run, reference)


async def test_two_programs_run_concurrently_in_one_event_loop() -> None:
    reference = await uninterrupted()
    runs = [Run(), Run()]
    async with anyio.create_task_group() as group:
        for run in runs:
            group.start_soon(run.train)
    for run in runs:
        assert_same_outcome(run, reference)


@pytest.mark.parametrize("failure", ["metrics release", "crash after a save"])
async def test_with_state_on_disk_a_failure_fails_train_model_with_that_exception_alone(
    tmp_path: Path, failure: str
) -> None:
    # The round loop used to get a BrokenResourceError handing the next round to the
    # persister that had just failed; the caller saw both in an ExceptionGroup.
    error = OSError("sink is down")
    async with FileProgramStateManager(tmp_path / "state") as state:
        if failure == "metrics release":
            overrides: dict[str, Any] = {
                "train_metrics_manager": FailingReleaseManager(error, on_key=2)
            }
        else:
            overrides = {
                "state_manager": CrashingStateManager(state, 2, after_save=True, error=error)
            }
        with pytest.raises(OSError) as caught:
            await Run().train(**{"state_manager": state, **overrides})
    assert caught.value is error


async def test_with_every_checkpoint_on_disk_damaged_train_model_fails_naming_them(
    tmp_path: Path,
) -> None:
    root = tmp_path / "state"
    async with FileProgramStateManager(root, keep_total=2, keep_first=False) as state:
        await Run().train(state_manager=state, train_total_rounds=3)
    damaged = sorted(root.glob("program_state_*.plstate"))
    assert [path.name for path in damaged] == ["program_state_2.plstate", "program_state_3.plstate"]
    for path in damaged:
        path.write_bytes(b"damaged")
    run = Run()
    for _ in range(2):  # rerun: fails again, never starts over from round 0
        async with FileProgramStateManager(root) as state:
            with pytest.raises(AllVersionsDamagedError) as caught:
                await run.train(state_manager=state)
        assert caught.value.versions == [2, 3]
        assert all(str(path) in str(caught.value) for path in damaged)
    assert run.metrics.values() == {} and run.models.values() == {}
    async with FileProgramStateManager(root, on_all_damaged="start_fresh") as state:
        result = await run.train(state_manager=state)
        assert result.resumed_from is None and result.round_num == ROUNDS
        assert (await state.get_versions())[-1] == ROUNDS
    assert_same_outcome(run, await uninterrupted())


async def test_an_exception_group_the_process_raises_itself_reaches_the_caller_whole() -> None:
    error = ExceptionGroup("two clients diverged", [ArithmeticError("client 1")])

    class Diverging(FakeLearningProcess):
        async def next(self, state, clients):
            if state["rounds"] == 2:
                raise error
            return await super().next(state, clients)

    with pytest.raises(ExceptionGroup) as caught:
        await Run().train(train_process=Diverging())
    assert caught.value is error


class DescribedSource:
    """A data source of its own whose sampler describes itself in its own way."""

    def __init__(self, description: Any) -> None:
        self.inner = FakeDataSource(10)
        self.description = description

    @property
    def client_ids(self) -> list[str]:
        return self.inner.client_ids

    def iterator(self, seed: int) -> DescribedSource.Sampler:
        return DescribedSource.Sampler(self.inner.iterator(seed), self.description)

    class Sampler:
        def __init__(self, inner: Any, description: Any) -> None:
            self.inner, self.description = inner, description

        def select(self, k: int, round_num: int) -> list[Any]:
            return self.inner.select(k, round_num)

        def describe(self) -> Any:
            return self.description


@pytest.mark.parametrize(
    "description",
    [{"dataset": "shards", "version": 2}, "shards-v2", ["shards", 2]],
    ids=["dict", "str", "list"],
)
async def test_a_data_source_describing_itself_its_own_way_resumes(description: Any) -> None:
    reference = Run()
    await reference.train(train_data_source=DescribedSource(description))
    run = Run()
    with pytest.raises(SimulatedCrash):
        await run.train(
            state_manager=CrashingStateManager(run.state, 3),
            train_data_source=DescribedSource(description),
        )
    result = await run.train(train_data_source=DescribedSource(description))
    assert result.resumed_from == 2
    assert_same_outcome(run, reference)


@pytest.mark.parametrize(
    ("saved", "current", "named"),
    [
        (
            {"dataset": "shards", "version": 2, "split": "train"},
            {"dataset": "shards", "version": 3, "split": "test"},
            "version=2 (this run: 3), split='train' (this run: 'test')",
        ),
        (
            {"dataset": "shards"},
            {"dataset": "shards", "version": 3},
            "version=nothing (this run: 3)",
        ),
        ("shards-v2", "shards-v3", "the sampler description 'shards-v2' (this run: 'shards-v3')"),
    ],
)
async def test_resuming_with_another_description_names_the_keys_that_differ(
    saved: Any, current: Any, named: str
) -> None:
    run = Run()
    await run.train(train_total_rounds=3, train_data_source=DescribedSource(saved))
    with pytest.raises(ResumeError, match=re.escape(named)):
        await run.train(train_data_source=DescribedSource(current))
