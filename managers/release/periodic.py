"""A release manager that passes on releases every n keys or every so much time."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from managers.clock import Clock, SystemClock
from managers.release.base import ReleaseKey, ReleaseManager, check_key

__all__ = ["PeriodicReleaseManager"]


class PeriodicReleaseManager(ReleaseManager):
    """Passes on to ``manager`` the releases of every n-th key or of every time interval.

    - ``periodicity`` an ``int`` n: a release with int key k passes when ``k % n == 0``
      (rounds 0, n, 2n...). The decision depends on the key alone, so a restarted program
      keeps the cadence, and releasing a key again passes whenever its first release did.
    - ``periodicity`` a ``timedelta``: a release with an int key passes when at least that
      much time has passed on ``clock`` since the last int-keyed release that passed (the
      first one always passes), or when its key is that release's key (so re-releasing it
      replaces its value). A clock that went backwards lets the release pass and restarts
      the interval. The interval starts afresh in a restarted program. ``clock`` is an
      object whose ``now()`` returns a datetime; by default :class:`SystemClock`.

    Releases with str keys always pass and leave the cadence alone. A release that does
    not pass is dropped: its value is not materialized. One that passes is handed on as
    it is; ``manager`` materializes it. ``aclose`` closes ``manager``.
    """

    def __init__(
        self,
        manager: ReleaseManager,
        periodicity: int | timedelta,
        *,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(manager, ReleaseManager):
            raise TypeError(
                f"manager must be a ReleaseManager, got {type(manager).__name__} {manager!r}"
            )
        if isinstance(periodicity, bool) or not isinstance(periodicity, int | timedelta):
            raise TypeError(
                "periodicity must be a positive int or a positive timedelta, "
                f"got {type(periodicity).__name__} {periodicity!r}"
            )
        if periodicity <= (timedelta(0) if isinstance(periodicity, timedelta) else 0):
            raise ValueError(
                f"periodicity must be a positive int or a positive timedelta, got {periodicity!r}"
            )
        if clock is not None and not callable(getattr(clock, "now", None)):
            raise TypeError(f"clock must have a now() method, got {type(clock).__name__}")
        self._manager = manager
        self._periodicity = periodicity
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._last_time: datetime | None = None
        self._last_key: int | None = None

    @property
    def manager(self) -> ReleaseManager:
        """The manager released to."""
        return self._manager

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        if self._passes(key):
            await self._manager.release(value, key)

    async def aclose(self) -> None:
        await self._manager.aclose()

    def _passes(self, key: ReleaseKey) -> bool:
        if isinstance(key, str):
            return True
        if isinstance(self._periodicity, int):
            return key % self._periodicity == 0
        if key == self._last_key:
            return True
        now = self._clock.now()
        if self._last_time is not None:
            elapsed = now - self._last_time
            if timedelta(0) <= elapsed < self._periodicity:
                return False
        self._last_time = now
        self._last_key = key
        return True
