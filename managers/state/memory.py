"""Program state kept in memory: for tests, notebooks and short runs."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from managers.exceptions import VersionNotFoundError
from managers.state.base import ProgramStateManager, Retention, check_version
from managers.structure import reshape
from managers.validation import check_int

__all__ = ["MemoryProgramStateManager"]


class MemoryProgramStateManager(ProgramStateManager):
    """Keeps saved versions in memory, as deep copies.

    ``keep_total``: keep at most this many versions, the newest ones (``None`` keeps
    all). The version just saved is always kept. Nothing survives the process; use it
    in tests and where a restart need not resume.

    ``load`` returns a deep copy of what was saved, with its own container types
    (NamedTuples and dataclasses stay what they were); with a ``structure`` template,
    containers take the template's types instead.
    """

    def __init__(self, keep_total: int | None = None) -> None:
        self._keep_total = check_int("keep_total", keep_total, minimum=1, allow_none=True)
        self._versions: dict[int, Any] = {}  # ascending: saves strictly increase

    @property
    def retention(self) -> Retention | None:
        """The newest ``keep_total`` versions are kept; ``None`` when every one is."""
        return None if self._keep_total is None else Retention(self._keep_total)

    async def save(self, state: Any, version: int) -> None:
        newest = next(reversed(self._versions), None)
        check_version(version, newest=newest, exists=version in self._versions)
        self._versions[version] = _snapshot(state)
        if self._keep_total is not None:
            while len(self._versions) > self._keep_total:
                del self._versions[next(iter(self._versions))]

    async def load(self, version: int, structure: Any = None) -> Any:
        state = self._versions[self._saved(version)]
        loaded = _snapshot(state)
        if structure is None:
            return loaded
        return reshape(structure, loaded)

    async def get_versions(self) -> list[int]:
        return list(self._versions)

    async def remove(self, version: int) -> None:
        del self._versions[self._saved(version)]

    async def remove_all(self) -> None:
        self._versions.clear()

    def _saved(self, version: object) -> int:
        """``version`` if it is saved; VersionNotFoundError otherwise (also for non-ints)."""
        if (
            isinstance(version, bool)
            or not isinstance(version, int)
            or version not in self._versions
        ):
            raise VersionNotFoundError(
                f"no program state is saved as version {version!r}; saved: {list(self._versions)}"
            )
        return version


def _snapshot(value: Any) -> Any:
    """A deep copy; plain containers and arrays are copied directly, which is faster."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:
        return {
            key: child if type(child) in _IMMUTABLE else _snapshot(child)
            for key, child in value.items()
        }
    if kind is list:
        return [child if type(child) in _IMMUTABLE else _snapshot(child) for child in value]
    if type(value) is np.ndarray and not value.dtype.hasobject:
        return value.copy()
    return copy.deepcopy(value)


_IMMUTABLE = frozenset({int, float, bool, str, bytes, type(None), complex})
