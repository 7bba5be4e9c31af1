"""A release manager that passes on releases every n keys or every so much time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from managers.clock import Clock, SystemClock
from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.state.base import ProgramStateManager
from managers.validation import check_interface, check_type, describe

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
      the interval. ``clock`` is an object whose ``now()`` returns a datetime; by default
      :class:`SystemClock`.

    The time cadence survives a restart when ``state_manager`` is given: before a release
    is handed on, the manager saves the time and key of that release to it (a new
    version each time, ``{"time_us": microseconds since the epoch, "key": key}``), and
    its first decision in a restarted program starts from the latest version saved. A
    state manager of its own, keeping one version, is enough:
    ``FileProgramStateManager(root / "periodic", keep_total=1)``. Without one the
    interval starts afresh in a restarted program. ``state_manager`` applies to a
    ``timedelta`` periodicity only (an int cadence needs no state).

    Releases with str keys always pass and leave the cadence alone. A release that does
    not pass is dropped: its value is not materialized. One that passes is handed on as
    it is; ``manager`` materializes it. ``aclose`` closes ``manager`` (not
    ``state_manager``, which the caller owns).
    """

    def __init__(
        self,
        manager: ReleaseManager,
        periodicity: int | timedelta,
        *,
        clock: Clock | None = None,
        state_manager: ProgramStateManager | None = None,
    ) -> None:
        self._manager = check_type("manager", manager, ReleaseManager)
        expected = "periodicity must be a positive int or a positive timedelta"
        if isinstance(periodicity, bool) or not isinstance(periodicity, int | timedelta):
            raise TypeError(f"{expected}, got {describe(periodicity)}")
        if periodicity <= (timedelta(0) if isinstance(periodicity, timedelta) else 0):
            raise ValueError(f"{expected}, got {periodicity!r}")
        check_interface("clock", clock, "Clock", ["now"], allow_none=True)
        check_type("state_manager", state_manager, ProgramStateManager, allow_none=True)
        if state_manager is not None and not isinstance(periodicity, timedelta):
            raise ValueError(
                "state_manager applies to a timedelta periodicity only, "
                f"got periodicity {periodicity!r}"
            )
        self._periodicity = periodicity
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._state_manager = state_manager
        self._loaded = False
        self._version = 0
        self._last_time: datetime | None = None
        self._last_key: int | None = None
        self._lock: anyio.Lock | None = None

    @property
    def manager(self) -> ReleaseManager:
        """The manager released to."""
        return self._manager

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        if isinstance(key, str):
            passes = True
        elif isinstance(self._periodicity, int):
            passes = key % self._periodicity == 0
        else:
            if self._lock is None:
                self._lock = anyio.Lock()
            async with self._lock:  # decisions and their saves, one at a time
                passes = await self._time_passes(key)
        if passes:
            await self._manager.release(value, key)

    async def aclose(self) -> None:
        await self._manager.aclose()

    async def _time_passes(self, key: int) -> bool:
        if self._state_manager is not None and not self._loaded:
            await self._load(self._state_manager)
        if key == self._last_key:
            return True
        now = self._clock.now()
        if self._last_time is not None:
            elapsed = now - self._last_time
            if timedelta(0) <= elapsed < self._periodicity:
                return False
        if self._state_manager is not None:
            self._version += 1  # before the save: a cancelled save may have saved it
            record = {"time_us": _microseconds(now), "key": key}
            await self._state_manager.save(record, self._version)
        self._last_time = now
        self._last_key = key
        return True

    async def _load(self, state_manager: ProgramStateManager) -> None:
        record, version = await state_manager.load_latest()
        if record is not None:
            self._last_time = _EPOCH + timedelta(microseconds=int(record["time_us"]))
            self._last_key = int(record["key"])
            self._version = version
        self._loaded = True


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _microseconds(time: datetime) -> int:
    return (time - _EPOCH) // timedelta(microseconds=1)
