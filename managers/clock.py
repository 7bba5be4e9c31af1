"""Clocks: where managers and program logic read the time, so tests can drive it."""

from __future__ import annotations

import datetime
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of the current time as a timezone-aware ``datetime``."""

    def now(self) -> datetime.datetime:
        """The current time."""
        ...


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)
