"""Released values as the rows of a CSV file: a row per key, a column per structure path."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from managers.release._keyed_file import RecordFormat, _KeyedFileReleaseManager
from managers.release.base import ReleaseKey
from managers.structure import flatten
from managers.validation import check_str

__all__ = ["CSVFileReleaseManager"]

logger = logging.getLogger(__name__)

_INT_KEY = re.compile(r"0|-?[1-9][0-9]*")
_TEXT_MARK = "'"


class CSVFileReleaseManager(_KeyedFileReleaseManager):
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
    loop is never blocked on the disk). When ``release`` returns, its row is written.
    :meth:`prepare_release` offers the same write, not made, for a
    :class:`~managers.writes.WriteBatch`; a prepared write that is never made (one
    before it failed, its batch was dropped) leaves its row in memory, and the next
    release rewrites the file with it. When releases of one key overlap, the last call
    wins among those that succeed. A release that fails leaves the other rows as they were.
    ``aclose`` closes the file; a later release reads it again.
    """

    def __init__(self, file_path: str | os.PathLike[str], *, key_fieldname: str = "key") -> None:
        check_str("key_fieldname", key_fieldname, allow_empty=False)
        super().__init__(file_path, _CSVFormat(key_fieldname))


_Header = dict[str, None]  # the value columns after the key column, in order
_Cells = dict[str, str]  # path -> non-empty cell


class _CSVFormat(RecordFormat[_Header, _Cells]):
    """A row per key: the key's cell, then a cell per column of the header."""

    def __init__(self, key_fieldname: str) -> None:
        self._key_fieldname = key_fieldname

    def encode(self, key: ReleaseKey, value: Any) -> _Cells:
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

    def read(self, path: Path) -> tuple[_Header, dict[ReleaseKey, _Cells], bool]:
        header, rows, must_rewrite = _read(path, self._key_fieldname)
        return dict.fromkeys(header), rows, must_rewrite

    def widen(self, layout: _Header, record: _Cells) -> _Header:
        new_columns = [path for path in record if path not in layout]
        if not new_columns:
            return layout
        return {**layout, **dict.fromkeys(new_columns)}

    def line(self, layout: _Header, key: ReleaseKey, record: _Cells) -> bytes:
        return _lines([_row_fields(key, record, layout)]).encode()

    def render(self, layout: _Header, records: list[tuple[ReleaseKey, _Cells]]) -> bytes:
        rows = (_row_fields(key, cells, layout) for key, cells in records)
        return _lines([[self._key_fieldname, *layout], *rows]).encode()


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


def _row_fields(key: ReleaseKey, cells: _Cells, header: Iterable[str]) -> list[str]:
    return [_key_cell(key), *(cells.get(column, "") for column in header)]


def _lines(rows: Iterable[list[str]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


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
