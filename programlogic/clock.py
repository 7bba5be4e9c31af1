"""Clocks: where program logic reads the time, so tests can drive it.

The same classes as :mod:`managers.clock`, under programlogic's name.
"""

from managers.clock import Clock, SystemClock

__all__ = ["Clock", "SystemClock"]
