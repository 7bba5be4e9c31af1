"""The lock of a program-state directory: exclusive for the manager that writes it,
shared by the managers that only read it."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

__all__ = ["LOCK_NAME", "is_writable", "lock_directory", "read_only_error"]

LOCK_NAME = ".plstate.lock"


def is_writable(directory: Path) -> bool:
    """Whether this process may create, rename and remove files in ``directory``.

    Asks the kernel for the effective user, so that it answers as those operations
    would: a mode without write permission, a read-only mount or the immutable attribute
    make it False (root ignores the mode only).
    """
    effective = os.access in os.supports_effective_ids
    return os.access(directory, os.W_OK | os.X_OK, effective_ids=effective)


def lock_directory(directory: Path, *, writable: bool) -> int | None:
    """Lock ``directory``; the descriptor holding the lock, or None when none is taken.

    A ``writable`` directory is locked exclusively through its lock file (created if
    need be). Any other is locked shared through its lock file, which readers may hold
    together and which excludes a writer; when it has none (and none can be created),
    nothing is locked.

    Raises:
        BlockingIOError: another manager holds a lock that excludes this one.
    """
    path = directory / LOCK_NAME
    if writable:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        operation = fcntl.LOCK_EX
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        operation = fcntl.LOCK_SH
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_only_error(directory: Path, action: str) -> PermissionError:
    """The error of a manager asked to ``action`` in a ``directory`` it opened read-only."""
    return PermissionError(
        errno.EACCES,
        f"cannot {action}: this process cannot write the program-state directory, which "
        "the manager therefore opened read-only (it loads versions only)",
        str(directory),
    )
