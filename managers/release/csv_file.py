"""Released values as the rows of a CSV file: a row per key, a column per structure path."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import numpy as np

from managers._files import append, open_for_append, replace_and_reopen
from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.structure import flatten
from managers.validation import check_path, check_str
from managers.values import materialize

__all__ = ["CSVFileReleaseManager"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_INT_KEY = re.compile(r"0|-?[1-9][0-9]*")
_TEXT_MARK = "'"


class CSVFileReleaseManager(ReleaseManager):
    """Writes released values to a CSV file, one row per key.

    A program that releases ``{"client_work": {"train": {"loss": 0.5, "accuracy": 0.75}}}``
    for rounds 1 and 2 and ``{"accuracy": 0.9}`` under ``"final"`` gets this file (UTF-8,
    each line ending in ``\\n``, quoted as the ``csv`` module does when a cell needs it)::

        key,client_work/train/loss,client_work/train/accuracy,accuracy
        1,0.5,0.75,
        2,0.25,0.8125,
        final,,,0.9

    - The first column is ``key_fieldname``; the others are the paths of the released
      leaves (:func:`managers.structure.flatten`) in order of first appearance. A leaf
      that is the whole value (``release(0.5, 3)``) goes in the column named ``""``. A
      release with a path the header lacks widens it: the file is rewritten with the new
      column last, and rows without a value there get an empty cell. Columns are never
      removed.
    - Rows are in the order keys were first released; releasing a key again replaces its
      row in place. An int key is written in decimal. A str key is written as it is, with
      a ``'`` in front when it would otherwise read as an int or begins with ``'`` itself
      (the spreadsheet mark for text): ``"7"`` is written ``'7``, so the file tells int
      keys from str keys.
    - Cells: ``int``, ``float`` and ``bool`` (Python or numpy; numpy scalars and 0-d arrays
      are converted to Python first) as their ``repr``, so floats read back exactly
      (``0.1``, ``1e-05``, ``nan``, ``inf``; ``np.float32(0.1)`` is the double
      ``0.10000000149011612``); ``str`` as it is; ``None`` as an empty cell. An empty cell
      also means the row has no value at that path, so an empty str reads back as missing,
      and ``"1"`` reads back like ``1``: CSV has no types. Arrays of one or more dimensions,
      bytes and other objects raise ``TypeError`` naming the path; a path equal to
      ``key_fieldname``, or two leaves with one path, raise ``ValueError``. Nothing is
      written then.

    Writes cost what they must: a new key whose paths are all in the header is appended in
    one write (the file is not read or rewritten); releasing a key again with an unchanged
    row writes nothing; a changed row or a wider header rewrites the file atomically (a
    temporary file in the same directory, fsynced, renamed over the file, directory
    fsynced), so a crash leaves the old file or the new one. Appends are not fsynced: they
    reach the operating system before ``release`` returns, which survives a crash of the
    program but not necessarily of the machine.

    On its first release the manager reads the file if it exists (this is how a restarted
    program continues it): rows and header are kept, keys released again replace their
    rows, new keys are appended. The file must begin with a header whose first column is
    ``key_fieldname`` (``ValueError`` otherwise). A last line without its line end is the
    remains of an interrupted write: it is dropped with a warning, as are all but the last
    row of a key found more than once, and the next release rewrites the file. Missing
    parent directories are created.

    Releases may overlap; their writes are made one at a time, in worker threads (the event
    loop is never blocked on the disk). When releases of one key overlap, the last call
    wins among those that succeed. A release that fails leaves the other rows as they were.
    ``aclose`` closes the file; a later release reads it again.
    """

    def __init__(self, file_path: str | os.PathLike[str], *, key_fieldname: str = "key") -> None:
        self._path = check_path("file_path", file_path)
        check_str("key_fieldname", key_fieldname, allow_empty=False)
        self._key_fieldname = key_fieldname
        self._lock: anyio.Lock | None = None
        self._calls = 0
        self._forget()

    @property
    def file_path(self) -> Path:
        """The CSV file written."""
        return self._path

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        self._calls += 1
        call = self._calls
        cells = self._cells(await materialize(value))
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if not self._loaded:
                await self._load()
            row = self._rows.get(key)
            if row is not None:
                if row.call > call:
                    return  # a later release of this key has been written
                if row.cells == cells and not self._must_rewrite:
                    row.call = call
                    return
            new_columns = [path for path in cells if path not in self._columns]
            if row is None and not new_columns and not self._must_rewrite:
                line = _line(_row_fields(key, cells, self._header)).encode()
                await self._write(append, self._file, line)
            else:
                header = self._header + new_columns
                self._file = await self._write(
                    replace_and_reopen, self._path, self._file, self._encoded, header, key, cells
                )
                self._header = header
                self._columns.update(new_columns)
                self._must_rewrite = False
            self._rows[key] = _Row(cells, call)

    async def aclose(self) -> None:
        if self._lock is None:
            return
        with anyio.CancelScope(shield=True):  # leaving `async with` on cancellation closes too
            async with self._lock:
                file = self._file
                self._forget()
                if file is not None:
                    await anyio.to_thread.run_sync(file.close)

    def _forget(self) -> None:
        """Drop what was read from the file, so that the next release reads it again."""
        self._loaded = False
        self._header: list[str] = []  # the value columns, after the key column
        self._columns: set[str] = set()
        self._rows: dict[ReleaseKey, _Row] = {}
        self._file: io.FileIO | None = None  # open for appending
        self._must_rewrite = False

    async def _load(self) -> None:
        header, rows, self._must_rewrite = await anyio.to_thread.run_sync(
            _read, self._path, self._key_fieldname
        )
        self._header = header
        self._columns = set(header)
        self._rows = {key: _Row(cells, 0) for key, cells in rows.items()}
        if not self._must_rewrite:
            self._file = await anyio.to_thread.run_sync(open_for_append, self._path)
        self._loaded = True

    async def _write(self, function: Callable[..., _T], *args: Any) -> _T:
        try:
            return await anyio.to_thread.run_sync(function, *args)
        except BaseException:
            # The file may hold part of this write; the rows in memory are what it should
            # hold, so the next release rewrites it from them.
            self._must_rewrite = True
            raise

    def _text(self, header: list[str], key: ReleaseKey, cells: dict[str, str]) -> str:
        """The whole file, with ``key``'s row holding ``cells``; run in a worker thread."""
        rows = (
            _row_fields(row_key, cells if row_key == key else row.cells, header)
            for row_key, row in self._rows.items()
        )
        if key not in self._rows:
            rows = (*rows, _row_fields(key, cells, header))
        return _lines([[self._key_fieldname, *header], *rows])

    def _encoded(self, header: list[str], key: ReleaseKey, cells: dict[str, str]) -> bytes:
        return self._text(header, key, cells).encode()

    def _cells(self, value: Any) -> dict[str, str]:
        flat = flatten(value)
        cells = {path: _cell(path, leaf) for path, leaf in flat}
        if len(cells) != len(flat):
            raise ValueError(
                f"two leaves of the released value have the path {_duplicate(flat)!r}, "
                "which a CSV column can hold only once"
            )
        if self._key_fieldname in cells:
            raise ValueError(
                f"the released value has a leaf at path {self._key_fieldname!r}, "
                "which is the key_fieldname column"
            )
        return {path: cell for path, cell in cells.items() if cell}


@dataclass(slots=True)
class _Row:
    cells: dict[str, str]  # path -> non-empty cell
    call: int  # the release call that wrote the row; 0 when read from the file


def _cell(path: str, leaf: Any) -> str:
    if isinstance(leaf, str):
        return str.__str__(leaf)
    if isinstance(leaf, bool):
        return repr(leaf)
    if isinstance(leaf, int):
        return repr(int(leaf))
    if isinstance(leaf, float):
        return repr(float(leaf))
    if leaf is None:
        return ""
    if hasattr(leaf, "__array__"):  # numpy scalars and arrays, tensors
        array = np.asarray(leaf)
        if array.ndim == 0 and array.dtype.kind in "biufU":
            return _cell(path, array.item())
        if array.ndim > 0:
            raise TypeError(
                f"a CSV cell holds one value, but the leaf at path {path!r} is an array "
                f"of shape {array.shape}"
            )
    raise TypeError(
        f"a CSV cell holds an int, float, bool or str, but the leaf at path {path!r} "
        f"is a {type(leaf).__name__}"
    )


def _duplicate(flat: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for path, _ in flat:
        if path in seen:
            return path
        seen.add(path)
    raise AssertionError("no path occurs twice")


def _key_cell(key: ReleaseKey) -> str:
    if isinstance(key, int):
        return str(int(key))
    if _INT_KEY.fullmatch(key) or key.startswith(_TEXT_MARK):
        return _TEXT_MARK + key
    return key


def _parse_key(cell: str) -> ReleaseKey:
    if cell.startswith(_TEXT_MARK):
        return cell[len(_TEXT_MARK) :]
    if _INT_KEY.fullmatch(cell):
        return int(cell)
    return cell


def _row_fields(key: ReleaseKey, cells: dict[str, str], header: list[str]) -> list[str]:
    return [_key_cell(key), *(cells.get(column, "") for column in header)]


def _lines(rows: Iterable[list[str]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def _line(fields: list[str]) -> str:
    return _lines([fields])


def _read(
    path: Path, key_fieldname: str
) -> tuple[list[str], dict[ReleaseKey, dict[str, str]], bool]:
    """``(header, rows, must_rewrite)`` of the file at ``path``; nothing if it is absent."""
    try:
        with open(path, encoding="utf-8", newline="") as file:
            text = file.read()
    except FileNotFoundError:
        return [], {}, True
    try:
        records = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as error:
        raise ValueError(f"{str(path)!r} cannot be read as CSV: {error}") from None
    must_rewrite = False
    if text and not text.endswith("\n"):
        if records:
            logger.warning("dropping the unfinished last line of %s: %r", path, records.pop())
        must_rewrite = True
    if not records:
        return [], {}, True
    columns = records[0]
    if not columns or columns[0] != key_fieldname:
        first = columns[0] if columns else ""
        raise ValueError(
            f"the first column of {str(path)!r} is {first!r}, not key_fieldname {key_fieldname!r}"
        )
    if len(set(columns)) != len(columns):
        raise ValueError(f"the header of {str(path)!r} names a column twice: {columns!r}")
    header = columns[1:]
    rows: dict[ReleaseKey, dict[str, str]] = {}
    for number, record in enumerate(records[1:], start=2):
        if not record:
            continue
        if len(record) > len(columns):
            raise ValueError(
                f"row {number} of {str(path)!r} has {len(record)} cells, more than the "
                f"{len(columns)} columns of its header"
            )
        key = _parse_key(record[0])
        if key in rows:
            logger.warning("%s holds key %r more than once; keeping its last row", path, key)
            must_rewrite = True
        # A short row (written by another program) has empty cells at its end.
        cells = zip(header, record[1:], strict=False)
        rows[key] = {column: cell for column, cell in cells if cell}
    return header, rows, must_rewrite
