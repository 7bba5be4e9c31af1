"""Deprecated: ``Clock`` and ``SystemClock`` are exported by :mod:`managers` (also
``programlogic.managers``), from :mod:`managers.clock`.

``from programlogic.clock import Clock`` keeps working with a ``DeprecationWarning``.
"""

from programlogic._deprecation import moved_names

__all__: list[str] = []

__getattr__ = moved_names(
    __name__, {"Clock": "managers.clock.Clock", "SystemClock": "managers.clock.SystemClock"}
)
