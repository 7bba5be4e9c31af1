"""The trial locks: flock files beside SQLite, advisory locks with PostgreSQL.

Each behaviour is checked on both kinds: a trial lock one tuner holds is refused to
another until released, closed, or its process killed; taking it twice takes it once;
the study lock admits one tuner at a time. ``open_locks`` picks the kind by the URL.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from programlogic.tuning._locks import (
    FileTrialLocks,
    PostgresTrialLocks,
    TrialLocks,
    open_locks,
    postgres_conninfo,
    study_key,
)

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]

# Takes trial 7's lock and the study lock, says so, and waits to be killed.
CHILD = """
import sys, time
from pathlib import Path
from programlogic.tuning._locks import open_locks
locks = open_locks(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
assert locks.try_lock_trial(7)
with locks.lock_study():
    print("locked", flush=True)
    time.sleep(3600)
"""


class Storage:
    """A storage URL and a study name, with what the server side can tell of the locks."""

    def __init__(self, url: str, root: Path) -> None:
        self.url, self.root = url, root
        self.name = f"study-{uuid.uuid4().hex}"
        self._opened: list[TrialLocks] = []

    def locks(self) -> TrialLocks:
        """A new tuner's locks, closed when the test ends."""
        locks = open_locks(self.url, self.name, self.root)
        self._opened.append(locks)
        return locks

    def close(self) -> None:
        for locks in self._opened:
            locks.close()

    def _server(self) -> psycopg.Connection | None:
        if not self.url.startswith("postgresql"):
            return None
        return psycopg.connect(postgres_conninfo(self.url), autocommit=True)

    async def until_study_lock_awaited(self) -> None:
        """Return once a tuner waits for the study lock (at once with flock: no telling)."""
        connection = self._server()
        if connection is None:
            return
        try:
            with connection, anyio.fail_after(120):  # a hang guard, not a deadline
                while True:
                    row = connection.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT "
                        "granted AND classid = %s::int4::oid AND objid = (-1)::int4::oid "
                        "AND objsubid = 2",
                        (study_key(self.name),),
                    ).fetchone()
                    if row is not None and row[0] > 0:
                        return
                    await anyio.sleep(0.005)
        except TimeoutError:
            pytest.fail("no tuner came to wait for the study lock")

    def until_trial_released(self, number: int) -> None:
        """Return once no session holds trial ``number``'s lock.

        A killed client's session ends when its server process sees the connection
        close, a moment after the client's death: this waits for it by taking the lock.
        """
        connection = self._server()
        if connection is None:
            return  # the kernel drops a dead process's flocks before wait() returns
        with connection:
            connection.execute("SET lock_timeout = '60s'")
            key = (study_key(self.name), number)
            connection.execute("SELECT pg_advisory_lock(%s::int4, %s::int4)", key)
            connection.execute("SELECT pg_advisory_unlock(%s::int4, %s::int4)", key)


@pytest.fixture(params=["file", "postgresql"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "file":
        url = f"sqlite:///{tmp_path / 'study.db'}"
    else:
        url = request.getfixturevalue("postgresql_url")
    storage = Storage(url, tmp_path)
    yield storage
    storage.close()


async def test_a_held_trial_lock_is_refused_to_another_tuner_until_unlocked(
    storage: Storage,
) -> None:
    first, second = storage.locks(), storage.locks()
    assert first.try_lock_trial(1)
    assert not second.try_lock_trial(1)
    assert second.try_lock_trial(2)
    first.unlock_trial(1)
    assert second.try_lock_trial(1)
    assert not first.try_lock_trial(1)
    assert not first.try_lock_trial(2)


async def test_closing_releases_every_trial_lock(storage: Storage) -> None:
    first, second = storage.locks(), storage.locks()
    assert first.try_lock_trial(0) and first.try_lock_trial(3)
    assert not second.try_lock_trial(0)
    first.close()
    assert second.try_lock_trial(0) and second.try_lock_trial(3)


async def test_taking_a_trial_lock_twice_takes_it_once(storage: Storage) -> None:
    first, second = storage.locks(), storage.locks()
    assert first.try_lock_trial(4)
    assert first.try_lock_trial(4)
    first.unlock_trial(4)
    assert second.try_lock_trial(4)
    first.unlock_trial(4)  # not held: nothing happens
    assert not first.try_lock_trial(4)


async def test_the_study_lock_admits_one_tuner_at_a_time(storage: Storage) -> None:
    first, second = storage.locks(), storage.locks()
    order: list[str] = []
    waiting = threading.Event()

    def second_takes_the_study_lock() -> None:
        waiting.set()
        with second.lock_study():
            order.append("second holds")

    async with anyio.create_task_group() as group:
        with first.lock_study():
            group.start_soon(anyio.to_thread.run_sync, second_takes_the_study_lock)
            await anyio.to_thread.run_sync(waiting.wait)
            await storage.until_study_lock_awaited()
            order.append("first releases")
    assert order == ["first releases", "second holds"]
    with first.lock_study():  # and the second released it in turn
        order.append("first holds again")


async def test_a_killed_tuners_locks_are_free(storage: Storage) -> None:
    locks = storage.locks()
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", CHILD, storage.url, storage.name, str(storage.root)]
    async with await anyio.open_process(command, env=environment) as child:
        assert child.stdout is not None and child.stderr is not None
        try:
            line = await BufferedByteReceiveStream(child.stdout).receive_until(b"\n", 100)
        except anyio.IncompleteRead:
            pytest.fail((await child.stderr.receive()).decode())
        assert line == b"locked"
        assert not locks.try_lock_trial(7)
        child.kill()
        await child.wait()
    with locks.lock_study():
        storage.until_trial_released(7)
        assert locks.try_lock_trial(7)


@pytest.mark.parametrize(
    "scheme", ["postgresql", "postgresql+psycopg", "postgresql+psycopg2", "postgresql+pg8000"]
)
async def test_a_postgresql_url_in_any_spelling_opens_advisory_locks(
    postgresql_url: str, scheme: str, tmp_path: Path
) -> None:
    url = scheme + postgresql_url.removeprefix("postgresql+psycopg")
    first = open_locks(url, "study", tmp_path)
    second = open_locks(postgresql_url, "study", tmp_path)
    try:
        assert isinstance(first, PostgresTrialLocks)
        assert first.try_lock_trial(0)
        assert not second.try_lock_trial(0)
    finally:
        first.close()
        second.close()
    assert not (tmp_path / "locks").exists()


async def test_a_sqlite_url_opens_file_locks_under_the_root(tmp_path: Path) -> None:
    locks = open_locks(f"sqlite:///{tmp_path / 'study.db'}", "study", tmp_path)
    assert isinstance(locks, FileTrialLocks)
    assert locks.try_lock_trial(2)
    assert (tmp_path / "locks" / "trial_2.lock").exists()
    locks.close()


async def test_two_studies_advisory_locks_are_apart(postgresql_url: str, tmp_path: Path) -> None:
    one = open_locks(postgresql_url, "one", tmp_path)
    other = open_locks(postgresql_url, "other", tmp_path)
    try:
        assert one.try_lock_trial(0) and other.try_lock_trial(0)
        with one.lock_study(), other.lock_study():
            pass
    finally:
        one.close()
        other.close()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("mysql+pymysql://tuner:s3cr%40t@db.example/tuning", "'mysql+pymysql'"),
        ("redis://:s3cr%40t@cache.example:6379/0", "'redis'"),
        ("tuner:s3cr%40t@db.example/tuning", "'tuner'"),
    ],
)
async def test_another_storage_is_refused_without_its_password(url: str, named: str) -> None:
    with pytest.raises(ValueError, match="SQLite or PostgreSQL") as refused:
        open_locks(url, "study", Path("unused"))
    assert named in str(refused.value)
    assert "s3cr" not in str(refused.value)


async def test_a_urls_percent_escapes_and_spaces_reach_libpq() -> None:
    conninfo = postgres_conninfo(
        "postgresql+psycopg://tuner:p%40ss%20word@/tuning?host=/tmp/a%20b&port=5433"
    )
    assert psycopg.conninfo.conninfo_to_dict(conninfo) == {
        "user": "tuner",
        "password": "p@ss word",
        "host": "/tmp/a b",
        "port": "5433",
        "dbname": "tuning",
    }


async def test_a_study_key_is_a_signed_32_bit_integer_from_the_names_sha256() -> None:
    # The first 4 bytes of sha256(b"study") and of sha256(b"other"), the latter's above 2**31.
    assert study_key("study") == 0x0C87ED81
    assert study_key("other") == 0xD9298A10 - 2**32
