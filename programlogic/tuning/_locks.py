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
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from programlogic._optional import require

__all__ = ["FileTrialLocks", "PostgresTrialLocks", "TrialLocks", "check_storage_url", "open_locks"]

logger = logging.getLogger(__name__)

_STUDY_KEY2 = -1  # trial numbers start at 0, so the study lock never meets a trial's


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


class PostgresTrialLocks(TrialLocks):
    """Session advisory locks of one PostgreSQL connection, keyed by the study's name.

    The two-key form: the first key is the study's (from its name), the second the
    trial's number, or -1 for the study lock. The server drops them all when the
    connection ends, the tuner's death included.
    """

    def __init__(self, conninfo: str, study_name: str) -> None:
        self._psycopg = require("psycopg", "psycopg", "programlogic.tuning", extra="tuning")
        self._connection = self._psycopg.connect(conninfo, autocommit=True)
        self._key = study_key(study_name)
        self._trials: set[int] = set()

    def _call(self, function: str, key2: int) -> object:
        row = self._connection.execute(
            f"SELECT {function}(%s::int4, %s::int4)", (self._key, key2)
        ).fetchone()
        assert row is not None
        return row[0]

    def try_lock_trial(self, number: int) -> bool:
        # A session lock stacks on each take, and unlock_trial releases once: take it once.
        if number in self._trials:
            return True
        if not self._call("pg_try_advisory_lock", number):
            return False
        self._trials.add(number)
        return True

    def unlock_trial(self, number: int) -> None:
        if number not in self._trials:
            return
        self._trials.discard(number)
        if not self._call("pg_advisory_unlock", number):
            logger.warning("trial %d's advisory lock was not held on unlocking it", number)

    @contextlib.contextmanager
    def lock_study(self) -> Iterator[None]:
        self._call("pg_advisory_lock", _STUDY_KEY2)
        try:
            yield
        finally:
            self._call("pg_advisory_unlock", _STUDY_KEY2)

    def close(self) -> None:
        self._trials.clear()
        # The server ends a closed connection's session a moment after close() returns:
        # unlocking first frees the locks for the next taker by the time close() returns.
        if not self._connection.closed:
            with contextlib.suppress(self._psycopg.Error):  # a broken one holds none left
                self._connection.execute("SELECT pg_advisory_unlock_all()")
        self._connection.close()


def study_key(study_name: str) -> int:
    """The first advisory-lock key of study ``study_name``: a signed 32-bit integer."""
    digest = hashlib.sha256(study_name.encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def postgres_conninfo(storage_url: str) -> str:
    """The libpq connection string of a ``postgresql[+driver]://`` SQLAlchemy URL."""
    engine = require("sqlalchemy.engine", "sqlalchemy", "programlogic.tuning", extra="tuning")
    conninfo = require("psycopg.conninfo", "psycopg", "programlogic.tuning", extra="tuning")
    url = engine.make_url(storage_url)
    # Not url.render_as_string(): it writes a query's spaces as "+", which libpq keeps.
    query = {
        name: ",".join(value) if isinstance(value, tuple) else value
        for name, value in url.query.items()
    }
    given = {
        "user": url.username,
        "password": url.password,
        "host": url.host,
        "port": url.port,
        "dbname": url.database,
    }
    return conninfo.make_conninfo(
        **{name: value for name, value in given.items() if value is not None}, **query
    )


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
    return PostgresTrialLocks(postgres_conninfo(storage_url), study_name)
