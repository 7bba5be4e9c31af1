"""managers.writes: a manager's writes in order, prepared writes made in one thread call."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import numpy as np
import pytest

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    MemoryReleaseManager,
    ReleaseManager,
    TensorBoardReleaseManager,
)
from managers.writes import PreparedWrite, WriteBatch, WriteQueue, preparer

pytestmark = pytest.mark.anyio


class Disk:
    """A log of made writes: what each wrote and in which thread."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.threads: set[int] = set()

    def write(self, name: str) -> str:
        self.made.append(name)
        self.threads.add(threading.get_ident())
        return name

    def fail(self, error: Exception) -> None:
        raise error


async def test_a_write_outside_a_batch_is_made_in_a_worker_thread_before_submit_returns() -> None:
    disk = Disk()
    queue = WriteQueue()
    await queue.submit(disk.write, "a")
    assert disk.made == ["a"]
    assert threading.get_ident() not in disk.threads
    assert await queue.run(disk.write, "b") == "b"
    error = OSError("disk full")
    with pytest.raises(OSError) as raised:
        await queue.submit(disk.fail, error)
    assert raised.value is error


async def test_prepared_writes_wait_for_the_flush_which_makes_them_in_order_in_one_thread() -> None:
    disk = Disk()
    first, second = WriteQueue(), WriteQueue()
    batch = WriteBatch()
    batch.add(first.prepare(disk.write, "save 5"))
    batch.add(second.prepare(disk.write, "row 5"))
    batch.add(first.prepare(disk.write, "save 6"))
    assert disk.made == [] and batch.pending == 3
    await batch.flush()
    assert disk.made == ["save 5", "row 5", "save 6"]
    assert len(disk.threads) == 1 and batch.pending == 0


async def test_a_failed_write_in_a_flush_is_raised_and_the_writes_after_it_are_dropped() -> None:
    disk = Disk()
    dropped: list[str] = []
    first = WriteQueue(on_dropped=lambda: dropped.append("first"))
    second = WriteQueue(on_dropped=lambda: dropped.append("second"))
    error = OSError("disk full")
    batch = WriteBatch()
    batch.add(first.prepare(disk.write, "row 1"))
    batch.add(second.prepare(disk.fail, error))
    batch.add(first.prepare(disk.write, "row 2"))
    batch.add(second.prepare(disk.write, "event 2"))
    with pytest.raises(OSError) as raised:
        await batch.flush()
    assert raised.value is error
    assert disk.made == ["row 1"]
    assert sorted(set(dropped)) == ["first", "second"]
    await first.submit(disk.write, "row 3")  # the queue goes on with new writes
    assert disk.made == ["row 1", "row 3"]


async def test_a_call_on_a_queue_first_makes_the_writes_prepared_on_it() -> None:
    disk = Disk()
    queue = WriteQueue()
    batch = WriteBatch()
    batch.add(queue.prepare(disk.write, "prepared"))
    await queue.submit(disk.write, "direct")
    assert disk.made == ["prepared", "direct"]
    await batch.flush()  # made once, not again
    assert disk.made == ["prepared", "direct"]


async def test_a_dropped_batch_is_never_made_and_its_queues_are_told() -> None:
    disk = Disk()
    dropped: list[bool] = []
    queue = WriteQueue(on_dropped=lambda: dropped.append(True))
    batch = WriteBatch()
    write = queue.prepare(disk.write, "row 7")
    batch.add(write)
    batch.drop()
    await queue.submit(disk.write, "row 8")
    await batch.flush()
    assert disk.made == ["row 8"] and dropped == [True]
    assert not write.made


async def test_a_write_cancelled_before_its_thread_started_is_never_made() -> None:
    disk = Disk()
    queue = WriteQueue()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await queue.submit(disk.write, "cancelled")
    batch = WriteBatch()
    batch.add(queue.prepare(disk.write, "cancelled flush"))
    with anyio.CancelScope() as scope:
        scope.cancel()
        await batch.flush()
    await queue.submit(disk.write, "next")
    assert disk.made == ["next"]


async def test_a_batch_takes_only_prepared_writes() -> None:
    with pytest.raises(TypeError, match="write must be a PreparedWrite, got"):
        WriteBatch().add(lambda: None)  # type: ignore[arg-type]


async def test_file_managers_prepare_a_round_made_in_one_flush(tmp_path: Path) -> None:
    """A checkpoint and its metrics to CSV and TensorBoard: nothing on disk until the
    flush, everything after it."""
    pytest.importorskip("tensorboardX")  # the TFF environment's core run lacks it
    state = FileProgramStateManager(tmp_path / "state")
    metrics = GroupingReleaseManager(
        [CSVFileReleaseManager(tmp_path / "m.csv"), TensorBoardReleaseManager(tmp_path / "tb")]
    )
    async with state, metrics:
        batch = WriteBatch()
        batch.add(await state.prepare_save({"w": np.arange(3.0)}, 1))
        batch.add(await metrics.prepare_release({"loss": 0.5}, 1))
        assert not (tmp_path / "state" / "program_state_1.plstate").exists()
        assert not (tmp_path / "m.csv").exists()
        await batch.flush()
        assert await state.get_versions() == [1]
        assert (tmp_path / "m.csv").read_text() == "key,loss\n1,0.5\n"
        assert len(list((tmp_path / "tb").iterdir())) == 1


async def test_save_and_release_of_file_managers_are_made_when_they_return(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorboardX")
    state = FileProgramStateManager(tmp_path / "state")
    metrics = GroupingReleaseManager(
        [CSVFileReleaseManager(tmp_path / "m.csv"), TensorBoardReleaseManager(tmp_path / "tb")]
    )
    async with state, metrics:
        await state.save({"w": np.arange(3.0)}, 1)
        assert (tmp_path / "state" / "program_state_1.plstate").is_file()
        await metrics.release({"loss": 0.5}, 1)
        assert (tmp_path / "m.csv").read_text() == "key,loss\n1,0.5\n"
        assert len(list((tmp_path / "tb").iterdir())) == 1


async def test_a_csv_row_dropped_with_its_batch_is_written_by_the_next_release(
    tmp_path: Path,
) -> None:
    csv = CSVFileReleaseManager(tmp_path / "m.csv")
    async with csv:
        await csv.release({"loss": 1.0}, 1)
        batch = WriteBatch()
        batch.add(await csv.prepare_release({"loss": 0.5}, 2))
        batch.drop()
        assert (tmp_path / "m.csv").read_text() == "key,loss\n1,1.0\n"
        await csv.release({"loss": 0.25}, 3)
    assert (tmp_path / "m.csv").read_text() == "key,loss\n1,1.0\n2,0.5\n3,0.25\n"


async def test_a_csv_release_unchanged_prepares_nothing(tmp_path: Path) -> None:
    async with CSVFileReleaseManager(tmp_path / "m.csv") as csv:
        await csv.release({"loss": 1.0}, 1)
        assert await csv.prepare_release({"loss": 1.0}, 1) is None


async def test_a_tensorboard_leaf_it_cannot_write_fails_the_flush(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    async with TensorBoardReleaseManager(tmp_path / "tb") as board:
        batch = WriteBatch()
        batch.add(await board.prepare_release({"note": object()}, 1))
        with pytest.raises(TypeError, match="note"):
            await batch.flush()


class SavesThenNotifies(FileProgramStateManager):
    """A user's subclass that acts after each save: it must never be batched past."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.seen: list[bool] = []

    async def save(self, state: object, version: int) -> None:
        await super().save(state, version)
        self.seen.append((self.root_dir / f"program_state_{version}.plstate").is_file())


async def test_a_manager_is_prepared_only_where_its_class_prepares_what_it_saves(
    tmp_path: Path,
) -> None:
    files = FileProgramStateManager(tmp_path / "a")
    assert preparer(files, "save") == files.prepare_save
    assert preparer(SavesThenNotifies(tmp_path / "b"), "save") is None
    assert preparer(MemoryReleaseManager(), "release") is None
    patched = CSVFileReleaseManager(tmp_path / "m.csv")
    patched.release = MemoryReleaseManager().release  # type: ignore[method-assign]
    assert preparer(patched, "release") is None
    assert preparer(CSVFileReleaseManager(tmp_path / "n.csv"), "release") is not None

    class Slotted:  # a duck-typed manager whose instances have no __dict__
        __slots__ = ()

        async def release(self, value: object, key: object) -> None:
            pass

    assert preparer(Slotted(), "release") is None  # no instance dict: nothing set there


class Recording(ReleaseManager):
    def __init__(self, name: str, log: list[str], error: Exception | None = None) -> None:
        self.name, self.log, self.error = name, log, error

    async def release(self, value: object, key: object) -> None:
        await anyio.sleep(0)
        self.log.append(self.name)
        if self.error is not None:
            raise self.error


async def test_a_group_releases_its_members_concurrently_each_to_its_end() -> None:
    log: list[str] = []
    error = ValueError("bad sink")
    memory = MemoryReleaseManager()
    group = GroupingReleaseManager(
        [Recording("a", log, error), Recording("b", log), Recording("c", log), memory]
    )
    with pytest.raises(ValueError) as raised:
        await group.release(1.0, 4)
    assert raised.value is error
    assert sorted(log) == ["a", "b", "c"]  # each to its end despite the failure
    assert memory.values() == {4: 1.0}


async def test_a_prepared_group_releases_to_every_manager_at_the_flush_and_raises_each_failure(
    tmp_path: Path,
) -> None:
    log: list[str] = []
    error = ValueError("bad sink")
    csv = CSVFileReleaseManager(tmp_path / "m.csv")
    group = GroupingReleaseManager([Recording("a", log, error), csv, Recording("b", log)])
    async with csv:
        write = await group.prepare_release({"loss": 0.5}, 1)
        assert isinstance(write, PreparedWrite)
        assert log == [] and not (tmp_path / "m.csv").exists()  # nothing before the flush
        batch = WriteBatch()
        batch.add(write)
        with pytest.raises(ValueError) as raised:
            await batch.flush()
        assert raised.value is error
        assert log == ["a", "b"]  # in order, each to its end despite the failure
        assert (tmp_path / "m.csv").read_text() == "key,loss\n1,0.5\n"
