"""Release managers across the TFF boundary, in both directions.

- :class:`ReleaseManagerFromTFF` makes a ``tff.program.ReleaseManager`` (TFF's memory, CSV,
  TensorBoard, SavedModel managers, or one of your own) a release manager of ours, to
  hand to :func:`programlogic.train_model`, to an ``EvaluationManager`` or to put in a
  :class:`~managers.GroupingReleaseManager`.
- :class:`ReleaseManagerForTFF` makes one of ours a ``tff.program.ReleaseManager``, to
  hand to TFF code such as ``tff.learning.programs.train_model``.

Values are converted on the way, so that each side receives the structures it knows:

- towards TFF (:func:`to_tff_structure`): value references of ours are awaited,
  dataclasses become dicts of their fields (TFF's structures know dicts, lists, tuples,
  NamedTuples and attrs classes, not dataclasses), tensors become NumPy arrays;
- from TFF (:func:`from_tff_structure`): ``tff.program`` value references are awaited,
  attrs instances become dicts of their fields (our structures know dicts, lists, tuples,
  NamedTuples and dataclasses, not attrs classes), ``tff.structure.Struct`` becomes a
  dict (named fields) or a list, tensors become NumPy arrays, NumPy integer keys become
  ``int``. Dicts, lists, tuples and NamedTuples keep their types on both sides.

TFF's release managers are asyncio code whose file sinks (CSV, TensorBoard, SavedModel)
write files synchronously inside ``release``. :class:`ReleaseManagerFromTFF` therefore runs
each TFF release on an asyncio event loop of its own in a worker thread, so the
program's event loop (asyncio or trio) never blocks on TFF's writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.to_thread
import attrs
import numpy as np
import tensorflow_federated as tff

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.structure import is_container, map_children
from managers.values import materialize

__all__ = [
    "ReleaseManagerForTFF",
    "ReleaseManagerFromTFF",
    "from_tff_structure",
    "to_tff_structure",
]

_PLAIN_LEAVES = (bool, int, float, complex, str, bytes, np.generic, np.ndarray, type(None))


class ReleaseManagerFromTFF(ReleaseManager):
    """A ``tff.program.ReleaseManager`` used as a release manager of ours.

    ``release(value, key)`` awaits the value references in ``value`` (ours and TFF's),
    converts the result with :func:`to_tff_structure`, then runs
    ``tff_manager.release(value, key)`` to its end on a private asyncio event loop in a
    worker thread; the calls of one instance run there one at a time.
    Errors of the TFF manager are raised to the caller unchanged. A cancelled release
    still finishes the TFF call it started (a file is never left half written), then
    raises the cancellation.

    Idempotent by key exactly as far as the TFF manager is: TFF's
    ``MemoryReleaseManager`` replaces a key's value; TFF's ``CSVFileReleaseManager``
    accepts only ``int`` keys and, when a key is released again, drops the rows from that
    key on (so releases must come in increasing key order, as training metrics do);
    TFF's ``LoggingReleaseManager`` logs every release. Concurrent calls are allowed
    and are handed to the TFF manager one at a time. Works under asyncio and trio.
    ``aclose`` does nothing: TFF's managers hold nothing open.
    """

    def __init__(self, tff_manager: tff.program.ReleaseManager) -> None:
        if not isinstance(tff_manager, tff.program.ReleaseManager):
            raise TypeError(
                "tff_manager must be a tff.program.ReleaseManager, "
                f"got {type(tff_manager).__name__} {tff_manager!r}"
            )
        self._tff_manager = tff_manager
        self._lock: anyio.Lock | None = None

    @property
    def tff_manager(self) -> tff.program.ReleaseManager:
        """The TFF release manager released to."""
        return self._tff_manager

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        if self._lock is None:  # made on first use, inside the program's event loop
            self._lock = anyio.Lock()
        async with self._lock:  # taken before the value is ready: the last call wins
            plain = to_tff_structure(await materialize(value))
            await anyio.to_thread.run_sync(_run_on_own_loop, self._tff_manager.release, plain, key)

    def __repr__(self) -> str:
        return f"ReleaseManagerFromTFF({self._tff_manager!r})"


class ReleaseManagerForTFF(tff.program.ReleaseManager):
    """A release manager of ours used as a ``tff.program.ReleaseManager``.

    Hand it to TFF program logic (``tff.learning.programs.train_model``'s
    ``train_metrics_manager`` or ``model_output_manager``, TFF's evaluation manager)
    to publish through our sinks: CSV rows replaced by key, TensorBoard without
    duplicated points after a resume, model files, grouping with every error raised.

    ``release(value, key)`` materializes the ``tff.program`` value references in
    ``value``, converts it with :func:`from_tff_structure` and awaits
    ``manager.release(value, key)``. ``key`` must be an ``int`` (NumPy integers are
    converted) or a ``str``, as our managers require; anything else raises
    ``TypeError``. Errors of our manager reach the TFF caller unchanged.
    """

    def __init__(self, manager: ReleaseManager) -> None:
        if not isinstance(manager, ReleaseManager):
            raise TypeError(
                "manager must be a programlogic ReleaseManager, "
                f"got {type(manager).__name__} {manager!r}"
            )
        self._manager = manager

    @property
    def manager(self) -> ReleaseManager:
        """Our release manager released to."""
        return self._manager

    async def release(self, value: Any, key: Any) -> None:
        """Release ``value`` under ``key`` to our manager."""
        if isinstance(key, np.integer):
            key = int(key)
        check_key(key)
        await self._manager.release(from_tff_structure(await _materialize_tff(value)), key)

    def __repr__(self) -> str:
        return f"ReleaseManagerForTFF({self._manager!r})"


def _run_on_own_loop(function: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
    """Run ``function(*args)`` to its end on a new asyncio event loop of this thread."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(function(*args))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _materialize_tff(value: Any) -> Any:
    """``value`` with its TFF and our value references awaited, attrs classes traversed."""
    return await materialize(from_tff_structure(value, keep_references=True))


def to_tff_structure(value: Any) -> Any:
    """A plain structure of ours as TFF's managers take it.

    Dataclasses become dicts of their fields; dicts, lists, tuples and NamedTuples keep
    their types; leaves with ``__array__`` that are not NumPy values (TensorFlow, JAX
    tensors) become NumPy arrays; other leaves are kept. ``value`` must hold no value
    reference (materialize it first).
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: to_tff_structure(getattr(value, field.name))
            for field in dataclasses.fields(value)
        }
    if is_container(value):
        return map_children(to_tff_structure, value)
    return _to_numpy(value)


def from_tff_structure(value: Any, *, keep_references: bool = False) -> Any:
    """A structure as TFF produces it, as a plain structure of ours.

    attrs instances become dicts of their fields; a ``tff.structure.Struct`` becomes a
    dict when all its fields are named and a list otherwise; dicts (``OrderedDict``
    included), lists, tuples and NamedTuples keep their types; tensors become NumPy
    arrays; other leaves are kept. A ``tff.program`` value reference is an error unless
    ``keep_references`` (materialize first, or use ``ReleaseManagerForTFF``).
    """
    if isinstance(value, tff.program.MaterializableValueReference):
        if keep_references:
            return value
        raise TypeError(
            "value holds a tff.program value reference; materialize it first "
            f"(found {type(value).__name__})"
        )
    if attrs.has(type(value)):
        return {
            field.name: from_tff_structure(
                getattr(value, field.name), keep_references=keep_references
            )
            for field in attrs.fields(type(value))
        }
    if isinstance(value, tff.structure.Struct):
        items = tff.structure.to_elements(value)
        if items and all(name is not None for name, _ in items):
            return {
                name: from_tff_structure(item, keep_references=keep_references)
                for name, item in items
            }
        return [from_tff_structure(item, keep_references=keep_references) for _, item in items]
    if is_container(value):
        return map_children(
            lambda child: from_tff_structure(child, keep_references=keep_references), value
        )
    return _to_numpy(value)


def _to_numpy(leaf: Any) -> Any:
    if isinstance(leaf, _PLAIN_LEAVES):
        return leaf
    numpy = getattr(leaf, "numpy", None)
    if callable(numpy):  # an eager TensorFlow tensor
        return numpy()
    if hasattr(leaf, "__array__"):
        return np.asarray(leaf)
    return leaf
