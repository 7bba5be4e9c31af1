"""Released values kept in memory: for tests and notebooks."""

from __future__ import annotations

from typing import Any

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.values import materialize

__all__ = ["MemoryReleaseManager"]


class MemoryReleaseManager(ReleaseManager):
    """Keeps released values in memory, a value per key.

    ``values()`` returns the kept values as a dict key -> value in the order keys were
    first released; releasing a key again replaces its value and keeps its position.
    ``max_entries``: keep at most this many keys, dropping the earliest released first
    (``None`` keeps all). Values are stored as materialized, without copying. When
    releases of one key overlap, the one called last wins.
    """

    def __init__(self, max_entries: int | None = None) -> None:
        if max_entries is not None and (
            not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1
        ):
            raise ValueError(f"max_entries must be a positive int or None, got {max_entries!r}")
        self._max_entries = max_entries
        self._values: dict[ReleaseKey, Any] = {}
        self._calls = 0
        self._latest_call: dict[ReleaseKey, int] = {}

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        self._calls += 1
        call = self._latest_call[key] = self._calls
        materialized = await materialize(value)
        if self._latest_call.get(key) != call:
            return  # a later release of this key was made while this one materialized
        del self._latest_call[key]
        self._values[key] = materialized
        if self._max_entries is not None:
            while len(self._values) > self._max_entries:
                del self._values[next(iter(self._values))]

    def values(self) -> dict[ReleaseKey, Any]:
        """The kept values, key -> value, in order of first release."""
        return dict(self._values)
