"""Metrics released to TensorBoard event files, written without TensorFlow."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import crc32c
import numpy as np

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.structure import flatten
from managers.validation import check_path
from managers.values import materialize
from managers.writes import PreparedWrite, WriteQueue

__all__ = ["TensorBoardReleaseManager"]

logger = logging.getLogger(__name__)

_MIN_STEP, _MAX_STEP = -(2**63), 2**63 - 1  # Event.step is an int64
_ROOT_TAG = "value"
_FILE_VERSION = "brain.Event:2"
_HISTOGRAM_BUCKETS = 30  # the bucket count of TensorFlow 2's own histogram summaries
# TensorBoard's rule for tag names (the one tensorboardX applies too).
_INVALID_TAG_CHARACTERS = re.compile(r"[^-/\w.]")


class TensorBoardReleaseManager(ReleaseManager):
    """Writes released metrics as TensorBoard scalars and histograms.

    What it writes: each manager writes one event file in ``summary_dir`` (created if
    missing), named ``events.out.tfevents.{seconds}.{hostname}.{nanoseconds}.{pid}``, so
    that every manager gets a file of its own and files sort in the order they were
    started, which is the order TensorBoard reads them in.
    Events are built with tensorboardX's protocol buffers, so TensorFlow is neither needed
    nor imported; ``tensorboard --logdir`` on ``summary_dir`` (or a parent of it) shows
    them as a run. Every release is one event at step ``key``, handed to the operating
    system before ``release`` returns, so it survives a crash of the program; the file is
    fsynced when the manager is closed (like CSV appends, a power cut may lose the last
    points, never corrupt earlier ones: each record carries its own checksums). Give each
    stream (training metrics, evaluation metrics) a directory of its own: the purge below
    applies to the whole directory.

    Keys must be ``int`` (TensorBoard steps, int64); a ``str`` key raises ``TypeError``.
    Leaves of the released structure (see :mod:`managers.structure`) become:

    - a scalar (stored as float32, TensorBoard's ``simple_value``) for Python ``int`` and
      ``float``, numpy scalars, and arrays of exactly one element;
    - a histogram for real-valued arrays of more than one element, over their finite
      values in 30 equal buckets (values that are NaN or infinite are left out; an array
      without a finite value writes no histogram);
    - nothing for ``str``, ``bytes``, ``None``, ``bool`` and boolean or text arrays, and
      for arrays with no element: TensorBoard plots numbers, and the same structure may be
      released to other sinks that keep such leaves. Skipped paths are logged at DEBUG,
      once per path;
    - a ``TypeError`` naming the path for anything else (complex numbers, object arrays,
      arbitrary objects), raised before anything of that release is written.

    Objects with ``__array__`` (TensorFlow and JAX tensors) are converted with numpy first.
    A leaf's tag is its path (``client_work/train/loss``), with characters TensorBoard does
    not allow in tags (anything but letters, digits, ``_``, ``-``, ``.``, ``/``) replaced
    by ``_``; a release whose value is itself a leaf uses the tag ``value``. Two leaves of
    one release that end up with the same tag raise ``ValueError``.

    Restarts: the first release a manager writes (the first call whose key, value
    references and leaves are valid) opens its file with TensorBoard's restart marker (a
    ``SessionLog.START`` event at step ``key``, the mechanism of tensorboardX's
    ``SummaryWriter(purge_step=key)``), so TensorBoard hides every point at a step
    ``>= key`` written before, in any tag. A program resumed at round ``k`` releases ``k``
    first, so its metrics show each round once. TensorBoard's data server (the default
    reader of recent TensorBoard) ignores that marker but drops, in each tag, earlier
    points at steps ``>=`` a newly read one, which hides the stale points of every tag the
    resumed program writes again.

    Idempotency by key holds for streams whose keys increase, such as training metrics.
    Within one manager's lifetime a key released again or out of order is not replaced:
    TensorBoard's Python reader (``--load_fast=false``, ``EventAccumulator``) shows both
    points, while the data server keeps the new point and hides that tag's points at
    higher steps until they are written again.

    Releases are written one at a time, in the order ``release`` was called (value
    references are materialized in that order too). All writing, including opening and
    closing the file and computing histograms, runs in a worker thread. A cancelled
    release either wrote all its points or none of them. When ``release`` returns, its
    points are written. :meth:`prepare_release` offers the same write, not made, for a
    :class:`~managers.writes.WriteBatch`, whose ``flush`` writes it and raises its errors
    (those above included); a prepared release that is never written (a write before it
    failed, its batch was dropped) is lost to the file. ``aclose`` (or ``async with``)
    closes the file; a release after it raises ``RuntimeError``.

    Needs the ``tensorboard`` extra (tensorboardX): ``pip install 'programlogic[tensorboard]'``.
    """

    def __init__(self, summary_dir: str | os.PathLike[str]) -> None:
        if importlib.util.find_spec("tensorboardX") is None:
            raise ImportError(
                "TensorBoardReleaseManager needs tensorboardX, which is missing; "
                "install it with pip install 'programlogic[tensorboard]'"
            )
        self._dir = check_path("summary_dir", summary_dir)
        self._lock: anyio.Lock | None = None
        self._file = _EventFile(self._dir)
        self._writes = WriteQueue()
        self._closed = False

    @property
    def summary_dir(self) -> Path:
        """The directory the event file is written to."""
        return self._dir

    async def release(self, value: Any, key: ReleaseKey) -> None:
        """Write the numeric leaves of ``value`` at step ``key``; see the class docstring.

        Raises:
            TypeError: ``key`` is not an int, or a leaf cannot be written to TensorBoard.
            ValueError: ``key`` is out of the int64 range, or two leaves share a tag.
            RuntimeError: the manager was closed.
        """
        step = _check_step(key)
        if self._lock is None:
            self._lock = anyio.Lock(fast_acquire=True)
        async with self._lock:  # call order is write order; the first call sets the purge
            self._check_open()
            plain = await materialize(value)
            await self._writes.submit(self._file.write, step, plain)

    async def prepare_release(self, value: Any, key: ReleaseKey) -> PreparedWrite:
        """The write of :meth:`release`, not made: the key is checked and the value
        materialized now; a :class:`~managers.writes.WriteBatch` writes the points (or
        raises what :meth:`release` would raise for its leaves)."""
        step = _check_step(key)
        if self._lock is None:
            self._lock = anyio.Lock(fast_acquire=True)
        async with self._lock:
            self._check_open()
            plain = await materialize(value)
            return self._writes.prepare(self._file.write, step, plain)

    async def aclose(self) -> None:
        """Close the event file; later releases raise ``RuntimeError``."""
        if self._lock is None:
            self._lock = anyio.Lock(fast_acquire=True)
        with anyio.CancelScope(shield=True):  # leaving `async with` on cancellation closes too
            async with self._lock:
                if self._closed:
                    return
                self._closed = True
                await self._writes.run(self._file.close)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the TensorBoardReleaseManager of {self._dir} is closed")


def _check_step(key: object) -> int:
    check_key(key)
    if isinstance(key, str):
        raise TypeError(
            f"TensorBoard steps are ints, so a TensorBoardReleaseManager key must be an int, "
            f"got str {key!r}"
        )
    if not _MIN_STEP <= key <= _MAX_STEP:
        raise ValueError(f"TensorBoard steps are int64, got key {key}")
    return key


class _EventFile:
    """The event file of one manager, opened at its first write; used from worker threads."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._writer: _RecordFile | None = None
        self._skipped: set[str] = set()

    def write(self, step: int, value: Any) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        points = self._points(value)  # raises before anything of this release is written
        if self._writer is None:
            self._writer = _open(self._directory, step)
        if points:
            event = Event(step=step, wall_time=time.time(), summary=Summary(value=points))
            self._writer.write(event.SerializeToString())
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _points(self, value: Any) -> list[Any]:
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import make_histogram

        points = []
        paths_by_tag: dict[str, str] = {}
        for path, leaf in flatten(value):
            numbers = _numbers(path, leaf)
            if isinstance(numbers, np.ndarray):
                numbers = numbers[np.isfinite(numbers)]
                if numbers.size == 0:
                    numbers = None
            if numbers is None:
                self._skip(path, leaf)
                continue
            tag = _INVALID_TAG_CHARACTERS.sub("_", path).lstrip("/") or _ROOT_TAG
            if tag in paths_by_tag:
                raise ValueError(
                    f"the leaves at {paths_by_tag[tag]!r} and {path!r} would share the "
                    f"TensorBoard tag {tag!r}"
                )
            paths_by_tag[tag] = path
            if isinstance(numbers, float):
                points.append(Summary.Value(tag=tag, simple_value=numbers))
            else:
                with np.errstate(over="ignore"):  # a sum of squares may overflow to inf
                    histogram = make_histogram(numbers, _HISTOGRAM_BUCKETS)
                points.append(Summary.Value(tag=tag, histo=histogram))
        return points

    def _skip(self, path: str, leaf: Any) -> None:
        if path not in self._skipped:
            self._skipped.add(path)
            logger.debug("not writing the %s leaf at %r to TensorBoard", type(leaf).__name__, path)


def _numbers(path: str, leaf: Any) -> float | np.ndarray | None:
    """``leaf`` as a scalar, as a flat float64 array for a histogram, or ``None`` to skip it."""
    if leaf is None or isinstance(leaf, str | bytes | bool):
        return None
    if isinstance(leaf, int | float):
        try:
            return float(leaf)
        except OverflowError:
            raise ValueError(f"the int at {path!r} is too large for a TensorBoard scalar") from None
    if not isinstance(leaf, np.ndarray | np.generic) and not hasattr(leaf, "__array__"):
        raise TypeError(
            f"cannot write the {type(leaf).__name__} leaf at {path!r} to TensorBoard; "
            f"it needs numbers"
        )
    array = np.asarray(leaf)
    if array.dtype.kind in "bUS":
        return None
    if array.dtype.kind not in "iuf":
        raise TypeError(
            f"cannot write the leaf at {path!r} to TensorBoard: its dtype {array.dtype} "
            f"is not a real number type"
        )
    if array.size == 1:
        return float(array.reshape(()))
    if array.size == 0:
        return None
    return array.astype(np.float64).reshape(-1)


def _open(directory: Path, step: int) -> _RecordFile:
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    directory.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{_file_suffix()}"
    records = _RecordFile(directory / name)
    now = time.time()
    records.write(Event(wall_time=now, file_version=_FILE_VERSION).SerializeToString())
    restart = SessionLog(status=SessionLog.START)
    records.write(Event(step=step, wall_time=now, session_log=restart).SerializeToString())
    logger.info(
        "writing TensorBoard events to %s; points written there before at steps >= %d are purged",
        directory,
        step,
    )
    return records


class _RecordFile:
    """An append-only file of TFRecord records, the framing TensorBoard event files use.

    A record is its length (uint64), the masked CRC32C of those 8 bytes, the data, and
    the masked CRC32C of the data, integers little-endian.
    """

    def __init__(self, path: Path) -> None:
        self._file = open(path, "xb")

    def write(self, data: bytes) -> None:
        length = struct.pack("<Q", len(data))
        self._file.write(
            b"".join(
                (
                    length,
                    struct.pack("<I", _masked_crc(length)),
                    data,
                    struct.pack("<I", _masked_crc(data)),
                )
            )
        )

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C: rotated right by 15 bits plus a constant, modulo 2**32."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_suffix_lock = threading.Lock()
_last_stamp = 0


def _file_suffix() -> str:
    """A file-name suffix that makes each event file unique and sort in creation order.

    tensorboardX names files by the second and opens them for writing from scratch, so two
    managers started within a second would otherwise share, and overwrite, one file.
    """
    global _last_stamp
    with _suffix_lock:
        _last_stamp = max(time.time_ns(), _last_stamp + 1)
        return f".{_last_stamp}.{os.getpid()}"
