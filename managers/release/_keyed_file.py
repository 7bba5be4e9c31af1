"""A file holding one record per release key, appended to or rewritten as keys arrive.

The engine behind the CSV and JSON lines release managers: a :class:`KeyedFile` does the
file handling (one write at a time under a lock, in worker threads; the last call of a
key wins; an append for a new key the file's layout already holds; an atomic rewrite
for a replaced key, a wider layout or a file that may hold a torn write; reading an
existing file on first use; closing), and a :class:`RecordFormat` says what a record
looks like on disk.
"""

from __future__ import annotations

import contextlib
import io
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio

from managers.files import append, open_for_append, replace_and_reopen
from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.validation import check_path
from managers.values import materialize
from managers.writes import PreparedWrite, WriteQueue

__all__ = ["KeyedFile", "RecordFormat"]

Layout = TypeVar("Layout")
Record = TypeVar("Record")


class RecordFormat(ABC, Generic[Layout, Record]):
    """How records are encoded in a keyed file.

    A *record* is what a release writes for its key, compared by ``==`` to tell an
    unchanged release; a *layout* is what the whole file shares (a CSV header), which
    a record may widen. :meth:`read` and :meth:`render` run in a worker thread, the
    others on the event loop.
    """

    @abstractmethod
    def encode(self, key: ReleaseKey, value: Any) -> Record:
        """The record of a release of the materialized ``value`` under ``key``.

        Raises ``TypeError`` or ``ValueError`` for a value the format cannot hold.
        """

    @abstractmethod
    def read(self, path: Path) -> tuple[Layout, dict[ReleaseKey, Record], bool]:
        """``(layout, records by key in file order, must_rewrite)`` of the file at ``path``.

        An absent file has no records and must be rewritten (the first write creates
        it). ``must_rewrite`` is also true when the file holds something its records do
        not (an unfinished last line, a key twice).
        """

    @abstractmethod
    def widen(self, layout: Layout, record: Record) -> Layout:
        """The layout holding ``layout``'s records and ``record``: ``layout`` itself when
        it already holds ``record``."""

    @abstractmethod
    def line(self, layout: Layout, key: ReleaseKey, record: Record) -> bytes:
        """The bytes appended for a new key's record, line end included."""

    @abstractmethod
    def render(self, layout: Layout, records: list[tuple[ReleaseKey, Record]]) -> bytes:
        """The whole file holding ``records`` in their order."""


@dataclass(slots=True)
class _Row(Generic[Record]):
    record: Record
    call: int  # the release call that wrote the record; 0 when read from the file


class KeyedFile(Generic[Layout, Record]):
    """The file at ``path``, a record per key in the order keys were first released.

    Releasing a key again with an unchanged record writes nothing; a new key whose
    record the layout holds is appended in one unfsynced write; anything else rewrites
    the file atomically. Releases may overlap: their writes are made one at a time, and
    the last call of a key wins among those that succeed. A failed release leaves the
    other records as they were. Writes go through a :class:`~managers.writes.WriteQueue`;
    :meth:`prepare` hands a release's write to a :class:`~managers.writes.WriteBatch`
    instead of making it. ``aclose`` closes the file; a later
    release reads it again.
    """

    def __init__(self, path: Path, record_format: RecordFormat[Layout, Record]) -> None:
        self._path = path
        self._format = record_format
        self._lock: anyio.Lock | None = None
        self._calls = 0
        self._writes = WriteQueue(on_dropped=self._mark_torn)
        self._forget()

    async def release(self, value: Any, key: ReleaseKey) -> None:
        """Write the record of ``value`` (materialized) under ``key``."""
        async with self._prepared(value, key) as write:
            if write is not None:
                await write.make()

    async def prepare(self, value: Any, key: ReleaseKey) -> PreparedWrite | None:
        """The write of :meth:`release`, not made (``None`` when nothing is to be
        written): the record is taken in memory now, and the file holds it once a
        :class:`~managers.writes.WriteBatch` made the write. A prepared write that is
        never made (dropped, or one before it failed) leaves the record in memory only,
        and the next release rewrites the file with it."""
        async with self._prepared(value, key) as write:
            return write

    @contextlib.asynccontextmanager
    async def _prepared(self, value: Any, key: ReleaseKey) -> AsyncIterator[PreparedWrite | None]:
        """Under the file's lock: the write of a release of ``value`` under ``key``."""
        check_key(key)
        self._calls += 1
        call = self._calls
        record = self._format.encode(key, await materialize(value))
        if self._lock is None:
            # Uncontended, as releases mostly are, it is taken without yielding: 4 us less.
            self._lock = anyio.Lock(fast_acquire=True)
        async with self._lock:
            if not self._loaded:
                await self._load()
            layout = self._layout
            row = self._rows.get(key)
            if row is not None:
                if row.call > call:
                    yield None  # a later release of this key has been written
                    return
                if row.record == record and not self._must_rewrite:
                    row.call = call
                    yield None
                    return
            wider = self._format.widen(layout, record)
            if row is None and wider is layout and not self._must_rewrite:
                write = self._writes.prepare(self._append, self._format.line(layout, key, record))
            else:
                records = [
                    (row_key, record if row_key == key else row.record)
                    for row_key, row in self._rows.items()
                ]
                if key not in self._rows:
                    records.append((key, record))
                self._must_rewrite = False  # unless the rewrite fails
                write = self._writes.prepare(self._rewrite, wider, records)
                self._layout = wider
            self._rows[key] = _Row(record, call)
            yield write

    async def aclose(self) -> None:
        """Close the file and forget what was read from it."""
        if self._lock is None:
            return
        with anyio.CancelScope(shield=True):  # leaving `async with` on cancellation closes too
            async with self._lock:
                await self._writes.run(self._close_file)
                self._forget()

    def _forget(self) -> None:
        """Drop what was read from the file, so that the next release reads it again."""
        self._loaded = False
        self._layout: Layout | None = None  # the file's, once it is loaded
        self._rows: dict[ReleaseKey, _Row[Record]] = {}
        self._file: io.FileIO | None = None  # open for appending
        self._must_rewrite = False

    async def _load(self) -> None:
        layout, records, self._must_rewrite = await self._writes.run(self._format.read, self._path)
        self._rows = {key: _Row(record, 0) for key, record in records.items()}
        if not self._must_rewrite:
            self._file = await self._writes.run(open_for_append, self._path)
        self._layout = layout
        self._loaded = True

    # The writes below run in worker threads, one at a time, in the order submitted.

    def _append(self, line: bytes) -> None:
        try:
            append(self._file, line)
        except BaseException:
            self._mark_torn()
            raise

    def _rewrite(self, layout: Layout, records: list[tuple[ReleaseKey, Record]]) -> None:
        try:
            self._file = replace_and_reopen(
                self._path, self._file, self._format.render, layout, records
            )
        except BaseException:
            self._mark_torn()
            raise

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()

    def _mark_torn(self) -> None:
        """The file may lack a record in memory, or hold part of one: the next release
        rewrites it from memory."""
        self._must_rewrite = True


class _KeyedFileReleaseManager(ReleaseManager):
    """A release manager that keeps one record per key in one file, in ``file_format``.

    What the CSV and JSON lines release managers share: their releases, prepared
    releases and closing are their :class:`KeyedFile`'s; they differ in the format.
    """

    def __init__(self, file_path: str | os.PathLike[str], file_format: RecordFormat[Any, Any]):
        self._path = check_path("file_path", file_path)
        self._file = KeyedFile(self._path, file_format)

    @property
    def file_path(self) -> Path:
        """The file written."""
        return self._path

    async def release(self, value: Any, key: ReleaseKey) -> None:
        await self._file.release(value, key)

    async def prepare_release(self, value: Any, key: ReleaseKey) -> PreparedWrite | None:
        """The write of :meth:`release`, not made (``None`` when the file already holds
        the row): checked and taken now, written when a
        :class:`~managers.writes.WriteBatch` makes it."""
        return await self._file.prepare(value, key)

    async def aclose(self) -> None:
        await self._file.aclose()
