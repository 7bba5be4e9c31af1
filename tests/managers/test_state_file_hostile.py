"""FileProgramStateManager against hostile files: things that are not checkpoints at a
version's name (FIFOs, devices, sockets, directories, symlink loops, huge files), crafted
payloads beyond the codec's limits, read-only directories, and a run whose every
checkpoint is damaged."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pickle
import shutil
import socket
import stat
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import crc32c
import numpy as np
import pytest

from managers import StateDirectoryLockedError
from managers.exceptions import AllVersionsDamagedError, ManagerError, NewerFormatError
from managers.serialization import MAX_DEPTH, MAX_NODES, SerializationError
from managers.state.file import FileProgramStateManager

pytestmark = pytest.mark.anyio

LOGGER = "managers.state.file"
TIB = 2**40


def state_of(version: int) -> dict:
    return {"weights": np.full(4, version, dtype=np.float32), "round": version}


def name_of(version: int) -> str:
    return f"program_state_{version}.plstate"


async def save_versions(root: Path, versions: list[int], **options: object) -> None:
    async with FileProgramStateManager(root, **options) as manager:
        for version in versions:
            await manager.save(state_of(version), version)


def assert_loaded(loaded: tuple, version: int) -> None:
    state, loaded_version = loaded
    assert loaded_version == version
    assert state["round"] == version
    np.testing.assert_array_equal(state["weights"], state_of(version)["weights"])


def damage(path: Path) -> None:
    path.write_bytes(b"not a program state")


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


# Things that are not regular files at a version's name.


class FifoGuard:
    """Unblocks a reader or writer stuck opening ``fifo`` if it is still stuck after a
    long time, so that a defect fails the test instead of hanging it; records whether it
    had to."""

    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        self.done = threading.Event()
        self.had_to_unblock = False
        self._thread = threading.Thread(target=self._guard, daemon=True)

    def _guard(self) -> None:
        if self.done.wait(timeout=30):  # a hang guard: a correct load never waits on it
            return
        self.had_to_unblock = True
        with contextlib.suppress(OSError):
            os.close(os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK))  # both ends at once

    def __enter__(self) -> FifoGuard:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.done.set()
        self._thread.join()


def make_fifo(path: Path, tmp_path: Path) -> None:
    target = tmp_path / "a-fifo"
    os.mkfifo(target)
    path.symlink_to(target)


def make_device(path: Path, tmp_path: Path) -> None:
    path.symlink_to("/dev/zero")


def make_socket(path: Path, tmp_path: Path) -> None:
    # A socket's path is limited to ~100 bytes: bind it in a short directory, move it.
    short = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(short / "s"))
        os.rename(short / "s", path)
    finally:
        shutil.rmtree(short)


def make_directory(path: Path, tmp_path: Path) -> None:
    path.mkdir()
    (path / "inside").write_bytes(b"kept")


def make_symlink_loop(path: Path, tmp_path: Path) -> None:
    path.symlink_to(path.name)


def make_dangling_symlink(path: Path, tmp_path: Path) -> None:
    path.symlink_to(tmp_path / "missing")


NOT_REGULAR = {
    "symlink-to-fifo": (make_fifo, "a FIFO"),
    "symlink-to-device": (make_device, "a character device"),
    "socket": (make_socket, "a socket"),
    "directory": (make_directory, "a directory"),
    "symlink-loop": (make_symlink_loop, "symbolic link"),
    "dangling-symlink": (make_dangling_symlink, "dangling symbolic link"),
}


@pytest.mark.parametrize("kind", list(NOT_REGULAR))
async def test_load_latest_sets_aside_what_is_not_a_regular_file_at_the_newest_name(
    tmp_path, caplog, kind
):
    root = tmp_path / "state"
    await save_versions(root, [1, 2])
    make, description = NOT_REGULAR[kind]
    newest = root / name_of(3)
    make(newest, tmp_path)
    aside = root / f"{name_of(3)}.unreadable"
    async with FileProgramStateManager(root) as manager:
        with (
            caplog.at_level(logging.WARNING, logger=LOGGER),
            FifoGuard(tmp_path / "a-fifo") as guard,
        ):
            loaded = await manager.load_latest()
        assert not guard.had_to_unblock, "load_latest blocked opening a FIFO"
        assert_loaded(loaded, 2)
        [message] = warnings_of(caplog)
        assert str(newest) in message and str(aside) in message and description in message
        assert not os.path.lexists(newest) and os.path.lexists(aside)
        assert await manager.get_versions() == [1, 2]
        await manager.save(state_of(3), 3)  # the resumed run saves version 3 again
        assert_loaded(await manager.load_latest(), 3)
    if kind == "directory":
        assert (aside / "inside").read_bytes() == b"kept"


@pytest.mark.parametrize("kind", ["symlink-to-fifo", "directory", "symlink-loop"])
async def test_load_of_what_is_not_a_regular_file_raises_naming_it(tmp_path, kind):
    root = tmp_path / "state"
    await save_versions(root, [1])
    make, description = NOT_REGULAR[kind]
    make(root / name_of(2), tmp_path)
    async with FileProgramStateManager(root) as manager:
        with FifoGuard(tmp_path / "a-fifo") as guard, pytest.raises(SerializationError) as raised:
            await manager.load(2)
        assert not guard.had_to_unblock, "load blocked opening a FIFO"
    assert str(root / name_of(2)) in str(raised.value)
    assert description in str(raised.value)


async def test_a_symlink_to_a_checkpoint_loads(tmp_path):
    root = tmp_path / "state"
    await save_versions(root, [1])
    (tmp_path / "elsewhere.plstate").write_bytes((root / name_of(1)).read_bytes())
    (root / name_of(5)).symlink_to(tmp_path / "elsewhere.plstate")
    async with FileProgramStateManager(root) as manager:
        state, version = await manager.load_latest()
    assert version == 5 and state["round"] == 1  # version 1's state, linked as version 5


@pytest.mark.parametrize("kind", ["directory", "symlink-to-a-file", "symlink-to-fifo"])
async def test_retention_never_writes_into_what_is_not_a_regular_file_nor_deletes_a_directory(
    tmp_path, caplog, kind
):
    root = tmp_path / "state"
    await save_versions(root, [1, 2])
    target = tmp_path / "elsewhere.plstate"
    target.write_bytes(b"someone else's file")
    if kind == "directory":
        make_directory(root / name_of(0), tmp_path)
    elif kind == "symlink-to-a-file":
        (root / name_of(0)).symlink_to(target)
    else:
        make_fifo(root / name_of(0), tmp_path)
    async with FileProgramStateManager(root, keep_total=1, keep_first=False) as manager:
        with (
            caplog.at_level(logging.WARNING, logger=LOGGER),
            FifoGuard(tmp_path / "a-fifo") as guard,
        ):
            for version in range(3, 8):  # retirements recycle files as spares
                await manager.save(state_of(version), version)
        assert not guard.had_to_unblock, "a save blocked opening a FIFO"
        assert await manager.get_versions() == [7]
        assert_loaded(await manager.load_latest(), 7)
    assert target.read_bytes() == b"someone else's file"
    if kind == "directory":  # not the manager's to delete
        [message] = warnings_of(caplog)
        assert str(root / name_of(0)) in message
        assert (root / f"{name_of(0)}.unreadable" / "inside").read_bytes() == b"kept"
    else:  # the link alone is deleted
        assert not os.path.lexists(root / name_of(0))
        assert warnings_of(caplog) == []


async def test_remove_and_remove_all_move_a_directory_aside_instead_of_deleting_it(
    tmp_path, caplog
):
    root = tmp_path / "state"
    await save_versions(root, [1, 2])
    make_directory(root / name_of(3), tmp_path)
    make_directory(root / name_of(4), tmp_path)
    async with FileProgramStateManager(root) as manager:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            await manager.remove(4)
            assert await manager.get_versions() == [1, 2, 3]
            await manager.remove_all()
        assert await manager.get_versions() == []
    assert len(warnings_of(caplog)) == 2
    for version in (3, 4):
        assert (root / f"{name_of(version)}.unreadable" / "inside").read_bytes() == b"kept"


# Files whose size does not fit their header.


def sparse_file(path: Path, content: bytes, size: int) -> None:
    with open(path, "wb") as file:
        file.write(content)
        file.truncate(size)


def huge_garbage(path: Path, payload: bytes) -> None:
    sparse_file(path, b"garbage", TIB)


def huge_after_a_payload(path: Path, payload: bytes) -> None:
    sparse_file(path, payload, TIB)


def header_claiming_a_huge_tree(path: Path, payload: bytes) -> None:
    path.write_bytes(payload[:16] + struct.pack("<QQ", TIB, 0) + payload[32:])


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (huge_garbage, "not a programlogic payload"),
        (huge_after_a_payload, f"{TIB} bytes"),
        (header_claiming_a_huge_tree, "truncated"),
    ],
    ids=["garbage", "longer-than-its-header", "header-claims-1-tib"],
)
async def test_a_file_that_does_not_fit_its_header_is_set_aside_without_reading_it(
    tmp_path, caplog, make, reason
):
    root = tmp_path / "state"
    await save_versions(root, [1])
    make(root / name_of(2), (root / name_of(1)).read_bytes())
    async with FileProgramStateManager(root) as manager:
        with pytest.raises(SerializationError, match=reason) as raised:
            await manager.load(2)
        assert str(root / name_of(2)) in str(raised.value)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert_loaded(await manager.load_latest(), 1)
    [message] = warnings_of(caplog)
    assert str(root / name_of(2)) in message
    assert (root / f"{name_of(2)}.unreadable").exists()


# Crafted payloads beyond the codec's limits.


def crafted_payload(tree: bytes) -> bytes:
    """A payload of ``tree`` with a valid header and checksum and no blobs."""
    body = struct.pack("<QQ", len(tree), 0) + tree + bytes(-len(tree) % 16)
    return b"\x89PLC\r\n\x1a\n" + struct.pack("<II", 1, crc32c.crc32c(body)) + body


@pytest.mark.parametrize(
    ("tree", "reason"),
    [
        (b"[" * 900 + b"]" * 900, f"nests deeper than {MAX_DEPTH}"),
        (b'{"$tuple": [' * 500 + b"]}" * 500, f"nests deeper than {MAX_DEPTH}"),
        (b"[" + b"0," * MAX_NODES + b"0]", f"more than {MAX_NODES:,} values"),
    ],
    ids=["900-deep-lists", "500-deep-tuples", "too-many-nodes"],
)
async def test_a_crafted_payload_beyond_the_limits_is_damaged_naming_the_file(
    tmp_path, caplog, tree, reason
):
    root = tmp_path / "state"
    await save_versions(root, [1])
    (root / name_of(2)).write_bytes(crafted_payload(tree))
    async with FileProgramStateManager(root) as manager:
        with pytest.raises(SerializationError, match=reason) as raised:
            await manager.load(2)
        assert str(root / name_of(2)) in str(raised.value)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert_loaded(await manager.load_latest(), 1)
    assert (root / f"{name_of(2)}.unreadable").exists()


async def test_a_state_beyond_the_limits_is_not_saved_and_the_error_names_its_path(tmp_path):
    deep: list = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    async with FileProgramStateManager(tmp_path) as manager:
        with pytest.raises(SerializationError, match=r"at 'model/0/0/.*': it nests deeper"):
            await manager.save({"model": deep}, 1)
        with pytest.raises(
            SerializationError, match=rf"at 'history/\d+': .*more than {MAX_NODES:,}"
        ):
            await manager.save({"history": [0.5] * MAX_NODES}, 1)
        assert await manager.get_versions() == []
    assert not [name for name in os.listdir(tmp_path) if "plstate" in name and "lock" not in name]


# Every checkpoint damaged.


async def test_load_latest_raises_when_every_version_is_damaged_and_leaves_them(tmp_path):
    root = tmp_path / "state"
    await save_versions(root, [0, 1, 2])
    for version in (0, 2):
        damage(root / name_of(version))
    (root / name_of(1)).unlink()
    make_directory(root / name_of(1), tmp_path)
    for _ in range(2):  # a rerun fails alike: nothing was moved
        async with FileProgramStateManager(root) as manager:
            with pytest.raises(AllVersionsDamagedError) as raised:
                await manager.load_latest()
            assert await manager.get_versions() == [0, 1, 2]
        assert raised.value.versions == [0, 1, 2]
        message = str(raised.value)
        for version in (0, 1, 2):
            assert str(root / name_of(version)) in message
        assert "on_all_damaged='start_fresh'" in message
    assert isinstance(raised.value, ManagerError)
    assert sorted(os.listdir(root)) == [".plstate.lock", *(name_of(v) for v in (0, 1, 2))]


async def test_on_all_damaged_start_fresh_sets_them_aside_and_starts_over(tmp_path, caplog):
    root = tmp_path / "state"
    await save_versions(root, [0, 1])
    for version in (0, 1):
        damage(root / name_of(version))
    async with FileProgramStateManager(root, on_all_damaged="start_fresh") as manager:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert await manager.load_latest() == (None, 0)
        assert await manager.get_versions() == []
        await manager.save(state_of(0), 0)
        assert_loaded(await manager.load_latest(), 0)
    assert len(warnings_of(caplog)) == 2
    assert sorted(name for name in os.listdir(root) if "unreadable" in name) == [
        f"{name_of(0)}.unreadable",
        f"{name_of(1)}.unreadable",
    ]


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (
            "ignore",
            ValueError,
            "on_all_damaged must be one of 'raise', 'start_fresh', got 'ignore'",
        ),
        (True, TypeError, "on_all_damaged must be one of 'raise', 'start_fresh', got bool True"),
    ],
)
async def test_on_all_damaged_is_validated(tmp_path, value, error, message):
    with pytest.raises(error, match=message):
        FileProgramStateManager(tmp_path, on_all_damaged=value)


# Read-only directories.


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` made not writable for this process: by its mode for a user, by the
    immutable attribute for root (whom modes do not stop)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: cannot make a directory read-only")
    result = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"chattr +i is not supported here: {result.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


def assert_not_writable(directory: Path) -> None:
    with pytest.raises(PermissionError):
        (directory / "probe").write_bytes(b"")


@pytest.mark.parametrize("lock_file", ["left by a writer", "absent"])
async def test_a_read_only_directory_loads_and_skips_damage_without_moving_it(
    tmp_path, caplog, lock_file
):
    root = tmp_path / "state"
    await save_versions(root, [1, 2, 3])
    damage(root / name_of(3))
    if lock_file == "absent":
        (root / ".plstate.lock").unlink()
    listing = sorted(os.listdir(root))
    with read_only(root):
        assert_not_writable(root)
        async with FileProgramStateManager(root) as manager, FileProgramStateManager(root) as other:
            with caplog.at_level(logging.WARNING, logger=LOGGER):
                assert_loaded(await manager.load_latest(), 2)
                assert_loaded(await other.load_latest(), 2)  # readers share the directory
            assert await manager.get_versions() == [1, 2, 3]
            assert_loaded((await manager.load(1), 1), 1)
            with pytest.raises(PermissionError, match="read-only") as raised:
                await manager.save(state_of(4), 4)
            assert raised.value.filename == str(root)
            with pytest.raises(PermissionError, match="read-only"):
                await manager.remove(1)
            with pytest.raises(PermissionError, match="read-only"):
                await manager.remove_all()
        messages = warnings_of(caplog)
        assert len(messages) == 2
        assert all(str(root / name_of(3)) in m and "read-only" in m for m in messages)
        assert sorted(os.listdir(root)) == listing
    async with FileProgramStateManager(root) as writer:  # writable again: moved aside now
        assert_loaded(await writer.load_latest(), 2)
        assert (root / f"{name_of(3)}.unreadable").exists()


async def test_a_reader_of_a_read_only_directory_and_a_writer_exclude_each_other(tmp_path):
    root = tmp_path / "state"
    await save_versions(root, [1])
    async with FileProgramStateManager(root) as writer:
        await writer.get_versions()
        with read_only(root), pytest.raises(StateDirectoryLockedError, match=str(root)):
            await FileProgramStateManager(root).get_versions()
    reader = FileProgramStateManager(root)
    with read_only(root):
        assert await reader.get_versions() == [1]
    try:  # the directory is writable again, but a reader still holds it
        with pytest.raises(StateDirectoryLockedError, match=str(root)):
            await FileProgramStateManager(root).get_versions()
    finally:
        await reader.aclose()
    async with FileProgramStateManager(root) as writer:
        await writer.save(state_of(2), 2)


async def test_a_read_only_directory_with_every_version_damaged_raises(tmp_path):
    root = tmp_path / "state"
    await save_versions(root, [1])
    damage(root / name_of(1))
    with read_only(root):
        async with FileProgramStateManager(root) as manager:
            with pytest.raises(AllVersionsDamagedError, match=name_of(1)):
                await manager.load_latest()
        async with FileProgramStateManager(root, on_all_damaged="start_fresh") as manager:
            assert await manager.load_latest() == (None, 0)
        assert (root / name_of(1)).exists()


async def test_a_checkpoint_this_user_cannot_read_raises_instead_of_being_set_aside(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    root = tmp_path / "state"
    await save_versions(root, [1, 2])
    (root / name_of(2)).chmod(0)
    async with FileProgramStateManager(root) as manager:
        with pytest.raises(PermissionError) as raised:
            await manager.load_latest()
    assert raised.value.errno == errno.EACCES
    assert stat.S_ISREG((root / name_of(2)).lstat().st_mode)


async def test_all_versions_damaged_error_survives_pickling(tmp_path):
    """Process pools and Ray ship exceptions pickled: the versions must come along."""
    root = tmp_path / "state"
    await save_versions(root, [4])
    damage(root / name_of(4))
    async with FileProgramStateManager(root) as manager:
        with pytest.raises(AllVersionsDamagedError) as raised:
            await manager.load_latest()
    copy = pickle.loads(pickle.dumps(raised.value))
    assert copy.versions == [4] and str(copy) == str(raised.value)


# Hard links and symbolic links: backups made with hard links, a repointed root.


async def test_saves_never_write_into_the_versions_of_a_hard_linked_backup(tmp_path):
    """``cp -al state backup`` (or ``rsync --link-dest``) while a run goes on: the backup
    shares the version files, and the run's later saves must leave them as they were."""
    root, backup = tmp_path / "state", tmp_path / "backup"
    async with FileProgramStateManager(root, keep_total=2, keep_first=False) as manager:
        for version in range(1, 5):
            await manager.save(state_of(version), version)
        shutil.copytree(root, backup, copy_function=os.link)  # what cp -al does
        for version in range(5, 14):  # retirements recycle files as spares
            await manager.save(state_of(version), version)
        assert_loaded(await manager.load_latest(), 13)
    async with FileProgramStateManager(backup) as restored:
        versions = await restored.get_versions()
        assert versions == [3, 4]
        for version in versions:
            assert_loaded((await restored.load(version), version), version)


async def test_retention_never_writes_into_a_version_hard_linked_to_a_kept_one(tmp_path):
    root = tmp_path / "state"
    await save_versions(root, [0, 1, 2, 3, 4])
    (root / name_of(5)).hardlink_to(root / name_of(1))  # `ln`: version 5 is version 1's file
    linked = (root / name_of(5)).read_bytes()
    options = {"keep_total": 1, "keep_first": False, "keep_every": 5}
    async with FileProgramStateManager(root, **options) as manager:
        for version in range(6, 10):  # retires 1 to 4 and 6 to 8; keeps 0 and 5
            await manager.save(state_of(version), version)
        assert await manager.get_versions() == [0, 5, 9]
        assert_loaded((await manager.load(9), 9), 9)
    assert (root / name_of(5)).read_bytes() == linked  # still version 1's state


async def test_a_spare_linked_after_it_was_retired_is_not_written_into(tmp_path):
    """A backup taken while the manager runs links its spare files too."""
    root, backup = tmp_path / "state", tmp_path / "backup"
    async with FileProgramStateManager(root, keep_total=1, keep_first=False) as manager:
        for version in range(1, 5):
            await manager.save(state_of(version), version)
        spares = sorted(name for name in os.listdir(root) if name.startswith(".retired_"))
        assert spares  # the test needs spares to exist now
        backup.mkdir()
        for name in spares:
            os.link(root / name, backup / name)
        contents = {name: (backup / name).read_bytes() for name in spares}
        for version in range(5, 9):
            await manager.save(state_of(version), version)
        assert_loaded(await manager.load_latest(), 8)
    assert {name: (backup / name).read_bytes() for name in spares} == contents


async def test_a_version_hard_linked_to_another_is_refused_naming_both(tmp_path, caplog):
    root = tmp_path / "state"
    await save_versions(root, [0, 1, 2, 3, 4])
    (root / name_of(5)).hardlink_to(root / name_of(2))  # version 5 holds round 2's state
    async with FileProgramStateManager(root) as manager:
        for load in (manager.load_latest, lambda: manager.load(5)):
            with (
                caplog.at_level(logging.WARNING, logger=LOGGER),
                pytest.raises(ManagerError, match="hard-linked") as raised,
            ):
                await load()
            message = str(raised.value)
            assert str(root / name_of(5)) in message and str(root / name_of(2)) in message
            assert "delete" in message
        assert_loaded((await manager.load(4), 4), 4)
    assert warnings_of(caplog) == []
    assert not [name for name in os.listdir(root) if "unreadable" in name]  # nothing set aside


async def test_a_repointed_symbolic_link_to_the_root_does_not_move_an_open_manager(tmp_path):
    first, second, link = tmp_path / "first", tmp_path / "second", tmp_path / "current"
    first.mkdir()
    second.mkdir()
    link.symlink_to(first.name)
    manager = FileProgramStateManager(link)
    try:
        await manager.save(state_of(1), 1)
        repointed = tmp_path / "current.new"
        repointed.symlink_to(second.name)
        os.replace(repointed, link)  # the link now names the second directory
        async with FileProgramStateManager(second) as other:  # which has a lock of its own
            await other.save(state_of(7), 7)
            await manager.save(state_of(2), 2)
            assert await manager.get_versions() == [1, 2]
            assert_loaded(await manager.load_latest(), 2)
            assert await other.get_versions() == [7]
        assert manager.root_dir == link
    finally:
        await manager.aclose()
    assert sorted(name for name in os.listdir(first) if name.endswith(".plstate")) == [
        name_of(1),
        name_of(2),
    ]
    async with manager:  # opened again: resolved again, to the second directory
        assert await manager.get_versions() == [7]


async def test_a_version_of_a_newer_codec_is_refused_and_left_in_place(tmp_path, caplog):
    root = tmp_path / "state"
    await save_versions(root, [1, 2])
    newer = bytearray((root / name_of(2)).read_bytes())
    struct.pack_into("<I", newer, 8, 2)  # the format version written by a newer codec
    (root / name_of(3)).write_bytes(newer)
    for _ in range(2):  # refused again on a rerun: nothing was moved
        async with FileProgramStateManager(root, on_all_damaged="start_fresh") as manager:
            for load in (manager.load_latest, lambda: manager.load(3)):
                with (
                    caplog.at_level(logging.WARNING, logger=LOGGER),
                    pytest.raises(NewerFormatError, match="format version 2") as raised,
                ):
                    await load()
                message = str(raised.value)
                assert str(root / name_of(3)) in message and "newer" in message
                assert raised.value.found == 2 and raised.value.readable == 1
            assert await manager.get_versions() == [1, 2, 3]
    assert warnings_of(caplog) == []
    assert (root / name_of(3)).read_bytes() == newer
    assert not [name for name in os.listdir(root) if "unreadable" in name]
    assert isinstance(raised.value, SerializationError)
    copy = pickle.loads(pickle.dumps(raised.value))
    assert (copy.found, copy.readable, str(copy)) == (2, 1, str(raised.value))
