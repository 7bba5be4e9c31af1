"""The locks that make one tuner own a running trial: they die with the tuner's process.

A tuner takes the study lock to look at the study and claim work (so two tuners never
create more trials than asked, nor claim one trial twice), and holds a trial's lock for
as long as it runs the trial. A tuner that dies (kill -9 included) loses its locks, so
another tuner, or the same command run again, takes its running trials over.

Beside a SQLite storage the locks are ``flock`` locks on files under ``<root>/locks/``;
with a PostgreSQL storage they are session advisory locks held by one connection of
the tuner's. Every method blocks: tuners call them on a worker thread.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["FileTrialLocks", "TrialLocks", "check_storage_url", "open_locks"]


class TrialLocks(abc.ABC):
    """The study lock and the per-trial locks of one tuner."""

    @abc.abstractmethod
    def try_lock_trial(self, number: int) -> bool:
        """Take trial ``number``'s lock without waiting: whether this tuner now holds it.

        True also when this tuner held it already.
        """

    @abc.abstractmethod
    def unlock_trial(self, number: int) -> None:
        """Release trial ``number``'s lock (nothing if this tuner does not hold it)."""

    @abc.abstractmethod
    def lock_study(self) -> contextlib.AbstractContextManager[None]:
        """Hold the study lock, exclusive among the study's tuners, for a ``with`` block."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release every lock this tuner holds."""


class FileTrialLocks(TrialLocks):
    """``flock`` locks on ``directory/study.lock`` and ``directory/trial_<n>.lock``.

    The files are never removed: removing a lock file while another tuner waits on it
    would let a third lock a new file of the same name.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory
        self._trials: dict[int, int] = {}

    def _try_lock(self, name: str, *, blocking: bool) -> int | None:
        fd = os.open(self._directory / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def try_lock_trial(self, number: int) -> bool:
        if number in self._trials:
            return True
        fd = self._try_lock(f"trial_{number}.lock", blocking=False)
        if fd is None:
            return False
        self._trials[number] = fd
        return True

    def unlock_trial(self, number: int) -> None:
        fd = self._trials.pop(number, None)
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file drops its flock

    @contextlib.contextmanager
    def lock_study(self) -> Iterator[None]:
        fd = self._try_lock("study.lock", blocking=True)
        try:
            yield
        finally:
            os.close(fd)

    def close(self) -> None:
        for number in list(self._trials):
            self.unlock_trial(number)


def check_storage_url(storage_url: str) -> str:
    """``storage_url``'s database, ``"sqlite"`` or ``"postgresql"``; else a ValueError.

    The message names the URL's scheme only: a URL may hold a password.
    """
    scheme = storage_url.split(":", 1)[0]
    database = scheme.split("+", 1)[0]
    if ":" not in storage_url or database not in ("sqlite", "postgresql"):
        raise ValueError(
            "storage must be an SQLAlchemy URL of SQLite or PostgreSQL (sqlite:///..., "
            f"postgresql+psycopg://...), got a URL of scheme {scheme!r}"
        )
    return database


def open_locks(storage_url: str, study_name: str, root: Path) -> TrialLocks:
    """The locks that fit the storage ``storage_url`` names."""
    if check_storage_url(storage_url) == "sqlite":
        return FileTrialLocks(root / "locks")
    raise NotImplementedError("PostgreSQL locks")
