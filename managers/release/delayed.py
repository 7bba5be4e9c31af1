"""A release manager that passes on releases only from a given key on."""

from __future__ import annotations

from typing import Any

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.validation import check_int, check_type

__all__ = ["DelayedReleaseManager"]


class DelayedReleaseManager(ReleaseManager):
    """Passes on to ``manager`` the releases whose int key is at least ``delay``.

    ``delay`` is an int >= 0: with ``delay=10`` rounds 10, 11... are released and rounds
    0 to 9 are not; ``delay=0`` passes every key >= 0. The decision depends on the key
    alone, so a restarted program decides the same. Releases with str keys always pass.
    A release that does not pass is dropped: its value is not materialized. One that
    passes is handed on as it is; ``manager`` materializes it. ``aclose`` closes
    ``manager``.
    """

    def __init__(self, manager: ReleaseManager, delay: int) -> None:
        self._manager = check_type("manager", manager, ReleaseManager)
        self._delay = check_int("delay", delay, minimum=0)

    @property
    def manager(self) -> ReleaseManager:
        """The manager released to."""
        return self._manager

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        if isinstance(key, str) or key >= self._delay:
            await self._manager.release(value, key)

    async def aclose(self) -> None:
        await self._manager.aclose()
