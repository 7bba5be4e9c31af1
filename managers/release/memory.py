"""Released values kept in memory: for tests and notebooks."""

from __future__ import annotations

from typing import Any

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.validation import check_int
from managers.values import materialize

__all__ = ["MemoryReleaseManager"]


class MemoryReleaseManager(ReleaseManager):
    """Keeps released values in memory, a value per key.

    ``values()`` returns the kept values as a dict key -> value in the order keys were
    first released; releasing a key again replaces its value and keeps its position.
    ``max_entries``: keep at most this many keys, dropping the earliest released first
    (``None`` keeps all). Values are stored as materialized, without copying. When
    releases of one key overlap, the one called last among those that succeed wins: a
    release that fails leaves the key with what it held, including the value of an
    earlier overlapping release that succeeded.
    """

    def __init__(self, max_entries: int | None = None) -> None:
        self._max_entries = check_int("max_entries", max_entries, minimum=1, allow_none=True)
        self._values: dict[ReleaseKey, Any] = {}
        self._calls = 0
        self._stored_call: dict[ReleaseKey, int] = {}

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        self._calls += 1
        call = self._calls
        materialized = await materialize(value)
        if call < self._stored_call.get(key, 0):
            return  # a release of this key called later has already been stored
        self._stored_call[key] = call
        self._values[key] = materialized
        if self._max_entries is not None:
            while len(self._values) > self._max_entries:
                dropped = next(iter(self._values))
                del self._values[dropped], self._stored_call[dropped]

    def values(self) -> dict[ReleaseKey, Any]:
        """The kept values, key -> value, in order of first release."""
        return dict(self._values)
