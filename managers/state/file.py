"""Program state kept in files, a file per version, durable across crashes.

On disk, in ``root_dir``::

    program_state_12.plstate             version 12 (``{prefix}{version}.plstate``) in
                                         the codec of managers.serialization
    .program_state_13.plstate.tmp-1f2e   a save in progress, or cut short by a crash
    .retired_program_state_7.plstate.tmp-9a0b   a version retention deleted, kept (at
                                         most two) for a later save to overwrite
    program_state_9.plstate.unreadable   a damaged version that load_latest moved aside
    .plstate.lock                        locked (flock) by the managers using the directory

A save writes its payload to a temporary file in the same directory (a new one, or a
spare), fsyncs it, renames it to its version's name (``os.replace``, atomic) and fsyncs
the directory; only then does retention retire old versions. A crash at any instant,
a killed process or a power cut, therefore leaves each version either complete or
absent, and the version just written never depends on an older one. Opening removes
temporary files; a save that fails (full disk) removes its own and the spares first.

Whatever else is found at a version's name is damage that :meth:`load_latest` skips:
bytes that do not decode (a checksum mismatch, a size other than the header's, a tree
beyond the codec's limits) and anything that is not a regular file (a FIFO, a device, a
socket, a directory, a dangling or looping symbolic link), which is never read from nor
waited on. A symbolic link to a regular file is followed. A version written by a newer
codec is not damage: loading it raises
:class:`~managers.exceptions.NewerFormatError` and leaves it in place.

Hard links: a backup made with hard links (``cp -al``, ``rsync --link-dest``) shares the
version files with the directory. The manager never writes into a file that has another
name: a retired version or a spare with more than one link is unlinked (its other names
keep it as it was), and the save writes a new file. A version file that is also another
version's (``ln program_state_2.plstate program_state_5.plstate``) holds one state under
two versions: loading either raises :class:`~managers.exceptions.ManagerError` naming
both files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from managers.exceptions import (
    NewerFormatError,
    StateDirectoryLockedError,
    VersionNotFoundError,
)
from managers.files import fsync_directory
from managers.serialization import SerializationError, dumps_buffers, loads
from managers.state._file_format import (
    all_damaged_error,
    hard_linked_error,
    hard_linked_version,
    is_single_file_or_missing,
    read_version_file,
    set_aside,
    write_all,
)
from managers.state._file_lock import is_writable, lock_directory, read_only_error
from managers.state.base import ProgramStateManager, Retention, check_version
from managers.validation import check_bool, check_choice, check_int, check_path, check_str
from managers.writes import PreparedWrite, WriteQueue

__all__ = ["FileProgramStateManager"]

logger = logging.getLogger(__name__)

_SUFFIX = ".plstate"
_TEMPORARY_MARK = f"{_SUFFIX}.tmp-"
_MAX_SPARES = 2  # a save takes one and retires one; the newest is not yet durable

_T = TypeVar("_T")


class FileProgramStateManager(ProgramStateManager):
    """Saves each version of a program's state to its own file in ``root_dir``.

    Arguments:
        root_dir: the directory of the versions; created when first used.
        prefix: the start of every version's file name, ``{prefix}{version}.plstate``.
        keep_total: after each save, keep the newest ``keep_total`` versions (``None``
            keeps every version) ...
        keep_first: ... plus the first (lowest) version ...
        keep_every: ... plus every version divisible by ``keep_every``. The version just
            saved is always kept.
        on_all_damaged: what :meth:`load_latest` does when versions are saved but none
            loads: ``"raise"`` :class:`~managers.exceptions.AllVersionsDamagedError`
            listing them, leaving them in place, so that a program never silently starts
            over on top of a damaged run; or ``"start_fresh"``: move them aside, log a
            warning for each and return ``(None, 0)``.

    The directory is opened on the first call, off the event loop: the manager creates
    it, resolves its path (symbolic links followed, made absolute), takes an exclusive
    lock on it (a second manager on the same directory, in this process or another,
    raises :class:`StateDirectoryLockedError`) and removes the temporary files an
    interrupted save left. Every call until :meth:`aclose` works in that resolved
    directory, whose lock it holds: repointing a symbolic link on ``root_dir`` (or
    changing the working directory, for a relative one) does not move an open manager
    into another directory. :meth:`aclose` releases the lock; a call after it opens the
    directory again, resolving ``root_dir`` anew.

    A directory this process cannot write (its mode, a read-only mount) is opened
    read-only: the manager takes a shared lock on its lock file when there is one
    (read-only managers share the directory; a writing one is excluded, and excludes
    them) and no lock when there is none. It loads and lists versions; ``load_latest``
    skips damaged ones without moving them; ``save`` and ``remove`` raise
    ``PermissionError`` naming the directory.

    Saving is crash-safe (see the module docstring). The lossless codec of
    :mod:`managers.serialization` stores the state, with a checksum that ``load``
    verifies: loading a damaged version raises
    :class:`~managers.serialization.SerializationError` naming the file, and
    :meth:`load_latest` skips damaged versions for the newest one that loads, logs a
    warning naming each and renames it to ``{name}.unreadable`` (kept, no longer
    listed), so the resumed program can save that version again. A version written by
    a newer codec is not damaged: ``load`` and ``load_latest`` raise
    :class:`~managers.exceptions.NewerFormatError` naming the file and leave it in
    place. A version file hard-linked to another version's (one file, two versions)
    makes them raise :class:`~managers.exceptions.ManagerError` naming both; retention
    never writes into a file with another name, such as a backup's hard link.

    Each call runs in one worker thread (encode, write, fsync, rename, directory fsync
    and retention for a save); calls on one instance are serialized. A cancelled call
    whose thread has started waits for it to finish before the cancellation is raised:
    a cancelled save has then either saved its version completely or, when it was
    cancelled before its thread started, not at all. When :meth:`save` returns, the
    version is on disk, whoever calls it. :meth:`prepare_save` offers the same write
    for a :class:`~managers.writes.WriteBatch`, which makes it together with other
    managers' writes in one worker-thread call. Do not mutate the state while its save
    is in flight: its arrays are written from the thread, without a copy.

    Example::

        async with FileProgramStateManager("/checkpoints/run1", keep_total=3) as manager:
            state, version = await manager.load_latest(initial_state)
            if state is None:
                state = initial_state
            ...
            await manager.save(state, version + 1)
    """

    def __init__(
        self,
        root_dir: str | os.PathLike[str],
        *,
        prefix: str = "program_state_",
        keep_total: int | None = 5,
        keep_first: bool = True,
        keep_every: int | None = None,
        on_all_damaged: Literal["raise", "start_fresh"] = "raise",
    ) -> None:
        root = check_path("root_dir", root_dir)
        check_str("prefix", prefix)
        if prefix.startswith(".") or any(char in prefix for char in ("/", os.sep, "\0")):
            raise ValueError(
                f"prefix must be a plain file-name start (no '/', not starting with '.'), "
                f"got {prefix!r}"
            )
        check_int("keep_total", keep_total, minimum=1, allow_none=True)
        check_bool("keep_first", keep_first)
        check_int("keep_every", keep_every, minimum=1, allow_none=True)
        self._start_fresh = (
            check_choice("on_all_damaged", on_all_damaged, ["raise", "start_fresh"])
            == "start_fresh"
        )
        self._root = root
        self._directory = root  # root resolved when the manager opens it
        self._prefix = prefix
        self._keep_total = keep_total
        self._keep_first = keep_first
        self._keep_every = keep_every
        self._calls = WriteQueue()
        self._opened = False
        self._read_only = False
        self._release_lock: weakref.finalize | None = None
        self._spares: list[Path] = []  # retired files whose rename is durable
        self._new_spares: list[Path] = []  # retired since the last directory fsync

    @property
    def root_dir(self) -> Path:
        """The directory holding the versions, as given (not resolved).

        While the manager is open it uses the directory this path resolved to when it
        opened (see the class docstring), also if a symbolic link on the path was
        repointed since; the next open, after :meth:`aclose`, resolves it again.
        """
        return self._root

    @property
    def retention(self) -> Retention | None:
        """``keep_total``, ``keep_first`` and ``keep_every`` as a
        :class:`~managers.state.base.Retention`; ``None`` when every version is kept."""
        if self._keep_total is None:
            return None
        return Retention(self._keep_total, self._keep_first, self._keep_every)

    async def save(self, state: Any, version: int) -> None:
        await self._calls.submit(self._in_directory, self._save, state, version)

    async def prepare_save(self, state: Any, version: int) -> PreparedWrite:
        """The write of :meth:`save`, not made: a :class:`~managers.writes.WriteBatch`
        flush makes it (checks, encoding and retention included), or raises what
        :meth:`save` would raise. Until then the version is not saved."""
        return self._calls.prepare(self._in_directory, self._save, state, version)

    async def load(self, version: int, structure: Any = None) -> Any:
        return await self._run(self._load, version, structure)

    async def load_latest(self, structure: Any = None) -> tuple[Any, int]:
        return await self._run(self._load_latest, structure)

    async def get_versions(self) -> list[int]:
        return await self._run(self._versions)

    async def remove(self, version: int) -> None:
        await self._run(self._remove, version)

    async def remove_all(self) -> None:
        await self._run(self._remove_all)

    async def aclose(self) -> None:
        # Synchronous on purpose: closing the lock's descriptor does not block, and an
        # aclose in a cancelled scope (leaving ``async with`` on cancellation) must
        # still release the lock.
        if self._release_lock is not None:
            self._release_lock()
            self._release_lock = None
        self._opened = False

    # Everything below runs in a worker thread, one call at a time.

    async def _run(self, function: Callable[..., _T], *args: Any) -> _T:
        return await self._calls.run(self._in_directory, function, *args)

    def _in_directory(self, function: Callable[..., _T], *args: Any) -> _T:
        if not self._opened:
            self._open()
        return function(*args)

    def _open(self) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        # Resolved once: a symbolic link on the path repointed later does not move this
        # manager, which holds this directory's lock, into another directory.
        directory = self._root.resolve(strict=True)
        read_only = not is_writable(directory)
        try:
            fd = lock_directory(directory, writable=not read_only)
        except BlockingIOError:
            raise StateDirectoryLockedError(
                f"the program-state directory {directory} is in use by another manager; "
                "one that writes a directory excludes every other: close the other one "
                "first (`async with FileProgramStateManager(...)` or `await "
                "manager.aclose()`), also when its program failed"
            ) from None
        if fd is not None:
            self._release_lock = weakref.finalize(self, os.close, fd)
        self._directory = directory
        self._opened, self._read_only = True, read_only
        self._spares.clear()
        self._new_spares.clear()
        if read_only:
            logger.info("opened the program-state directory %s read-only", directory)
            return
        for entry in os.scandir(directory):
            if entry.name.startswith(".") and _TEMPORARY_MARK in entry.name:
                os.unlink(entry.path)
                # A spare is what every closed manager leaves; anything else, a torn save.
                spare = entry.name.startswith(".retired_")
                what = "spare file" if spare else "temporary file of an unfinished save"
                level = logging.DEBUG if spare else logging.INFO
                logger.log(level, "removed the %s %s, left by an earlier manager", what, entry.path)

    def _path(self, version: int) -> Path:
        return self._directory / f"{self._prefix}{version}{_SUFFIX}"

    def _versions(self) -> list[int]:
        start, end = len(self._prefix), -len(_SUFFIX)
        found = []
        for name in os.listdir(self._directory):
            if name.startswith(self._prefix) and name.endswith(_SUFFIX):
                digits = name[start:end]
                if digits.isascii() and digits.isdigit() and str(int(digits)) == digits:
                    found.append(int(digits))
        return sorted(found)

    def _check_writable(self, action: str) -> None:
        if self._read_only:
            raise read_only_error(self._directory, action)

    def _save(self, state: Any, version: int) -> None:
        self._check_writable(f"save program state version {version!r}")
        versions = self._versions()
        check_version(
            version, newest=versions[-1] if versions else None, exists=version in versions
        )
        buffers = dumps_buffers(state)  # before any file exists: a bad leaf leaves nothing
        path = self._path(version)
        temporary, fd = self._temporary_file(path)
        try:
            try:
                os.ftruncate(fd, write_all(fd, buffers))  # a recycled file may be longer
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            self._drop_spares()  # a full disk is a likely cause: free their space too
            raise
        fsync_directory(self._directory)
        self._spares.extend(self._new_spares)  # their renames are durable now
        self._new_spares.clear()
        self._retain([*versions, version], version)

    def _temporary_file(self, path: Path) -> tuple[Path, int]:
        """A file to write ``path``'s next content into: a spare, or a new one.

        A spare that has another name (a backup linked it after it was retired) is not
        written into but unlinked: the other name keeps its content.
        """
        while self._spares:
            spare = self._spares.pop()
            try:
                fd = os.open(spare, os.O_WRONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            if os.fstat(fd).st_nlink == 1:  # of what was opened, not of the name
                return spare, fd
            os.close(fd)
            logger.debug("dropped the spare file %s, which has another name", spare)
            spare.unlink(missing_ok=True)
        temporary = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        return temporary, os.open(temporary, flags, 0o644)

    def _retain(self, versions: list[int], written: int) -> None:
        """Retire the versions that retention does not keep; ``versions`` ascending.

        Deleting a file whose blocks were flushed costs as much as the save itself on
        some disks, so the first retired files become spares (renamed to a temporary
        name) that later saves overwrite. A spare is written only after a directory
        fsync made its rename durable: a power cut then cannot bring back the old name
        over new content. Retirements are not fsynced themselves: one undone by a power
        cut brings back a complete old version, which the next save retires again. A
        version file with other names (hard links: a backup's, another version's) is
        only unlinked, never made a spare: writing into it would change them.
        """
        if self._keep_total is None:
            return
        keep = {written, *versions[-self._keep_total :]}
        if self._keep_first:
            keep.add(versions[0])
        if self._keep_every is not None:
            keep.update(version for version in versions if version % self._keep_every == 0)
        for version in versions:
            if version in keep:
                continue
            path = self._path(version)
            if len(self._spares) + len(self._new_spares) < _MAX_SPARES and (
                is_single_file_or_missing(path)  # never written into
            ):
                spare = path.with_name(f".retired_{path.name}.tmp-{secrets.token_hex(4)}")
                with contextlib.suppress(FileNotFoundError):
                    os.replace(path, spare)
                    self._new_spares.append(spare)
            else:
                self._discard(path)

    def _discard(self, path: Path) -> None:
        """Delete the name ``path``; a directory there, not the manager's to delete, is
        moved aside instead."""
        if os.path.isdir(path) and not os.path.islink(path):
            logger.warning("moved %s, a directory, to %s", path, set_aside(path))
        else:
            path.unlink(missing_ok=True)

    def _load(self, version: object, structure: Any) -> Any:
        self._check_saved(version)
        try:
            return self._read(version, structure)
        except FileNotFoundError:
            raise self._not_found(version) from None

    def _load_latest(self, structure: Any) -> tuple[Any, int]:
        damaged: dict[int, BaseException] = {}  # newest first
        for version in reversed(self._versions()):
            try:
                state = self._read(version, structure)
            except FileNotFoundError:
                continue
            except NewerFormatError:
                raise  # not damage: a newer programlogic reads it
            except SerializationError as error:
                damaged[version] = error.__cause__ or error
                continue
            self._skip(damaged)
            return state, version
        if damaged and not self._start_fresh:
            paths = {version: self._path(version) for version in damaged}
            raise all_damaged_error(self._directory, paths, damaged)
        self._skip(damaged)
        return None, 0

    def _read(self, version: int, structure: Any) -> Any:
        path = self._path(version)
        try:
            state = loads(read_version_file(path), structure)
        except NewerFormatError as error:
            raise NewerFormatError(
                f"cannot read program state version {version} from {path}: it is in format "
                f"version {error.found} of the codec, newer than the format version "
                f"{error.readable} this library reads; it is left in place: load it with a "
                "newer programlogic, or move it away to resume from the versions before it",
                error.found,
                error.readable,
            ) from error
        except SerializationError as error:
            raise SerializationError(
                f"cannot read program state version {version} from {path}: {error}"
            ) from error
        linked = hard_linked_version(path, self._version_paths)
        if linked is not None:
            raise hard_linked_error(version, path, *linked)
        return state

    def _version_paths(self) -> dict[int, Path]:
        return {version: self._path(version) for version in self._versions()}

    def _skip(self, damaged: dict[int, BaseException]) -> None:
        """Log each damaged version, and move it aside when the directory is writable."""
        for version, reason in damaged.items():
            path = self._path(version)
            done = "left it in place: the directory is read-only"
            if not self._read_only:
                done = f"moved it to {set_aside(path)}"
            message = "skipped program state version %d at %s, which is unreadable (%s); %s"
            logger.warning(message, version, path, reason, done)

    def _remove(self, version: object) -> None:
        self._check_writable(f"remove program state version {version!r}")
        self._check_saved(version)
        if not os.path.lexists(self._path(version)):
            raise self._not_found(version)
        self._discard(self._path(version))
        fsync_directory(self._directory)

    def _drop_spares(self) -> None:
        for path in [*self._spares, *self._new_spares]:
            path.unlink(missing_ok=True)
        self._spares.clear()
        self._new_spares.clear()

    def _remove_all(self) -> None:
        self._check_writable("remove the program-state versions")
        self._drop_spares()
        for version in self._versions():
            self._discard(self._path(version))
        fsync_directory(self._directory)

    def _check_saved(self, version: object) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise self._not_found(version)

    def _not_found(self, version: object) -> VersionNotFoundError:
        return VersionNotFoundError(
            f"no program state is saved as version {version!r} in {self._directory}; "
            f"saved: {self._versions()}"
        )
