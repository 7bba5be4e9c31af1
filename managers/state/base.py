"""The abstract program-state manager: the contract every checkpoint store fulfils."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

from managers.closing import AsyncClosing
from managers.exceptions import VersionError, VersionExistsError
from managers.validation import check_bool, check_int

__all__ = ["ProgramStateManager", "Retention", "check_version"]


@dataclasses.dataclass(frozen=True)
class Retention:
    """Which versions a program-state manager keeps: its retention policy, declared.

    After each save the manager keeps the newest ``keep_total`` versions, plus the
    first (lowest) one when ``keep_first``, plus every version divisible by
    ``keep_every`` when it is given, and deletes the others. The version just saved is
    always kept. :meth:`keeps` says which versions that leaves; a manager declares its
    policy as :attr:`ProgramStateManager.retention`, and the contract suite expects the
    versions it lists to be exactly those. A manager that keeps every version declares
    no retention (``None``).

    Example: ``Retention(keep_total=3, keep_first=True)`` after saving versions 0 to 9
    keeps ``[0, 7, 8, 9]``.
    """

    keep_total: int
    """How many of the newest versions are kept; at least 1."""
    keep_first: bool = False
    """Whether the first (lowest) version is kept too, whatever ``keep_total`` says."""
    keep_every: int | None = None
    """Versions divisible by this are kept too (``None``: none is kept for that)."""

    def __post_init__(self) -> None:
        check_int("keep_total", self.keep_total, minimum=1)
        check_bool("keep_first", self.keep_first)
        check_int("keep_every", self.keep_every, minimum=1, allow_none=True)

    def keeps(self, versions: Sequence[int]) -> list[int]:
        """The versions of ``versions`` kept by this policy, ascending.

        ``versions`` are the versions stored right after a save, ascending: the last one
        is the version just saved. A pure function: it looks at nothing else.
        """
        ordered = sorted(versions)
        kept = set(ordered[-self.keep_total :])
        if self.keep_first and ordered:
            kept.add(ordered[0])
        if self.keep_every is not None:
            kept.update(version for version in ordered if version % self.keep_every == 0)
        return [version for version in ordered if version in kept]


class ProgramStateManager(AsyncClosing, abc.ABC):
    """Saves and loads versions of a program's state: the checkpoints of a training run.

    A program saves its state after every round (``version`` = round number) and, when
    it starts, resumes from :meth:`load_latest`. An implementation decides where the
    versions live (memory, files) and which to keep.

    Contract for every implementation:

    - ``save(state, version)``: ``version`` is an ``int`` >= 0 (not ``bool``). Versions
      strictly increase: saving a version that exists raises
      :class:`~managers.exceptions.VersionExistsError`; one lower than the newest raises
      :class:`~managers.exceptions.VersionError`. When ``save`` returns, the version is
      durable in the manager's sense (in memory for the memory manager, on disk for the
      file manager). A save that raises or is cancelled leaves the versions saved before
      it intact and loadable; it never leaves a partial version that ``load`` returns.
      The saved value is a snapshot: mutating ``state`` afterwards does not change it.
      Retention (which old versions an implementation deletes after a save) is declared
      by :attr:`retention` and never deletes the version just written.
    - ``load(version, structure=None)`` returns the state saved under ``version``, or
      raises :class:`~managers.exceptions.VersionNotFoundError`. With ``structure``, a
      template of the state (e.g. the initial state of a learning process), the loaded
      value has the template's container types; a ``None`` in the template leaves that
      subtree as stored.
    - ``load_latest(structure=None)`` returns ``(state, version)`` of the newest loadable
      version, or ``(None, 0)`` when none is saved. An implementation that detects
      damaged versions (a checksum, as the file manager's) skips them for the newest
      version that loads, so that the resumed program can save them again; when versions
      are saved but none loads, it raises
      :class:`~managers.exceptions.AllVersionsDamagedError` listing them (again on every
      call), never ``(None, 0)``, unless it offers to be told to start fresh.
    - ``get_versions()`` lists the saved versions in ascending order (``[]`` when none).
    - ``remove(version)`` deletes one version (``VersionNotFoundError`` when missing);
      ``remove_all()`` deletes every version.
    - ``retention``: the policy by which ``save`` deletes old versions, a
      :class:`Retention`, or ``None`` (the default) when every version is kept until
      ``remove``. After a save, ``get_versions()`` lists exactly the versions the policy
      keeps of those stored before the save and the one saved. A manager wrapping
      another declares the retention of the one it wraps.
    - Calls are made one at a time by a program; an implementation need not support
      concurrent calls on one instance unless it says so.

    The event loop and cancellation, for every call:

    - A call never blocks the event loop: blocking I/O and CPU-heavy work (encoding,
      writing, fsync) run in worker threads, so that the program's other tasks (an
      evaluation, releases, a deadline) go on while a save is in flight.
    - A cancelled call returns promptly, within a short grace (the contract suite
      allows half a second), and leaves all of its effect or none: a cancelled save
      has saved its version completely (and applied retention) or not at all, and
      nothing it started changes the versions after it returned. It may finish work
      already under way in a thread before returning; it never shields itself from
      cancellation to go on with a long call.

    Optional, for speed: ``async prepare_save(state, version)`` returns the write of a
    ``save`` as a :class:`~managers.writes.PreparedWrite`, not made (checks may run
    when it is made), so that a caller makes several managers' writes in one
    worker-thread call (:class:`~managers.writes.WriteBatch`; ``train_model`` does). The
    version is saved only once the write is made; a dropped write never saves it. A
    caller uses ``prepare_save`` only where the class that defines it also defines (or
    inherits below it) ``save`` (:func:`~managers.writes.preparer`): a subclass that
    overrides ``save`` alone is always called through it.

    Subclasses need not call ``__init__`` of this class. ``aclose`` and the async
    context manager protocol have no-op defaults; an implementation that holds
    resources (a lock, open files) releases them in ``aclose``.

    The reference implementation is
    :class:`~managers.state.memory.MemoryProgramStateManager`. Example::

        manager = MemoryProgramStateManager(keep_total=3)
        await manager.save({"weights": [0.0, 1.0]}, 0)
        state, version = await manager.load_latest()
    """

    @abc.abstractmethod
    async def save(self, state: Any, version: int) -> None:
        """Save ``state`` as ``version``; see the class docstring for the rules."""

    @abc.abstractmethod
    async def load(self, version: int, structure: Any = None) -> Any:
        """The state saved as ``version``, shaped like ``structure`` when given."""

    @abc.abstractmethod
    async def get_versions(self) -> list[int]:
        """The saved versions in ascending order."""

    @abc.abstractmethod
    async def remove(self, version: int) -> None:
        """Delete the state saved as ``version``."""

    async def load_latest(self, structure: Any = None) -> tuple[Any, int]:
        """``(state, version)`` of the newest saved version, or ``(None, 0)``."""
        versions = await self.get_versions()
        if not versions:
            return None, 0
        return await self.load(versions[-1], structure), versions[-1]

    async def remove_all(self) -> None:
        """Delete every saved version."""
        for version in await self.get_versions():
            await self.remove(version)

    @property
    def retention(self) -> Retention | None:
        """Which versions ``save`` keeps; ``None`` (the default): every version."""
        return None

    async def aclose(self) -> None:
        """Release what the manager holds; the default holds nothing."""


def check_version(version: object, *, newest: int | None, exists: bool) -> int:
    """``version`` if it may be saved after ``newest``; raises VersionError otherwise.

    ``exists`` tells whether ``version`` is already saved. Implementations call this at
    the start of ``save`` so that every manager rejects the same versions alike.
    """
    if not isinstance(version, int) or isinstance(version, bool):
        raise VersionError(f"version must be an int, got {type(version).__name__} {version!r}")
    if version < 0:
        raise VersionError(f"version must be >= 0, got {version}")
    if exists:
        raise VersionExistsError(f"version {version} is already saved")
    if newest is not None and version < newest:
        raise VersionError(
            f"version {version} is lower than the newest saved version {newest}; "
            "versions must strictly increase"
        )
    return version
