"""Model weights released to files, a version per key, loadable back."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from managers.exceptions import VersionNotFoundError
from managers.files import write_atomically
from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.serialization import dumps, loads
from managers.validation import check_path
from managers.values import materialize

__all__ = ["ModelFileReleaseManager"]

_SUFFIX = ".model"
_SAFE_KEY = re.compile(r"[A-Za-z0-9_.-]+")
_INT_NAME = re.compile(r"-?[0-9]+")
# A str key that reads as an int is stored under this prefix, which no safe key holds,
# so that the keys 1 and "1" stay two files.
_STR_PREFIX = "="


class ModelFileReleaseManager(ReleaseManager):
    """Writes each released model (any structure of weights) to its own file.

    Files are ``{root_dir}/{key}.model`` in the codec of :mod:`managers.serialization`
    (the same lossless format as the file program-state manager: dtypes, shapes and
    container order kept, a checksum verified on load, no pickle). A str key must be
    a plain file name (letters, digits, ``_``, ``.``, ``-``; not starting with ``.``);
    one that reads as an int (``"1"``) is stored as ``={key}.model``, apart from the int
    key ``1``.
    Each file is written to a temporary name, fsynced and renamed, so a crash leaves
    the previous file or the new one; releasing a key again replaces its file.
    :meth:`load` reads one back.
    """

    def __init__(self, root_dir: str | os.PathLike[str]) -> None:
        self._root = check_path("root_dir", root_dir)
        self._lock: anyio.Lock | None = None

    async def release(self, value: Any, key: ReleaseKey) -> None:
        path = self._path(check_key(key))
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:  # releases are written in call order: the last call wins
            plain = await materialize(value)
            await anyio.to_thread.run_sync(_encode_and_write, path, plain)

    async def load(self, key: ReleaseKey, structure: Any = None) -> Any:
        """The model released under ``key``, shaped like ``structure`` when given.

        Raises:
            VersionNotFoundError: nothing was released under ``key``.
            managers.serialization.SerializationError: the file is damaged.
        """
        path = self._path(check_key(key))
        try:
            payload = await anyio.to_thread.run_sync(path.read_bytes)
        except FileNotFoundError:
            raise VersionNotFoundError(
                f"no model was released under key {key!r} in {self._root}"
            ) from None
        return loads(payload, structure)

    async def keys(self) -> list[ReleaseKey]:
        """The keys released so far: ints ascending, then strs in name order."""
        names = await anyio.to_thread.run_sync(_list_models, self._root)
        ints = sorted(int(name) for name in names if _INT_NAME.fullmatch(name))
        strs = sorted(
            name.removeprefix(_STR_PREFIX) for name in names if not _INT_NAME.fullmatch(name)
        )
        return [*ints, *strs]

    def _path(self, key: ReleaseKey) -> Path:
        name = str(key)
        if isinstance(key, str) and (not _SAFE_KEY.fullmatch(key) or key.startswith(".")):
            raise ValueError(
                "a model key must be a plain file name (letters, digits, '_', '.', '-'), "
                f"got {key!r}"
            )
        if isinstance(key, str) and _INT_NAME.fullmatch(key):
            name = f"{_STR_PREFIX}{key}"
        return self._root / f"{name}{_SUFFIX}"


def _encode_and_write(path: Path, value: Any) -> None:
    write_atomically(path, dumps(value))


def _list_models(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return [
        entry.name.removesuffix(_SUFFIX)
        for entry in root.iterdir()
        if entry.name.endswith(_SUFFIX) and not entry.name.startswith(".")
    ]
