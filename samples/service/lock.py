"""One service per data directory: an exclusive lock on ``service.lock`` in it.

Two services on one data directory would each take the other's running runs for
interrupted ones (and mark them failed, or resume them twice). The lock is an
``fcntl.flock`` on an open file, so the system releases it when the process ends,
however it ends: a killed service never leaves its directory locked.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["LOCK_FILE", "DataDirectoryLock", "DataDirectoryLockedError", "check_unlocked"]

LOCK_FILE = "service.lock"
"""The lock file's name in the data directory."""


class DataDirectoryLockedError(RuntimeError):
    """Another service holds the data directory."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(
            f"{data_dir} is in use by another service (it holds {data_dir / LOCK_FILE}): "
            "stop that one, or pick another --data-dir"
        )


class DataDirectoryLock:
    """The lock on a data directory, held from :meth:`acquire` until :meth:`release`.

    Both do file I/O: call them from a worker thread in async code.
    """

    def __init__(self, descriptor: int) -> None:
        self._descriptor: int | None = descriptor

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirectoryLock:
        """Lock ``data_dir`` (which must exist); ``DataDirectoryLockedError`` if it is held."""
        descriptor = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise DataDirectoryLockedError(data_dir) from None
        except BaseException:
            os.close(descriptor)
            raise
        return cls(descriptor)

    def release(self) -> None:
        """Unlock the directory; releasing twice does nothing."""
        if self._descriptor is not None:
            os.close(self._descriptor)  # closing the only descriptor releases the flock
            self._descriptor = None


def check_unlocked(data_dir: Path) -> None:
    """Raise ``DataDirectoryLockedError`` now if a service holds ``data_dir``; create nothing.

    For a clear refusal before a slow start: the service itself takes the lock when it
    opens its runs, and that is what keeps a second one out.
    """
    try:
        descriptor = os.open(data_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return  # no lock file: nobody holds it
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise DataDirectoryLockedError(data_dir) from None
    finally:
        os.close(descriptor)
