import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from managers import MemoryProgramStateManager, MemoryReleaseManager, ProgramStateManager
from managers.state.file import FileProgramStateManager
from programlogic import (
    EvaluationManager,
    LearningProcessOutput,
    LocalContext,
    ResumeError,
    evaluate_once,
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

MINUTE = datetime.timedelta(minutes=1)


class Store:
    """The program-state managers of one program, by name, kept across restarts."""

    def __init__(self) -> None:
        self.managers: dict[str, MemoryProgramStateManager] = {}
        self.crashing: CrashingStateManager | None = None
        self.crashing_name = ""

    def crash_at(self, name: str, version: int, *, after_save: bool = False) -> None:
        inner = self.managers.setdefault(name, MemoryProgramStateManager())
        self.crashing = CrashingStateManager(inner, version, after_save=after_save)
        self.crashing_name = name

    def __call__(self, name: str) -> ProgramStateManager:
        inner = self.managers.setdefault(name, MemoryProgramStateManager())
        if self.crashing is not None and name == self.crashing_name:
            if not self.crashing.crashed:
                return self.crashing
        return inner

    async def leftover(self) -> dict[str, list[int]]:
        """Names other than the bookkeeping that still hold versions."""
        found = {}
        for name, manager in self.managers.items():
            versions = await manager.get_versions()
            if versions and name != "evaluation_manager":
                found[name] = versions
        return found


class Program:
    """An evaluation setup whose durable parts survive 'restarts' (new managers)."""

    def __init__(self, clock: FakeClock | None = None, **options: Any) -> None:
        self.clock = clock or FakeClock()
        self.start = self.clock.now()
        self.store = Store()
        self.aggregated = MemoryReleaseManager()
        self.per_round: dict[str, MemoryReleaseManager] = {}
        self.sampled: dict[tuple[str, int], list[str]] = {}
        self.options = options
        self.fail_release: tuple[str, int] | None = None

    def create_process(self, name: str):
        """A fake evaluation process; evaluation round e ends 3e minutes after the start."""
        program = self

        class Recording(FakeLearningProcess):
            async def next(self, state, clients):
                evaluation_round = state["rounds"] + 1
                program.sampled[(name, evaluation_round)] = [c.client_id for c in clients]
                finished_at = program.start + evaluation_round * 3 * MINUTE
                program.clock.set(max(program.clock.now(), finished_at))
                return await super().next(state, clients)

        metrics = self.per_round.setdefault(name, MemoryReleaseManager())
        if self.fail_release and self.fail_release[0] == name:
            failing_key = self.fail_release[1]
            self.fail_release = None
            metrics = FailOnce(metrics, failing_key)
        return Recording(), metrics

    def manager(self, **overrides: Any) -> EvaluationManager:
        options = {
            "data_source": FakeDataSource(8),
            "aggregated_metrics_manager": self.aggregated,
            "create_state_manager_fn": self.store,
            "create_process_fn": self.create_process,
            "cohort_size": 3,
            "duration": 10 * MINUTE,
            "clock": self.clock,
            **self.options,
        }
        options.update(overrides)
        return EvaluationManager(**options)

    def now(self) -> int:
        return int(self.clock.now().timestamp())


class FailOnce(MemoryReleaseManager):
    def __init__(self, inner: MemoryReleaseManager, key: int) -> None:
        super().__init__()
        self.inner, self.key = inner, key

    async def release(self, value: Any, key: int | str) -> None:
        if key == self.key:
            self.key = None
            raise SimulatedCrash(f"crash releasing evaluation round {key}")
        await self.inner.release(value, key)


async def run_to_completion(program: Program, rounds: list[int]) -> None:
    async with LocalContext():
        manager = program.manager()
        await manager.resume_from_previous_state()
        for train_round in rounds:
            await manager.start_evaluation(train_round, program.now(), np.full(2, train_round))
        await manager.wait_for_evaluations_to_finish()


async def test_an_evaluation_runs_until_its_deadline_then_releases_and_cleans_up() -> None:
    program = Program()
    await run_to_completion(program, [5])
    per_round = program.per_round["evaluation_of_round_5"].values()
    assert list(per_round) == [1, 2, 3, 4]  # 3 minutes a round, 10 minute deadline
    assert list(program.aggregated.values()) == [5]
    assert program.aggregated.values()[5] == per_round[4]
    assert await program.store.leftover() == {}


async def test_at_least_one_round_runs_even_past_the_deadline() -> None:
    program = Program(duration=datetime.timedelta(0))
    await run_to_completion(program, [1])
    assert list(program.per_round["evaluation_of_round_1"].values()) == [1]


async def test_the_weights_under_evaluation_are_those_given() -> None:
    program = Program()
    source = FakeDataSource(8)
    async with LocalContext():
        manager = program.manager(data_source=source)
        await manager.start_evaluation(2, program.now(), np.array([7.0, -1.0]))
        await manager.wait_for_evaluations_to_finish()
        sampled = program.sampled[("evaluation_of_round_2", 1)]
        clients = [c for c in source.all_clients() if c.client_id in sampled]
        clients.sort(key=lambda c: sampled.index(c.client_id))
        expected = await evaluate_once(FakeLearningProcess(), np.array([7.0, -1.0]), clients)
    first = program.per_round["evaluation_of_round_2"].values()[1]
    assert first == expected


async def test_starting_a_round_twice_or_after_it_finished_is_a_no_op() -> None:
    program = Program()
    async with LocalContext():
        manager = program.manager()
        await manager.start_evaluation(3, program.now(), np.zeros(2))
        await manager.start_evaluation(3, program.now(), np.ones(2))
        await manager.wait_for_evaluations_to_finish()
        await manager.start_evaluation(3, program.now(), np.ones(2))
        await manager.wait_for_evaluations_to_finish()
    assert manager.finished == [3]
    assert list(program.per_round["evaluation_of_round_3"].values()) == [1, 2, 3, 4]


async def reference_run(rounds: list[int]) -> Program:
    program = Program()
    await run_to_completion(program, rounds)
    return program


CRASH_POINTS = [
    ("evaluation_manager", 0, False),  # the in-flight list is not saved
    ("evaluation_manager", 0, True),  # saved; the initial state is not
    ("evaluation_of_round_4", 0, False),  # the initial state is not saved
    ("evaluation_of_round_4", 0, True),  # saved; the loop has not started
    ("evaluation_of_round_4", 2, False),  # round 2 released, not saved
    ("evaluation_of_round_4", 2, True),  # round 2 saved
    ("evaluation_manager", 1, False),  # released and deleted, not recorded finished
]


@pytest.mark.parametrize(("name", "version", "after_save"), CRASH_POINTS)
async def test_a_crash_at_any_step_then_resume_finishes_every_evaluation_once(
    name: str, version: int, after_save: bool
) -> None:
    reference = await reference_run([4])
    program = Program()
    program.store.crash_at(name, version, after_save=after_save)
    with pytest.raises(SimulatedCrash):
        await run_to_completion(program, [4])
    # The restarted program resumes; train_model would start the round it resumes from again.
    await run_to_completion(program, [4])
    assert program.aggregated.values() == reference.aggregated.values()
    per_round = program.per_round["evaluation_of_round_4"].values()
    assert per_round == reference.per_round["evaluation_of_round_4"].values()
    assert await program.store.leftover() == {}
    async with LocalContext():
        manager = program.manager()
        await manager.resume_from_previous_state()
        assert manager.finished == [4] and manager.in_flight == {}


async def test_a_crash_releasing_a_round_then_resume_repeats_that_round_only() -> None:
    reference = await reference_run([6])
    program = Program()
    program.fail_release = ("evaluation_of_round_6", 3)
    with pytest.raises(SimulatedCrash, match="evaluation round 3"):
        await run_to_completion(program, [6])
    assert list(program.per_round["evaluation_of_round_6"].values()) == [1, 2]
    await run_to_completion(program, [])
    name = "evaluation_of_round_6"
    assert program.per_round[name].values() == reference.per_round[name].values()
    assert program.aggregated.values() == reference.aggregated.values()


async def test_each_finished_evaluation_releases_the_weights_it_evaluated_and_metrics() -> None:
    class Evaluating(FakeLearningProcess):
        """Evaluates without changing the weights, as an evaluation process does."""

        async def next(self, state, clients):
            output = await super().next(state, clients)
            kept = {**output.state, "weights": state["weights"]}
            return LearningProcessOutput(kept, output.metrics)

    models = MemoryReleaseManager()
    program = Program(
        evaluated_model_manager=models,
        create_process_fn=lambda name: (Evaluating(), MemoryReleaseManager()),
        duration=datetime.timedelta(0),
    )
    program.store.crash_at("evaluation_of_round_4", 1, after_save=True)  # evaluated, saved
    with pytest.raises(SimulatedCrash):
        await run_to_completion(program, [2, 4])
    assert 4 not in models.values()  # released on resume, from the saved state
    await run_to_completion(program, [2, 4])
    held = models.values()
    assert sorted(held) == [2, 4]
    for train_round in (2, 4):
        assert held[train_round]["metrics"] == program.aggregated.values()[train_round]
        assert held[train_round]["weights"].tolist() == [train_round, train_round]


async def test_a_resumed_evaluation_samples_what_it_would_have_sampled() -> None:
    reference = await reference_run([2])
    program = Program()
    program.store.crash_at("evaluation_of_round_2", 2, after_save=True)
    with pytest.raises(SimulatedCrash):
        await run_to_completion(program, [2])
    await run_to_completion(program, [])
    assert (
        program.sampled[("evaluation_of_round_2", 1)]
        == reference.sampled[("evaluation_of_round_2", 1)]
    )
    resumed = [program.sampled[k] for k in sorted(program.sampled) if k[1] > 2]
    assert (
        resumed
        == [reference.sampled[k] for k in sorted(reference.sampled) if k[1] > 2][: len(resumed)]
    )


async def test_deadlines_survive_restarts() -> None:
    program = Program()
    program.store.crash_at("evaluation_of_round_1", 1, after_save=True)
    with pytest.raises(SimulatedCrash):
        await run_to_completion(program, [1])
    program.clock.advance(20 * MINUTE)  # the program was down past the deadline
    await run_to_completion(program, [])
    assert list(program.per_round["evaluation_of_round_1"].values()) == [1]
    assert list(program.aggregated.values()) == [1]


async def test_a_failing_evaluation_fails_wait_and_leaves_others_running() -> None:
    program = Program()
    program.store.crash_at("evaluation_of_round_2", 1, after_save=True)
    async with LocalContext():
        manager = program.manager()
        await manager.start_evaluation(1, program.now(), np.zeros(2))
        await manager.start_evaluation(2, program.now(), np.zeros(2))
        with pytest.raises(SimulatedCrash):
            await manager.wait_for_evaluations_to_finish()
    assert 1 in program.aggregated.values() and 2 not in program.aggregated.values()


async def test_several_failing_evaluations_surface_together() -> None:
    program = Program()

    def broken(name: str):
        class Broken(FakeLearningProcess):
            async def next(self, state, clients):
                raise ArithmeticError(name)

        return Broken(), MemoryReleaseManager()

    async with LocalContext():
        manager = program.manager(create_process_fn=broken)
        await manager.start_evaluation(1, program.now(), np.zeros(2))
        await manager.start_evaluation(2, program.now(), np.zeros(2))
        with pytest.raises(ExceptionGroup, match="2 evaluations failed"):
            await manager.wait_for_evaluations_to_finish()


async def test_a_failing_evaluation_fails_train_model() -> None:
    program = Program()
    program.store.crash_at("evaluation_of_round_2", 1)
    async with LocalContext():
        with pytest.raises(SimulatedCrash):
            await train_model(
                train_process=FakeLearningProcess(),
                train_data_source=FakeDataSource(6),
                train_per_round_clients=2,
                train_total_rounds=3,
                program_state_manager=MemoryProgramStateManager(),
                model_output_manager=MemoryReleaseManager(),
                evaluation_manager=program.manager(),
                clock=program.clock,
            )


async def test_leaving_the_context_cancels_loops_and_keeps_their_state() -> None:
    program = Program(duration=datetime.timedelta(days=1))
    in_round_3 = anyio.Event()

    class StuckInRound3(FakeLearningProcess):
        async def next(self, state, clients):
            if state["rounds"] + 1 == 3:
                in_round_3.set()
                await anyio.sleep_forever()
            return await super().next(state, clients)

    async with LocalContext():
        manager = program.manager(
            create_process_fn=lambda name: (StuckInRound3(), MemoryReleaseManager())
        )
        await manager.start_evaluation(1, program.now(), np.zeros(2))
        await in_round_3.wait()  # evaluation rounds 1 and 2 are saved
    versions = await program.store.managers["evaluation_of_round_1"].get_versions()
    assert versions[-1] == 2
    assert program.aggregated.values() == {}


async def test_at_most_max_concurrent_evaluations_run_and_they_run_in_order() -> None:
    running = peak = 0
    order: list[str] = []
    all_started = anyio.Event()

    def counting(name: str):
        class Counting(FakeLearningProcess):
            async def next(self, state, clients):
                nonlocal running, peak
                running += 1
                peak = max(peak, running)
                order.append(name)
                await all_started.wait()
                running -= 1
                return await super().next(state, clients)

        return Counting(), MemoryReleaseManager()

    program = Program(duration=datetime.timedelta(0), max_concurrent=4)
    async with LocalContext():
        manager = program.manager(create_process_fn=counting)
        for train_round in range(100):
            await manager.start_evaluation(train_round, program.now(), np.zeros(2))
        await anyio.wait_all_tasks_blocked()  # as many evaluations run as will be let
        all_started.set()
        await manager.wait_for_evaluations_to_finish()
    assert peak == 4
    assert sorted(program.aggregated.values()) == list(range(100))
    assert order[:4] == [f"evaluation_of_round_{r}" for r in range(4)]


async def test_train_model_forks_evaluations_and_waits_for_them() -> None:
    program = Program()
    async with LocalContext():
        await train_model(
            train_process=FakeLearningProcess(),
            train_data_source=FakeDataSource(6),
            train_per_round_clients=2,
            train_total_rounds=6,
            program_state_manager=MemoryProgramStateManager(),
            model_output_manager=MemoryReleaseManager(),
            evaluation_manager=program.manager(),
            evaluation_periodicity=3,
            clock=program.clock,
        )
    assert sorted(program.aggregated.values()) == [0, 3, 6]
    assert await program.store.leftover() == {}


async def test_evaluate_once_uses_every_client_of_a_test_set() -> None:
    class Counting(FakeLearningProcess):
        async def next(self, state, clients):
            output = await super().next(state, clients)
            return LearningProcessOutput(output.state, {**output.metrics, "clients": len(clients)})

    source = FakeDataSource(7)
    async with LocalContext():
        metrics = await evaluate_once(Counting(), np.zeros(2), source)
        again = await evaluate_once(Counting(), np.zeros(2), source.all_clients())
    assert metrics["clients"] == 7
    assert metrics["client_work"]["train"]["num_examples"] == 35
    assert metrics == again
    with pytest.raises(TypeError, match="all_clients"):
        await evaluate_once(Counting(), np.zeros(2), object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"cohort_size": 0}, ValueError, "cohort_size must be an int >= 1, got 0"),
        ({"cohort_size": 9}, ValueError, "cohort_size=9: cannot select 9 distinct clients"),
        ({"cohort_size": 2.0}, TypeError, "cohort_size must be an int"),
        ({"max_concurrent": 0}, ValueError, "max_concurrent must be an int >= 1 or None, got 0"),
        ({"duration": -MINUTE}, ValueError, "duration must be a timedelta >= 0"),
        ({"data_source": {}}, TypeError, "data_source must be a FederatedDataSource"),
        ({"aggregated_metrics_manager": None}, TypeError, "aggregated_metrics_manager"),
        ({"create_process_fn": 3}, TypeError, "create_process_fn must be callable"),
        ({"seed": -1}, ValueError, "seed must be an int >= 0"),
    ],
)
async def test_bad_arguments_are_rejected(
    overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Program().manager(**overrides)


class Held(FakeLearningProcess):
    """An evaluation process whose rounds wait until ``go`` is set; counts the running ones.

    ``entered`` is set once a round has started waiting.
    """

    running = 0

    def __init__(self, go: anyio.Event, entered: anyio.Event | None = None) -> None:
        super().__init__()
        self.go = go
        self.entered = entered or anyio.Event()

    async def next(self, state, clients):
        Held.running += 1
        self.entered.set()
        try:
            await self.go.wait()
        finally:
            Held.running -= 1
        return await super().next(state, clients)


def file_managers(root: Path) -> Callable[[str], ProgramStateManager]:
    return lambda name: FileProgramStateManager(root / name, keep_total=2)


async def assert_unlocked(root: Path) -> None:
    """Every state directory under ``root`` can be opened by a new manager."""
    for directory in sorted(path for path in root.iterdir() if path.is_dir()):
        async with FileProgramStateManager(directory) as manager:
            await manager.get_versions()


def train(program: Program, manager: EvaluationManager, state: ProgramStateManager, **overrides):
    arguments: dict[str, Any] = {
        "train_process": FakeLearningProcess(),
        "train_data_source": FakeDataSource(6),
        "train_per_round_clients": 2,
        "train_total_rounds": 4,
        "program_state_manager": state,
        "model_output_manager": MemoryReleaseManager(),
        "evaluation_manager": manager,
        "evaluation_periodicity": 2,
        "clock": program.clock,
    }
    arguments.update(overrides)
    return train_model(**arguments)


async def test_a_crashed_program_reruns_in_the_same_process_on_the_same_directories(
    tmp_path: Path,
) -> None:
    reference = Program(duration=datetime.timedelta(0))  # one evaluation round each
    async with LocalContext():
        await train(reference, reference.manager(), MemoryProgramStateManager())

    program = Program(duration=datetime.timedelta(0))
    evaluation_files = file_managers(tmp_path / "evaluation")
    crashed = program.manager(create_state_manager_fn=evaluation_files)
    async with LocalContext(), FileProgramStateManager(tmp_path / "training") as state:
        with pytest.raises(SimulatedCrash):
            await train(program, crashed, CrashingStateManager(state, 3))
    # The crashed manager is still referenced (a notebook's traceback holds it), and no
    # garbage collection ran: a new manager on the same directories must work.
    rerun = program.manager(create_state_manager_fn=evaluation_files)
    async with LocalContext(), FileProgramStateManager(tmp_path / "training") as state:
        await train(program, rerun, state)
    assert program.aggregated.values() == reference.aggregated.values()
    await assert_unlocked(tmp_path / "evaluation")

    # Continuing the finished run, the earlier managers still referenced.
    again = program.manager(create_state_manager_fn=evaluation_files)
    async with LocalContext(), FileProgramStateManager(tmp_path / "training") as state:
        await train(program, again, state, train_total_rounds=6)
    assert crashed is not rerun is not again
    await assert_unlocked(tmp_path / "evaluation")


async def test_an_evaluation_releases_its_state_directory_when_it_fails(tmp_path: Path) -> None:
    class Failing(FakeLearningProcess):
        async def next(self, state, clients):
            raise ArithmeticError("evaluation diverged")

    program = Program()
    manager = program.manager(
        create_state_manager_fn=file_managers(tmp_path),
        create_process_fn=lambda name: (Failing(), MemoryReleaseManager()),
    )
    async with LocalContext():
        await manager.start_evaluation(1, program.now(), np.zeros(2))
        with pytest.raises(ArithmeticError):
            await manager.wait_for_evaluations_to_finish()
        await assert_unlocked(tmp_path)
    async with FileProgramStateManager(tmp_path / "evaluation_of_round_1") as state:
        assert await state.get_versions() == [0]  # kept for a resume


async def test_closing_the_manager_stops_its_evaluations_and_a_new_one_resumes_them(
    tmp_path: Path,
) -> None:
    program = Program()
    go = anyio.Event()
    entered = {name: anyio.Event() for name in ("evaluation_of_round_1", "evaluation_of_round_2")}

    def held(name: str):
        return Held(go, entered[name]), program.per_round.setdefault(name, MemoryReleaseManager())

    async with LocalContext() as context:
        async with program.manager(
            create_state_manager_fn=file_managers(tmp_path), create_process_fn=held
        ) as manager:
            await manager.start_evaluation(1, program.now(), np.zeros(2))
            await manager.start_evaluation(2, program.now(), np.ones(2))
            for event in entered.values():
                await event.wait()
            assert Held.running == 2
        assert Held.running == 0 and context.background.running == 0
        await assert_unlocked(tmp_path)

        go.set()
        async with program.manager(create_state_manager_fn=file_managers(tmp_path)) as resumed:
            await resumed.resume_from_previous_state()
            assert resumed.in_flight == manager.in_flight
            await resumed.wait_for_evaluations_to_finish()
    assert sorted(program.aggregated.values()) == [1, 2]
    await assert_unlocked(tmp_path)


async def test_a_failed_train_model_leaves_no_evaluation_running(tmp_path: Path) -> None:
    program = Program()
    go = anyio.Event()
    manager = program.manager(
        create_state_manager_fn=file_managers(tmp_path / "evaluation"),
        create_process_fn=lambda name: (Held(go), MemoryReleaseManager()),
    )
    async with LocalContext() as context:
        with pytest.raises(SimulatedCrash):
            state = CrashingStateManager(MemoryProgramStateManager(), 3)
            await train(program, manager, state)
        assert Held.running == 0 and context.background.running == 0
        await assert_unlocked(tmp_path / "evaluation")
    assert manager.in_flight == {0: program.now(), 2: program.now()}


async def test_a_refused_resume_resumes_no_evaluation() -> None:
    program = Program()
    program.store.crash_at("evaluation_of_round_0", 1, after_save=True)
    training = MemoryProgramStateManager()
    async with LocalContext():
        with pytest.raises(SimulatedCrash):
            await train(program, program.manager(), training)
    sampled = dict(program.sampled)
    async with LocalContext() as context:
        with pytest.raises(ResumeError, match="seed=0 \\(this run: 1\\)"):
            await train(program, program.manager(), training, seed=1)
        assert context.background.running == 0
    assert program.sampled == sampled
    versions = await program.store.managers["evaluation_of_round_0"].get_versions()
    assert versions[-1] == 1  # still there for a resume with the right configuration
