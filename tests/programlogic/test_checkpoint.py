"""The checkpoint ``train_model`` saves is a versioned record: old runs stay loadable.

How ``fixtures/checkpoint_v1`` was made: two runs of ``Run().train(state_manager)``
below, with the code of commit 66698c3 (before the checkpoint became a versioned
record), each on a ``FileProgramStateManager`` of its own directory. ``interrupted``:
through ``CrashingStateManager(manager, 4)``, so versions 0-3 were saved and version 4
never was. ``stopped``: with ``stopping=StopAfterRound(3)``, so round 3 is saved with
the stop reason ``privacy_budget_exhausted``. The ``.plstate.lock`` files were then
deleted. Never regenerate them, and open only copies: they are what an old run left on
disk.
"""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import numpy as np
import pytest

from managers import (
    ManagerError,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    NewerFormatError,
    VersionError,
)
from managers.state.file import FileProgramStateManager
from programlogic import (
    Checkpoint,
    CheckpointFormatError,
    LocalContext,
    ResumeError,
    StopReason,
    TrainingResult,
    final_model_key,
    train_model,
)
from programlogic.testing import FakeClock, FakeDataSource, FakeLearningProcess
from programlogic.training.checkpoint import FORMAT_VERSION, READABLE_VERSIONS
from tests.programlogic.evaluation_helpers import RecordingEvaluations

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoint_v1"
ROUNDS = 6
ROUND_DURATION = datetime.timedelta(minutes=1)


class StopAfterRound:
    """A stopping policy that lets no round after ``last`` start."""

    def __init__(self, last: int) -> None:
        self.last = last

    async def before_round(self, round_num: int) -> StopReason | None:
        return StopReason("privacy_budget_exhausted") if round_num > self.last else None

    async def after_evaluation(self, round_num: int) -> StopReason | None:
        return None


class Run:
    """The releases of one program, and its clock, which starts ``rounds_done`` rounds in."""

    def __init__(self, rounds_done: int = 0) -> None:
        self.clock = FakeClock()
        self.clock.advance(rounds_done * ROUND_DURATION)
        self.metrics = MemoryReleaseManager()
        self.models = MemoryReleaseManager()
        self.evaluations = RecordingEvaluations()

    async def train(self, state_manager, stopping=None) -> TrainingResult:
        async with LocalContext():
            return await train_model(
                train_process=FakeLearningProcess(clock=self.clock, round_duration=ROUND_DURATION),
                train_data_source=FakeDataSource(10),
                train_per_round_clients=3,
                train_total_rounds=ROUNDS,
                program_state_manager=state_manager,
                model_output_manager=self.models,
                train_metrics_manager=self.metrics,
                evaluation_manager=self.evaluations,
                evaluation_periodicity=datetime.timedelta(minutes=2),
                clock=self.clock,
                seed=11,
                stopping=stopping,
            )


def copy_fixture(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


async def test_a_run_interrupted_by_older_code_resumes_to_the_uninterrupted_end(
    tmp_path: Path,
) -> None:
    reference = Run()
    await reference.train(MemoryProgramStateManager())
    resumed = Run(rounds_done=3)
    async with FileProgramStateManager(copy_fixture("interrupted", tmp_path)) as state:
        result = await resumed.train(state)
        assert (await state.get_versions())[-1] == ROUNDS
    assert (result.resumed_from, result.round_num) == (3, ROUNDS)
    assert result.stop_reason is StopReason.COMPLETED
    expected_metrics = {r: m for r, m in reference.metrics.values().items() if r >= 3}
    assert resumed.metrics.values() == expected_metrics
    (weights,) = resumed.models.values().values()
    np.testing.assert_array_equal(weights, reference.models.values()[final_model_key(ROUNDS)])
    expected_evaluations = {r: t for r, t in reference.evaluations.started.items() if r >= 3}
    assert resumed.evaluations.started == expected_evaluations


async def test_a_run_stopped_by_older_code_stays_stopped_for_its_reason(tmp_path: Path) -> None:
    reference = Run()
    await reference.train(MemoryProgramStateManager(), stopping=StopAfterRound(3))
    rerun = Run(rounds_done=3)
    async with FileProgramStateManager(copy_fixture("stopped", tmp_path)) as state:
        result = await rerun.train(state)
    assert result.stop_reason == "privacy_budget_exhausted"
    assert (result.resumed_from, result.round_num) == (3, 3)
    assert list(rerun.metrics.values()) == [3]
    assert rerun.models.values().keys() == {final_model_key(3)}
    np.testing.assert_array_equal(
        rerun.models.values()[final_model_key(3)], reference.models.values()[final_model_key(3)]
    )
    assert rerun.evaluations.started == {3: reference.evaluations.started[3]}


async def test_a_checkpoint_of_older_code_reads_as_the_record(tmp_path: Path) -> None:
    async with FileProgramStateManager(copy_fixture("stopped", tmp_path)) as state:
        saved = await state.load(3)
    checkpoint = Checkpoint.from_saved(saved, 3)
    assert (checkpoint.round_num, checkpoint.per_round_clients) == (3, 3)
    assert checkpoint.stop_reason is StopReason("privacy_budget_exhausted")
    assert checkpoint.evaluation_due and checkpoint.last_evaluation == 1767225780
    assert checkpoint.train_state["rounds"] == 3
    assert checkpoint.format_version == FORMAT_VERSION


async def test_a_checkpoint_round_trips_through_a_state_manager() -> None:
    checkpoint = Checkpoint(
        train_state={"weights": [1.5, 2.5], "rounds": 4},
        round_num=4,
        metrics={"loss": 0.25},
        sampler={"seed": 3, "sampling": "uniform"},
        per_round_clients=2,
        evaluation_due=True,
        last_evaluation=1767225600,
        stop_reason=StopReason.EARLY_STOPPED,
    )
    state = MemoryProgramStateManager()
    await state.save(checkpoint.to_saved(), 4)
    assert Checkpoint.from_saved(await state.load(4), 4) == checkpoint
    assert (await state.load(4))["format_version"] == FORMAT_VERSION


async def test_a_field_added_compatibly_by_newer_code_is_ignored() -> None:
    checkpoint = Checkpoint(
        train_state=1, round_num=2, metrics=None, sampler={}, per_round_clients=1
    )
    with_new_field = {**checkpoint.to_saved(), "run_fingerprint": "4f2a"}
    assert Checkpoint.from_saved(with_new_field, 2) == checkpoint


async def test_a_checkpoint_from_before_stop_reasons_reads_as_early_stopped() -> None:
    saved = Checkpoint(train_state=1, round_num=2, metrics=None, sampler={}, per_round_clients=1)
    legacy = {**saved.to_saved(), "stopped": True}
    del legacy["stop_reason"], legacy["format_version"]
    assert Checkpoint.from_saved(legacy, 2).stop_reason is StopReason.EARLY_STOPPED
    del legacy["stopped"]
    assert Checkpoint.from_saved(legacy, 2).stop_reason is None


async def test_a_checkpoint_of_a_newer_format_is_refused_naming_both_versions(
    tmp_path: Path,
) -> None:
    async with FileProgramStateManager(copy_fixture("interrupted", tmp_path)) as state:
        newer = {**(await state.load(3)), "format_version": 2, "renamed": "round"}
        await state.remove(3)
        await state.save(newer, 3)
        run = Run(rounds_done=3)
        with pytest.raises(
            CheckpointFormatError,
            match=r"^version 3 of the program state manager holds a checkpoint in format "
            r"version 2; this code reads format versions 1; resume it with a newer",
        ) as raised:
            await run.train(state)
        assert (await state.get_versions())[-1] == 3
    assert isinstance(raised.value, ResumeError)
    assert (raised.value.found, raised.value.readable) == (2, READABLE_VERSIONS)
    assert run.metrics.values() == {} and run.evaluations.started == {}
    assert sorted(path.name for path in (tmp_path / "interrupted").glob("program_state_*")) == [
        f"program_state_{version}.plstate" for version in range(4)
    ]  # nothing set aside as damage


async def test_a_version_file_of_a_newer_codec_is_refused_and_left_in_place(
    tmp_path: Path,
) -> None:
    directory = copy_fixture("interrupted", tmp_path)
    newer = bytearray((directory / "program_state_3.plstate").read_bytes())
    newer[8:12] = (2).to_bytes(4, "little")  # the codec's format version in the header
    (directory / "program_state_3.plstate").write_bytes(newer)
    for _ in range(2):  # a rerun is refused alike: nothing was moved
        run = Run(rounds_done=3)
        async with FileProgramStateManager(directory) as state:
            with pytest.raises(NewerFormatError, match="format version 2") as raised:
                await run.train(state)
        assert str(directory / "program_state_3.plstate") in str(raised.value)
        assert run.metrics.values() == {} and run.evaluations.started == {}
    assert sorted(path.name for path in directory.glob("program_state_*")) == [
        f"program_state_{version}.plstate" for version in range(4)
    ]
    assert (directory / "program_state_3.plstate").read_bytes() == newer


async def test_a_version_hard_linked_to_another_is_refused_naming_both_files(
    tmp_path: Path,
) -> None:
    directory = copy_fixture("interrupted", tmp_path)
    (directory / "program_state_4.plstate").hardlink_to(directory / "program_state_1.plstate")
    run = Run(rounds_done=3)
    async with FileProgramStateManager(directory) as state:
        with pytest.raises(ManagerError, match="is hard-linked to version 1") as raised:
            await run.train(state)
        assert await state.get_versions() == [0, 1, 2, 3, 4]
    assert not isinstance(raised.value, VersionError)
    assert str(directory / "program_state_4.plstate") in str(raised.value)
    assert run.metrics.values() == {}
