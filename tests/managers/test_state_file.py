"""FileProgramStateManager beyond the shared contract: files, locking, retention, damage,
full disks, cancellation and processes killed while they save."""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import numpy as np
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

import managers.state.file as file_module
from managers import StateDirectoryLockedError
from managers.exceptions import AllVersionsDamagedError, ManagerError, VersionNotFoundError
from managers.serialization import SerializationError
from managers.state.file import FileProgramStateManager

pytestmark = pytest.mark.anyio

LOCK_NAME = ".plstate.lock"
SAVER_PATH = Path(__file__).with_name("_state_saver.py")
REPOSITORY = Path(__file__).parents[2]


def _import_saver() -> Any:
    spec = importlib.util.spec_from_file_location("_state_saver", SAVER_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


saver = _import_saver()


def state_of(version: int, size: int = 1000) -> dict:
    rng = np.random.default_rng(version)
    return {"weights": rng.random(size, dtype=np.float32), "round": version}


def assert_state_equal(actual: Any, expected: Any) -> None:
    assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_state_equal(actual[key], expected[key])
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert np.array_equal(actual, expected)
    else:
        assert actual == expected


def visible_files(root: Path) -> list[str]:
    return sorted(name for name in os.listdir(root) if not name.startswith("."))


def hidden_files(root: Path) -> list[str]:
    return sorted(name for name in os.listdir(root) if name.startswith(".") and name != LOCK_NAME)


# Files on disk.


async def test_each_version_is_a_file_named_by_prefix_and_version(tmp_path):
    root = tmp_path / "state"
    async with FileProgramStateManager(root, prefix="ckpt_") as manager:
        await manager.save(state_of(0), 0)
        await manager.save(state_of(12), 12)
    assert visible_files(root) == ["ckpt_0.plstate", "ckpt_12.plstate"]
    assert hidden_files(root) == []


async def test_versions_outlive_the_manager(tmp_path):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(3), 3)
    async with FileProgramStateManager(tmp_path) as reopened:
        assert await reopened.get_versions() == [3]
        state, version = await reopened.load_latest()
    assert version == 3
    assert_state_equal(state, state_of(3))


async def test_get_versions_parses_file_names_and_ignores_other_files(tmp_path):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(2), 2)
    for name in [
        "notes.txt",
        "program_state_x.plstate",
        "program_state_007.plstate",
        "program_state_-1.plstate",
        "program_state_5.plstate.unreadable",
        "program_state_5.plstatex",
        "other_3.plstate",
    ]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "program_state_10.plstate").write_bytes(
        (tmp_path / "program_state_2.plstate").read_bytes()
    )
    async with FileProgramStateManager(tmp_path) as manager:
        assert await manager.get_versions() == [2, 10]


async def test_the_directory_is_created_on_the_first_call(tmp_path):
    root = tmp_path / "a" / "b"
    manager = FileProgramStateManager(root)
    assert not root.exists()
    async with manager:
        assert await manager.get_versions() == []
        assert root.is_dir()


async def test_save_fsyncs_the_file_before_renaming_it_and_the_directory_after(
    tmp_path, monkeypatch
):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def replace(source: Any, target: Any) -> None:
        real_replace(source, target)
        events.append(("replace", f"{source} -> {target}"))

    async with FileProgramStateManager(tmp_path, keep_total=None) as manager:
        await manager.get_versions()
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        await manager.save(state_of(1), 1)
    [(_, written), (_, renamed), (_, directory)] = events
    temporary = Path(written)
    assert temporary.parent == tmp_path and temporary.name.startswith(".program_state_1.")
    assert renamed == f"{temporary} -> {tmp_path / 'program_state_1.plstate'}"
    assert directory == str(tmp_path)


# One manager per directory.


async def test_a_second_manager_on_the_directory_raises_until_the_first_closes(tmp_path):
    first = FileProgramStateManager(tmp_path)
    await first.save(state_of(0), 0)
    second = FileProgramStateManager(tmp_path)
    with pytest.raises(StateDirectoryLockedError, match=str(tmp_path)):
        await second.get_versions()
    with pytest.raises(StateDirectoryLockedError):
        await second.save(state_of(1), 1)
    await first.aclose()
    assert await second.get_versions() == [0]
    await second.aclose()
    assert issubclass(StateDirectoryLockedError, ManagerError)


async def test_a_manager_in_another_process_locks_the_directory(tmp_path):
    holder = (
        "import sys, anyio\n"
        "from managers.state.file import FileProgramStateManager\n"
        "async def main():\n"
        "    async with FileProgramStateManager(sys.argv[1]) as manager:\n"
        "        await manager.get_versions()\n"
        "        print('locked', flush=True)\n"
        "        await anyio.to_thread.run_sync(sys.stdin.read)\n"
        "anyio.run(main)\n"
    )
    async with await anyio.open_process(
        [sys.executable, "-c", holder, str(tmp_path)], stderr=None
    ) as process:
        with anyio.fail_after(30):  # a hang guard: the holder prints as soon as it locked
            assert await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 99) == (
                b"locked"
            )
        with pytest.raises(StateDirectoryLockedError, match="in use by another manager"):
            async with FileProgramStateManager(tmp_path) as manager:
                await manager.get_versions()
        await process.stdin.aclose()
        assert await process.wait() == 0
    async with FileProgramStateManager(tmp_path) as manager:
        assert await manager.get_versions() == []


async def test_calls_after_aclose_open_the_directory_again(tmp_path):
    manager = FileProgramStateManager(tmp_path)
    await manager.save(state_of(0), 0)
    await manager.aclose()
    await manager.aclose()  # idempotent
    await manager.save(state_of(1), 1)
    assert await manager.get_versions() == [0, 1]
    with pytest.raises(StateDirectoryLockedError):
        await FileProgramStateManager(tmp_path).get_versions()
    await manager.aclose()


async def test_temporary_files_left_by_a_crash_are_removed_on_open(tmp_path, caplog):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(0), 0)
    stale = [".program_state_1.plstate.tmp-0badf00d", ".retired_program_state_0.plstate.tmp-01"]
    for name in stale:
        (tmp_path / name).write_bytes(b"torn")
    (tmp_path / ".unrelated").write_bytes(b"kept")
    with caplog.at_level(logging.DEBUG, logger="managers.state.file"):
        async with FileProgramStateManager(tmp_path) as manager:
            assert await manager.get_versions() == [0]
    assert hidden_files(tmp_path) == [".unrelated"]
    levels = {
        name: record.levelno
        for record in caplog.records
        for name in stale
        if name in record.getMessage()
    }
    # A torn save is news; a spare is what every closed manager leaves behind.
    assert levels == {stale[0]: logging.INFO, stale[1]: logging.DEBUG}


# Retention.


@pytest.mark.parametrize(
    ("options", "saved", "kept"),
    [
        ({"keep_total": 3}, range(10), [0, 7, 8, 9]),
        ({"keep_total": 3, "keep_first": False}, range(10), [7, 8, 9]),
        ({"keep_total": 1, "keep_first": False}, range(10), [9]),
        ({"keep_total": 1}, range(10), [0, 9]),
        ({"keep_total": 2, "keep_first": False, "keep_every": 4}, range(10), [0, 4, 8, 9]),
        ({"keep_total": 2, "keep_every": 3}, range(1, 11), [1, 3, 6, 9, 10]),
        ({"keep_total": 2, "keep_first": False, "keep_every": 5}, [2, 5, 7, 11, 12], [5, 11, 12]),
        ({"keep_total": None}, range(8), list(range(8))),
        ({}, range(8), [0, 3, 4, 5, 6, 7]),
    ],
    ids=[
        "total-and-first",
        "total",
        "total-1",
        "total-1-and-first",
        "total-and-every",
        "total-first-every",
        "gaps",
        "keep-all",
        "defaults",
    ],
)
async def test_retention(tmp_path, options, saved, kept):
    async with FileProgramStateManager(tmp_path, **options) as manager:
        for version in saved:
            await manager.save(state_of(version), version)
        assert await manager.get_versions() == kept
        for version in kept:
            assert_state_equal(await manager.load(version), state_of(version))
    assert set(visible_files(tmp_path)) == {f"program_state_{version}.plstate" for version in kept}
    assert len(hidden_files(tmp_path)) <= 2  # spares: retired files that saves overwrite


async def test_keep_total_one_keeps_the_version_just_written(tmp_path):
    async with FileProgramStateManager(tmp_path, keep_total=1, keep_first=False) as manager:
        for version in range(6):
            await manager.save(state_of(version), version)
            assert await manager.get_versions() == [version]
            state, latest = await manager.load_latest()
            assert latest == version
            assert_state_equal(state, state_of(version))


async def test_recycled_files_hold_exactly_the_new_state_whatever_its_size(tmp_path):
    sizes = [100_000, 10, 10, 10, 100_000, 10, 50_000, 100_000, 0, 10]
    async with FileProgramStateManager(tmp_path, keep_total=1, keep_first=False) as manager:
        for version, size in enumerate(sizes):
            await manager.save(state_of(version, size), version)
            assert_state_equal((await manager.load_latest())[0], state_of(version, size))
    async with FileProgramStateManager(tmp_path) as reopened:
        assert_state_equal(await reopened.load(len(sizes) - 1), state_of(len(sizes) - 1, 10))


async def test_remove_all_removes_the_spare_files_too(tmp_path):
    async with FileProgramStateManager(tmp_path, keep_total=1, keep_first=False) as manager:
        for version in range(5):
            await manager.save(state_of(version), version)
        await manager.remove_all()
        assert os.listdir(tmp_path) == [LOCK_NAME]


# Damaged versions.


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for position in (len(data) // 3, len(data) // 2):
        data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def empty(path: Path) -> None:
    path.write_bytes(b"")


def overwrite_with_text(path: Path) -> None:
    path.write_text("not a program state\n")


@pytest.mark.parametrize("damage", [truncate, flip_bytes, empty, overwrite_with_text])
async def test_load_latest_skips_a_damaged_newest_version(tmp_path, caplog, damage):
    async with FileProgramStateManager(tmp_path) as manager:
        for version in (1, 2, 3):
            await manager.save(state_of(version), version)
    newest = tmp_path / "program_state_3.plstate"
    damage(newest)
    damaged_bytes = newest.read_bytes()

    async with FileProgramStateManager(tmp_path) as manager:
        with caplog.at_level(logging.WARNING, logger="managers.state.file"):
            state, version = await manager.load_latest()
        assert version == 2
        assert_state_equal(state, state_of(2))
        [record] = caplog.records
        assert record.levelno == logging.WARNING
        assert "version 3" in record.getMessage()
        assert "program_state_3.plstate.unreadable" in record.getMessage()
        # Moved aside, not deleted, and no longer listed.
        assert not newest.exists()
        assert (tmp_path / "program_state_3.plstate.unreadable").read_bytes() == damaged_bytes
        assert await manager.get_versions() == [1, 2]
        # The resumed run saves version 3 again.
        await manager.save(state_of(30), 3)
        assert_state_equal(await manager.load(3), state_of(30))
        state, version = await manager.load_latest()
        assert version == 3
        assert_state_equal(state, state_of(30))


async def test_a_version_damaged_twice_is_moved_aside_under_a_new_name(tmp_path, caplog):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(1), 1)
        for _ in range(2):
            await manager.save(state_of(2), 2)
            truncate(tmp_path / "program_state_2.plstate")
            with caplog.at_level(logging.WARNING, logger="managers.state.file"):
                assert (await manager.load_latest())[1] == 1
    assert visible_files(tmp_path) == [
        "program_state_1.plstate",
        "program_state_2.plstate.unreadable",
        "program_state_2.plstate.unreadable-2",
    ]


async def test_load_latest_falls_back_over_several_damaged_versions(tmp_path, caplog):
    async with FileProgramStateManager(tmp_path) as manager:
        for version in range(4):
            await manager.save(state_of(version), version)
        truncate(tmp_path / "program_state_3.plstate")
        flip_bytes(tmp_path / "program_state_2.plstate")
        with caplog.at_level(logging.WARNING, logger="managers.state.file"):
            state, version = await manager.load_latest()
    assert version == 1
    assert_state_equal(state, state_of(1))
    assert len(caplog.records) == 2


async def test_load_latest_with_every_version_damaged_raises_unless_told_to_start_fresh(
    tmp_path, caplog
):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(0), 0)
        empty(tmp_path / "program_state_0.plstate")
        with pytest.raises(AllVersionsDamagedError, match=r"program_state_0\.plstate"):
            await manager.load_latest()
        assert await manager.get_versions() == [0]
    async with FileProgramStateManager(tmp_path, on_all_damaged="start_fresh") as manager:
        with caplog.at_level(logging.WARNING, logger="managers.state.file"):
            assert await manager.load_latest() == (None, 0)
        assert await manager.get_versions() == []
    assert visible_files(tmp_path) == ["program_state_0.plstate.unreadable"]


async def test_load_of_a_damaged_version_raises_naming_the_file(tmp_path):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(0), 0)
        await manager.save(state_of(1), 1)
        flip_bytes(tmp_path / "program_state_0.plstate")
        with pytest.raises(SerializationError, match=r"program_state_0\.plstate"):
            await manager.load(0)
        # load does not move anything aside; load_latest is unaffected by version 0.
        assert await manager.get_versions() == [0, 1]
        assert (await manager.load_latest())[1] == 1


async def test_load_of_a_missing_version_raises_version_not_found(tmp_path):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(0), 0)
        with pytest.raises(VersionNotFoundError, match=r"version 4 .*saved: \[0\]"):
            await manager.load(4)


# Failing and cancelled saves.


@pytest.mark.parametrize("keep_total", [None, 1], ids=["new-file", "recycled-file"])
async def test_a_full_disk_fails_the_save_and_keeps_earlier_versions(
    tmp_path, monkeypatch, keep_total
):
    real_write = os.write
    budget = {"bytes": 10_000}

    def write_until_full(fd: int, data: Any) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            return real_write(fd, data)
        if budget["bytes"] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = real_write(fd, memoryview(data)[: budget["bytes"]])
        budget["bytes"] -= written
        return written

    async with FileProgramStateManager(tmp_path, keep_total=keep_total) as manager:
        for version in range(4):
            await manager.save(state_of(version, 50_000), version)
        kept = await manager.get_versions()
        monkeypatch.setattr(os, "write", write_until_full)
        with pytest.raises(OSError, match="No space left") as info:
            await manager.save(state_of(4, 50_000), 4)
        assert info.value.errno == errno.ENOSPC
        assert await manager.get_versions() == kept
        assert hidden_files(tmp_path) == []
        for version in kept:
            assert_state_equal(await manager.load(version), state_of(version, 50_000))
        monkeypatch.undo()
        await manager.save(state_of(4, 50_000), 4)
        assert_state_equal(await manager.load(4), state_of(4, 50_000))


async def test_an_unstorable_state_leaves_no_file(tmp_path):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(0), 0)
        with pytest.raises(TypeError, match="cannot store leaf at 'optimizer'"):
            await manager.save({"optimizer": object()}, 1)
        assert await manager.get_versions() == [0]
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME, "program_state_0.plstate"]


class CancelsWhenConverted:
    """A leaf whose conversion to an array, done in the save's worker thread, cancels
    ``scope``: a cancellation that arrives while the save is under way."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope = scope

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        anyio.from_thread.run_sync(self.scope.cancel)
        return np.arange(3)


@pytest.mark.parametrize("cancelled", ["before the save", "while it runs"])
async def test_a_cancelled_save_is_complete_or_absent(tmp_path, cancelled):
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state_of(0), 0)
        with anyio.CancelScope() as scope:
            big = {**state_of(1, 4_000_000), "probe": CancelsWhenConverted(scope)}
            if cancelled == "before the save":
                scope.cancel()
            await manager.save(big, 1)
        # Already when the cancelled call returns, nothing is being written any more.
        assert hidden_files(tmp_path) == []
        if cancelled == "before the save":  # its thread never started: absent
            assert visible_files(tmp_path) == ["program_state_0.plstate"]
            assert await manager.get_versions() == [0]
        else:  # its thread had started: it finished, complete
            assert visible_files(tmp_path) == [f"program_state_{v}.plstate" for v in (0, 1)]
            assert await manager.get_versions() == [0, 1]
            assert_state_equal(await manager.load(1), {**big, "probe": np.arange(3)})
        await manager.save(state_of(2), 2)  # the manager is still usable
        assert (await manager.get_versions())[-1] == 2


class LoopWatch:
    """Tells a worker thread whether the event loop ran a task while the thread waited."""

    def __init__(self) -> None:
        self._in_thread = threading.Event()
        self._loop_ran = threading.Event()

    def wait_in_thread(self) -> bool:
        """Called in the worker thread; True once the event loop answered."""
        self._in_thread.set()
        return self._loop_ran.wait(timeout=30)  # a hang guard: False only if blocked

    async def answer(self) -> None:
        """Runs on the event loop: answers the worker thread as soon as it waits."""
        assert await anyio.to_thread.run_sync(self._in_thread.wait, 30)
        self._loop_ran.set()


async def test_saving_and_loading_do_not_block_the_event_loop(tmp_path, monkeypatch):
    """While a save writes its file and a load reads it, the event loop runs tasks."""
    watches = {"write": LoopWatch(), "read": LoopWatch()}
    answered: list[tuple[str, bool]] = []

    def watched(name: str, function: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            answered.append((name, watches[name].wait_in_thread()))
            return function(*args)

        return wrapper

    monkeypatch.setattr(file_module, "write_all", watched("write", file_module.write_all))
    monkeypatch.setattr(
        file_module, "read_version_file", watched("read", file_module.read_version_file)
    )
    async with FileProgramStateManager(tmp_path) as manager, anyio.create_task_group() as group:
        for watch in watches.values():
            group.start_soon(watch.answer)
        await manager.save(state_of(0), 0)
        state, version = await manager.load_latest()
    assert answered == [("write", True), ("read", True)]
    assert version == 0
    assert_state_equal(state, state_of(0))


# Arguments.


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"root_dir": 5}, TypeError, "root_dir must be a str or os.PathLike path, got int 5"),
        ({"root_dir": ""}, ValueError, "root_dir must be a non-empty path, got ''"),
        ({"prefix": 1}, TypeError, "prefix must be a str, got int 1"),
        ({"prefix": "a/b"}, ValueError, "prefix must be a plain file-name start"),
        ({"prefix": ".hidden"}, ValueError, "prefix must be a plain file-name start"),
        ({"keep_total": 0}, ValueError, "keep_total must be an int >= 1 or None, got 0"),
        ({"keep_total": -2}, ValueError, "keep_total must be an int >= 1 or None, got -2"),
        ({"keep_total": 2.0}, TypeError, "keep_total must be an int >= 1 or None, got float 2.0"),
        ({"keep_total": True}, TypeError, "keep_total must be an int >= 1 or None, got bool True"),
        ({"keep_first": 1}, TypeError, "keep_first must be a bool, got int 1"),
        ({"keep_first": None}, TypeError, "keep_first must be a bool"),
        ({"keep_every": 0}, ValueError, "keep_every must be an int >= 1 or None, got 0"),
        ({"keep_every": "3"}, TypeError, "keep_every must be an int >= 1 or None, got str '3'"),
    ],
    ids=lambda value: str(value) if not isinstance(value, dict) else "-".join(map(str, value)),
)
async def test_invalid_arguments_raise_naming_the_argument(tmp_path, arguments, error, message):
    arguments = {"root_dir": tmp_path, **arguments}
    with pytest.raises(error, match=message):
        FileProgramStateManager(**arguments)


async def test_root_dir_accepts_str_and_paths(tmp_path):
    for root in (str(tmp_path / "s"), tmp_path / "p"):
        async with FileProgramStateManager(root) as manager:
            await manager.save(state_of(0), 0)
        assert Path(root, "program_state_0.plstate").is_file()


# Processes killed while they save.

# The version that load_latest finds after a kill at each point of a save of version v.
LEFT_BY_A_KILL_AT = {"writing": -1, "written": -1, "renamed": 0, "retiring": 0, "saved": 0}
KILLS_AT_EACH_POINT = 6


async def test_sigkill_at_every_point_of_a_save_leaves_a_complete_latest_version(
    tmp_path, anyio_backend, caplog
):
    """A saver process kills itself with SIGKILL at each point of a save in turn (half
    written, written, renamed, retiring, returned), many times over; after each kill a
    fresh manager loads, complete, the version saved before (cut before the rename) or
    the one being saved (cut after it)."""
    assert sorted(LEFT_BY_A_KILL_AT) == sorted(saver.KILL_POINTS)
    root = tmp_path / "state"
    environment = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        # The saver imports the managers of this checkout, not an installed copy.
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])
        ),
    }
    command = [sys.executable, str(SAVER_PATH), anyio_backend]
    next_version = 0
    async with await anyio.open_process(command, stderr=None, env=environment) as process:
        lines = BufferedByteReceiveStream(process.stdout)

        async def read_line() -> list[str]:
            with anyio.fail_after(30):  # a hang guard: a line comes in milliseconds
                return (await lines.receive_until(b"\n", 1000)).decode().split()

        assert await read_line() == ["ready"]
        for point in saver.KILL_POINTS * KILLS_AT_EACH_POINT:
            await process.stdin.send(f"start {root} {next_version} {point}\n".encode())
            saving = -1
            while (line := await read_line())[0] != "exited":
                assert len(line) == 2, line
                if line[0] == "saving":
                    saving = int(line[1])
            assert os.waitstatus_to_exitcode(int(line[2])) == -signal.SIGKILL
            assert saving > next_version  # killed in a save after its first one

            async with FileProgramStateManager(root, keep_total=saver.KEEP_TOTAL) as manager:
                state, version = await manager.load_latest()
                assert hidden_files(root) == []  # what the killed save left is removed
            assert version == saving + LEFT_BY_A_KILL_AT[point], point
            assert_state_equal(state, saver.expected_state(version))
            next_version = version + 1
        await process.stdin.send(b"quit\n")
        assert await process.wait() == 0
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert not [name for name in os.listdir(root) if "unreadable" in name]


async def test_the_saved_states_depend_on_the_version_alone():
    assert_state_equal(saver.expected_state(7), saver.expected_state(7))
    assert not np.array_equal(
        saver.expected_state(7)["weights"], saver.expected_state(8)["weights"]
    )
