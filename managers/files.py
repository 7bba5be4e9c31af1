"""Durable file writing: the building blocks of the file-based managers.

A write made with these functions survives a crash whole or not at all: a replaced file
is written beside the old one, fsynced and renamed over it, and the rename made durable
by an fsync of the directory. Your own file-backed sink or state manager can use them
to keep the same promise as :class:`~managers.CSVFileReleaseManager` and
:class:`~managers.FileProgramStateManager`. They block: call them from a worker thread
(``anyio.to_thread.run_sync``), never on the event loop.
"""

from __future__ import annotations

import io
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["append", "fsync_directory", "open_for_append", "replace_and_reopen", "write_atomically"]


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (a rename, a new file) durable."""
    if os.name != "posix":
        return  # directories cannot be opened for fsync elsewhere
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a crash leaves the old file or the new one, whole.

    Written to a temporary name beside it, fsynced, renamed, then the directory fsynced.
    A failure removes the temporary file and leaves ``path`` as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def open_for_append(path: Path) -> io.FileIO:
    """An unbuffered file appending to ``path`` (created when missing)."""
    return io.FileIO(path, "a")


def append(file: io.FileIO, data: bytes) -> None:
    """Write all of ``data`` at the end of ``file``."""
    view = memoryview(data)
    while view:
        view = view[file.write(view) :]


def replace_and_reopen(
    path: Path, old_file: io.FileIO | None, render: Callable[..., bytes], *args: Any
) -> io.FileIO:
    """Rewrite ``path`` atomically with ``render(*args)``; the new file to append to.

    ``old_file``, which points at the file just replaced, is closed.
    """
    write_atomically(path, render(*args))
    new_file = open_for_append(path)
    if old_file is not None:
        old_file.close()
    return new_file
