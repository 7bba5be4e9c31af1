"""Released values as the lines of a JSON lines file: a JSON object per key."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from managers.release._keyed_file import RecordFormat, _KeyedFileReleaseManager
from managers.release.base import ReleaseKey
from managers.structure import flatten

__all__ = ["JSONLinesReleaseManager"]

logger = logging.getLogger(__name__)

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


class JSONLinesReleaseManager(_KeyedFileReleaseManager):
    """Writes released values to a JSON lines file, one line per key.

    A program that releases ``{"train": {"loss": 0.5}, "weights": np.array([1.0, 2.0])}``
    for round 1 and ``"done"`` under ``"status"`` gets this file (UTF-8, compact JSON, each
    line ending in ``\\n``)::

        {"key":1,"value":{"train":{"loss":0.5},"weights":[1.0,2.0]}}
        {"key":"status","value":"done"}

    - Each line is an object with ``"key"`` (a JSON number for an int key, a string for a
      str key, so the two never mix up) and ``"value"``, the released structure with its
      nesting kept: dicts (in their order) and dataclasses as objects, lists, tuples and
      NamedTuples as arrays (as :mod:`managers.structure` names their leaves by position).
    - Leaves are written by orjson: numbers, str, bool and ``None`` as JSON; numpy scalars
      as numbers (float32 in the shortest form that reads back as the same float32);
      numpy arrays, and anything with ``__array__``, as nested arrays. NaN and infinities
      become ``null``, since JSON has no such numbers. Ints beyond 64 bits, bytes, complex
      numbers and other objects raise ``TypeError`` naming the path; nothing is written.
    - Lines are in the order keys were first released; releasing a key again replaces
      its line in place.

    Writes cost what they must: a new key is appended in one write (the file is not read
    or rewritten); releasing a key again with an unchanged line writes nothing; a changed
    line rewrites the file atomically (a temporary file in the same directory, fsynced,
    renamed over the file, directory fsynced), so a crash leaves the old file or the new
    one. Appends are not fsynced: they reach the operating system before ``release``
    returns, which survives a crash of the program but not necessarily of the machine.

    On its first release the manager reads the file if it exists (this is how a restarted
    program continues it): its lines are kept, keys released again replace their lines,
    new keys are appended. A line that is not such an object raises ``ValueError`` naming
    it, except an unfinished last line (the remains of an interrupted write), which is
    dropped with a warning; a key found more than once keeps its last line. Either way the
    next release rewrites the file. Missing parent directories are created.

    Releases may overlap; their writes are made one at a time, in worker threads (the event
    loop is never blocked on the disk). When releases of one key overlap, the last call
    wins among those that succeed. A release that fails leaves the other lines as they
    were. When ``release`` returns, its line is written; :meth:`prepare_release` offers
    the write for a :class:`~managers.writes.WriteBatch`, as
    :class:`~managers.CSVFileReleaseManager`'s does.
    ``aclose`` closes the file; a later release reads it again.
    """

    def __init__(self, file_path: str | os.PathLike[str]) -> None:
        super().__init__(file_path, _JSONLinesFormat())


class _JSONLinesFormat(RecordFormat[None, bytes]):
    """A line per key, without its line end; the lines share no layout."""

    def encode(self, key: ReleaseKey, value: Any) -> bytes:
        try:
            return orjson.dumps({"key": key, "value": value}, option=_OPTIONS, default=_default)
        except TypeError as error:
            for path, leaf in flatten(value):
                try:
                    orjson.dumps(leaf, option=_OPTIONS, default=_default)
                except TypeError:
                    raise TypeError(
                        f"the leaf at path {path!r}, a {type(leaf).__name__}, cannot be "
                        f"written as JSON: {error}"
                    ) from error
            raise

    def read(self, path: Path) -> tuple[None, dict[ReleaseKey, bytes], bool]:
        return None, *_read(path)

    def widen(self, layout: None, record: bytes) -> None:
        return layout

    def line(self, layout: None, key: ReleaseKey, record: bytes) -> bytes:
        return record + b"\n"

    def render(self, layout: None, records: list[tuple[ReleaseKey, bytes]]) -> bytes:
        return b"\n".join([*(line for _, line in records), b""])


def _default(value: Any) -> Any:
    """What orjson writes for a value it does not know."""
    if isinstance(value, tuple):  # NamedTuples
        return list(value)
    if isinstance(value, np.ndarray):  # 0-d, strided, or of a dtype orjson does not take
        return value.tolist()
    if hasattr(value, "__array__"):
        return np.asarray(value)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _read(path: Path) -> tuple[dict[ReleaseKey, bytes], bool]:
    """``(lines by key, must_rewrite)`` of the file at ``path``; nothing if it is absent."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return {}, True  # the first write creates it, with its directory
    lines = data.split(b"\n")
    tail = lines.pop()  # empty when the file ends with a line end
    must_rewrite = False
    if tail:
        must_rewrite = True
        try:
            orjson.loads(tail)
        except orjson.JSONDecodeError:
            logger.warning("dropping the unfinished last line of %s: %r", path, tail)
        else:
            lines.append(tail)
    found: dict[ReleaseKey, bytes] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        key = _key_of(line, number, path)
        if key in found:
            logger.warning("%s holds key %r more than once; keeping its last line", path, key)
            must_rewrite = True
        found[key] = line
    return found, must_rewrite


def _key_of(line: bytes, number: int, path: Path) -> ReleaseKey:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise ValueError(f"line {number} of {str(path)!r} is not JSON: {error}") from None
    key = record.get("key") if isinstance(record, dict) else None
    if (
        not isinstance(record, dict)
        or "value" not in record
        or isinstance(key, bool)
        or not isinstance(key, int | str)
    ):
        raise ValueError(
            f'line {number} of {str(path)!r} is not an object with "key" (an int or a str) '
            f'and "value": {line[:80]!r}'
        )
    return key
