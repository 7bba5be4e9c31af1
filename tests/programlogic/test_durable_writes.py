"""What a save or release promises holds inside ``train_model``, for every manager, and
which rounds a checkpoint cadence saves does not depend on thread timing."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    ProgramStateManager,
    ReleaseManager,
    TensorBoardReleaseManager,
)
from programlogic import LocalContext, train_model
from programlogic.testing import (
    CrashingStateManager,
    FakeClock,
    FakeContext,
    FakeDataSource,
    FakeLearningProcess,
    SimulatedCrash,
    SlowCall,
)
from tests.programlogic.test_checkpoint_cadence import CrashesOnce

pytestmark = pytest.mark.anyio

ROUNDS = 6


def version_file(root: Path, version: int) -> Path:
    return root / f"program_state_{version}.plstate"


class BackedUp(ProgramStateManager):
    """A user's wrapper: after each save it copies the version's file, as a backup would."""

    def __init__(self, inner: FileProgramStateManager, backup: Path) -> None:
        self.inner = inner
        self.backup = backup
        backup.mkdir()

    async def save(self, state: Any, version: int) -> None:
        await self.inner.save(state, version)
        source = version_file(self.inner.root_dir, version)
        (self.backup / source.name).write_bytes(source.read_bytes())  # raises when missing

    async def load(self, version: int, structure: Any = None) -> Any:
        return await self.inner.load(version, structure)

    async def get_versions(self) -> list[int]:
        return await self.inner.get_versions()

    async def remove(self, version: int) -> None:
        await self.inner.remove(version)

    async def aclose(self) -> None:
        await self.inner.aclose()


class NotifiesAfterSave(FileProgramStateManager):
    """A user's subclass that acts after each save (and does not prepare its writes)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, keep_total=None)
        self.on_disk: dict[int, bool] = {}

    async def save(self, state: Any, version: int) -> None:
        await super().save(state, version)
        self.on_disk[version] = version_file(self.root_dir, version).is_file()


class ReadsBack(ReleaseManager):
    """A user's wrapper around a CSV sink: after each release it reads the file back."""

    def __init__(self, inner: CSVFileReleaseManager) -> None:
        self.inner = inner
        self.keys_seen: list[list[str]] = []

    async def release(self, value: Any, key: Any) -> None:
        await self.inner.release(value, key)
        rows = self.inner.file_path.read_text().splitlines()[1:]
        self.keys_seen.append([row.split(",")[0] for row in rows])

    async def aclose(self) -> None:
        await self.inner.aclose()


async def train(state: ProgramStateManager, metrics: ReleaseManager | None = None, **more: Any):
    async with LocalContext():
        return await train_model(
            train_process=FakeLearningProcess(),
            train_data_source=FakeDataSource(10),
            train_per_round_clients=3,
            train_total_rounds=ROUNDS,
            program_state_manager=state,
            model_output_manager=MemoryReleaseManager(),
            train_metrics_manager=metrics,
            **more,
        )


async def test_a_crash_right_after_a_file_save_leaves_that_version_on_disk(tmp_path: Path) -> None:
    files = FileProgramStateManager(tmp_path / "state", keep_total=None)
    async with CrashingStateManager(files, 3, after_save=True) as crashing:
        with pytest.raises(SimulatedCrash):
            await train(crashing)
    async with FileProgramStateManager(tmp_path / "state") as reopened:
        assert await reopened.get_versions() == [0, 1, 2, 3]
    async with FileProgramStateManager(tmp_path / "state", keep_total=None) as state:
        result = await train(state)
    assert result.resumed_from == 3


async def test_a_wrapper_that_acts_after_a_save_finds_the_version_on_disk(tmp_path: Path) -> None:
    state = BackedUp(FileProgramStateManager(tmp_path / "state"), tmp_path / "backup")
    async with state:
        await train(state, checkpoint_every=2)
    names = sorted(path.name for path in (tmp_path / "backup").iterdir())
    assert names == sorted(version_file(tmp_path, v).name for v in (0, 2, 4, 6))


async def test_a_subclass_that_overrides_save_is_awaited_through_it(tmp_path: Path) -> None:
    state = NotifiesAfterSave(tmp_path / "state")
    async with state, CSVFileReleaseManager(tmp_path / "metrics.csv") as metrics:
        await train(state, metrics)
    assert state.on_disk == {version: True for version in range(ROUNDS + 1)}


async def test_a_release_wrapped_or_grouped_is_written_when_it_returns(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")  # the TFF environment's core run lacks it
    wrapped = ReadsBack(CSVFileReleaseManager(tmp_path / "metrics.csv"))
    grouped = GroupingReleaseManager([wrapped, TensorBoardReleaseManager(tmp_path / "tb")])
    async with FileProgramStateManager(tmp_path / "state") as state, grouped:
        await train(state, grouped, checkpoint_every=4)
    assert wrapped.keys_seen == [[str(key) for key in range(1, n + 1)] for n in range(1, 7)]


async def test_batched_file_managers_have_every_round_on_disk_as_it_is_counted(
    tmp_path: Path,
) -> None:
    """With file state and a CSV sink batched together, the round a stopping policy sees
    persisted has its version and its row on disk."""
    seen: list[tuple[int, bool, list[str]]] = []
    state_root = tmp_path / "state"

    class Watching(FakeLearningProcess):
        async def next(self, state: Any, clients: Any) -> Any:
            done = state["rounds"] - 1  # the round before the last one handed over
            if done >= 1:
                csv_path = tmp_path / "metrics.csv"
                rows = csv_path.read_text().splitlines()[1:] if csv_path.exists() else []
                seen.append((done, version_file(state_root, done).is_file(), rows))
            return await super().next(state, clients)

    metrics = CSVFileReleaseManager(tmp_path / "metrics.csv")
    async with FileProgramStateManager(state_root, keep_total=None) as state, metrics:
        await train(state, metrics)
    # Round r - 1 was handed over before round r + 1 started, and at most one round is
    # in flight at the persister: by then its save and its row are written.
    for done, saved, rows in seen:
        assert saved, f"round {done} not on disk"
        assert [row.split(",")[0] for row in rows][: done - 1] == [
            str(key) for key in range(1, done)
        ]


SAVED_ROUNDS = [0, 3, 6, 8]
"""Rounds of 10 minutes on a fake clock, a checkpoint at least every 25 minutes."""


async def train_slowly(state: ProgramStateManager, clock: FakeClock, process: Any = None) -> Any:
    """8 rounds of 10 minutes on ``clock``, a checkpoint at least every 25 minutes."""
    async with FakeContext([SlowCall(datetime.timedelta(minutes=10))], clock=clock):
        return await train_model(
            train_process=process or FakeLearningProcess(),
            train_data_source=FakeDataSource(10),
            train_per_round_clients=3,
            train_total_rounds=8,
            program_state_manager=state,
            model_output_manager=MemoryReleaseManager(),
            clock=clock,
            checkpoint_interval=datetime.timedelta(minutes=25),
        )


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_an_interval_saves_the_same_rounds_every_run(kind: str, tmp_path: Path) -> None:
    for run in range(50):
        if kind == "memory":
            state: ProgramStateManager = MemoryProgramStateManager(keep_total=None)
        else:
            state = FileProgramStateManager(tmp_path / str(run), keep_total=None)
        async with state:
            await train_slowly(state, FakeClock())
            assert await state.get_versions() == SAVED_ROUNDS, f"run {run}"


async def test_a_resumed_interval_counts_from_the_last_save_s_time(tmp_path: Path) -> None:
    """Saved at minutes 0 and 30, crashed at 40 in round 5: the rerun trains rounds 4 and 5
    again (ending at 50 and 60) and saves round 5, the first 25 minutes after the save of
    round 3, not round 6, 25 minutes after the resume."""
    clock = FakeClock()
    async with FileProgramStateManager(tmp_path / "state", keep_total=None) as state:
        with pytest.raises(SimulatedCrash):
            await train_slowly(state, clock, CrashesOnce(5))
        assert await state.get_versions() == [0, 3]
        result = await train_slowly(state, clock)
        assert result.resumed_from == 3
        assert await state.get_versions() == [0, 3, 5, 8]
