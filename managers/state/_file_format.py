"""The file of one program-state version: writing its buffers, and reading it back from
whatever is found at its name.

Reading opens without blocking and without following into anything but a regular file
(a FIFO, a device, a socket, a directory, a dangling or looping symbolic link raise
:class:`~managers.serialization.SerializationError`, as damaged bytes do), and checks
the file's size against its header before it allocates a buffer for it.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np

from managers.exceptions import AllVersionsDamagedError, ManagerError
from managers.files import fsync_directory
from managers.serialization import HEADER_SIZE, SerializationError, payload_size

__all__ = [
    "all_damaged_error",
    "hard_linked_error",
    "hard_linked_version",
    "is_single_file_or_missing",
    "read_version_file",
    "set_aside",
    "write_all",
]

# Errors of open(2) that say what is at the name is not a file one can read.
_NOT_A_FILE = {errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.ENOTDIR, errno.EOPNOTSUPP}
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def write_all(fd: int, buffers: list[memoryview]) -> int:
    """Write every buffer in order to ``fd``; the number of bytes written."""
    total = 0
    for buffer in buffers:
        total += buffer.nbytes
        while buffer.nbytes:
            written = os.write(fd, buffer)
            buffer = buffer[written:]
    return total


def read_version_file(path: Path) -> np.ndarray:
    """The bytes of the version file at ``path`` in a writable buffer, which the loaded
    arrays then share.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        SerializationError: what is at ``path`` is not a regular file, or its size is not
            the one its header gives (the message says which).
        MemoryError: the file is as large as its header says, too large for this
            process's memory (the message names it).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.islink(path):
            raise SerializationError(
                f"it is a dangling symbolic link (to {os.readlink(path)!r})"
            ) from None
        raise
    except OSError as error:
        if error.errno not in _NOT_A_FILE:
            raise
        raise SerializationError(f"it is {_kind_of(path)} ({error.strerror})") from None
    try:
        info = os.fstat(fd)  # of what was opened: no race with a rename in between
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "a special file")
            raise SerializationError(f"it is not a regular file but {kind}")
        return _read_payload(fd, info.st_size, path)
    finally:
        os.close(fd)


def _read_payload(fd: int, size: int, path: Path) -> np.ndarray:
    expected = payload_size(os.pread(fd, HEADER_SIZE, 0))
    if size != expected:
        problem = "truncated" if size < expected else "longer than its header says"
        raise SerializationError(
            f"the payload is {problem}: the file is {size} bytes, its header says {expected}"
        )
    try:
        buffer = np.empty(size, np.uint8)
    except MemoryError as error:
        raise MemoryError(f"cannot allocate {size} bytes to read {path}: {error}") from None
    view = memoryview(buffer)
    filled = 0
    with io.FileIO(fd, closefd=False) as file:
        while filled < size:
            count = file.readinto(view[filled:])
            if not count:
                raise SerializationError(
                    f"the payload is truncated: the file shrank to {filled} bytes while "
                    f"it was read, its header says {expected}"
                )
            filled += count
    return buffer


def is_single_file_or_missing(path: Path) -> bool:
    """Whether ``path`` is a regular file itself (not a symbolic link to one) with no other
    name (no hard link), or nothing: a name whose file a save may write into."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return True
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def hard_linked_version(
    path: Path, versions: Callable[[], dict[int, Path]]
) -> tuple[int, Path] | None:
    """The version and path among ``versions()`` (version -> path, listed only when
    ``path`` has more than one link) that name the same file as ``path`` (a hard link),
    or None; ``path`` itself is not compared."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink == 1:
        return None
    for version, other in versions().items():
        if other == path:
            continue
        try:
            other_info = os.lstat(other)
        except FileNotFoundError:
            continue
        if (other_info.st_dev, other_info.st_ino) == (info.st_dev, info.st_ino):
            return version, other
    return None


def hard_linked_error(version: int, path: Path, other: int, other_path: Path) -> ManagerError:
    """The error of version ``version``, whose file at ``path`` is also version ``other``'s."""
    newer = path if version > other else other_path
    return ManagerError(
        f"program state version {version} at {path} is hard-linked to version {other} at "
        f"{other_path}: one file under two names, which holds the state of only one of the "
        "two versions; delete the name of the version whose state it does not hold (the "
        f"newer name, {newer}, when the older version was linked to it), then load again"
    )


def set_aside(path: Path) -> Path:
    """Rename what is at ``path`` (a file, a directory, a symbolic link) to
    ``{name}.unreadable``, or ``.unreadable-2``... when taken; its new path."""
    aside = path.with_name(f"{path.name}.unreadable")
    number = 1
    while os.path.lexists(aside):
        number += 1
        aside = path.with_name(f"{path.name}.unreadable-{number}")
    os.replace(path, aside)
    fsync_directory(path.parent)
    return aside


def all_damaged_error(
    directory: Path, paths: dict[int, Path], reasons: dict[int, BaseException]
) -> AllVersionsDamagedError:
    """The error saying that none of the versions saved in ``directory`` loads: the path
    of each and why."""
    listed = "; ".join(
        f"version {version} at {path}: {reasons[version]}" for version, path in paths.items()
    )
    return AllVersionsDamagedError(
        f"none of the {len(paths)} program-state versions saved in {directory} loads, so "
        f"there is nothing to resume from ({listed}). They are left in place. To start "
        "over, move them away, or pass on_all_damaged='start_fresh' to "
        "FileProgramStateManager, which moves them aside to '{name}.unreadable'",
        paths,
    )


def _kind_of(path: Path) -> str:
    """What is at ``path``, which cannot be opened as a file, for a message."""
    try:
        return _KINDS.get(stat.S_IFMT(os.stat(path).st_mode), "a special file")
    except OSError:
        if os.path.islink(path):
            return "a symbolic link that cannot be followed"
        return "not a file that can be opened"
