"""The abstract program-state manager: the contract every checkpoint store fulfils."""

from __future__ import annotations

import abc
from typing import Any

from managers.closing import AsyncClosing
from managers.exceptions import VersionError, VersionExistsError

__all__ = ["ProgramStateManager", "check_version"]


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
      Retention (which old versions an implementation deletes) never deletes the version
      just written.
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
    - Calls are made one at a time by a program; an implementation need not support
      concurrent calls on one instance unless it says so.

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
