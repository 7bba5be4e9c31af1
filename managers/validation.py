"""Argument checks shared by managers and programlogic, so mistakes raise alike.

Every check raises ``TypeError`` when the argument has the wrong type and
``ValueError`` when it has the right type but a wrong value; the message is one
sentence naming the argument and the value found, e.g. ``keep_total must be an int >= 1
or None, got 0``. ``bool`` is not accepted where an ``int`` or a number is expected,
nor a NumPy integer where an ``int`` is (pass ``int(n)``); NumPy floats are numbers.
Each check returns the value, so a constructor can check and store in one line::

    self._keep_total = check_int("keep_total", keep_total, minimum=1, allow_none=True)

Implementations of the abstract managers may use these checks for their own arguments.
"""

from __future__ import annotations

import datetime
import math
import numbers
import os
import reprlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_int",
    "check_interface",
    "check_number",
    "check_path",
    "check_seconds",
    "check_shape",
    "check_str",
    "check_timedelta",
    "check_type",
    "describe",
]

_T = TypeVar("_T")

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6


def describe(value: object) -> str:
    """How a message shows a value found: its type and its (shortened) repr."""
    return f"{type(value).__name__} {_repr.repr(value)}"


def check_type(
    name: str, value: _T, types: type | tuple[type, ...], *, allow_none: bool = False
) -> _T:
    """``value`` if it is an instance of ``types`` (or None when allowed); TypeError otherwise."""
    if value is None and allow_none:
        return value
    if not isinstance(value, types):
        kinds = types if isinstance(types, tuple) else (types,)
        expected = " or ".join(_article(kind.__name__) for kind in kinds)
        raise TypeError(f"{name} must be {expected}{_or_none(allow_none)}, got {describe(value)}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool; TypeError otherwise (``0`` and ``1`` are not bools)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {describe(value)}")
    return value


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    allow_none: bool = False,
) -> Any:
    """``value`` if it is an int (not a bool) within ``[minimum, maximum]``, or None when allowed.

    TypeError for anything but an int; ValueError for an int out of bounds.
    """
    if value is None and allow_none:
        return value
    expected = "an int" + _bounds(minimum, maximum) + _or_none(allow_none)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    finite: bool = False,
    allow_none: bool = False,
) -> Any:
    """``value`` if it is a real number (not a bool, not NaN) within the bounds given.

    ``minimum`` and ``maximum`` are inclusive, ``above`` and ``below`` exclusive;
    ``finite`` also refuses infinities. TypeError for anything but a real number;
    ValueError for NaN or a number out of bounds.
    """
    if value is None and allow_none:
        return value
    expected = (
        ("a finite number" if finite else "a number")
        + _bounds(minimum, maximum, above, below)
        + _or_none(allow_none)
    )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    if (
        math.isnan(value)
        or (finite and math.isinf(value))
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
        or (above is not None and value <= above)
        or (below is not None and value >= below)
    ):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_timedelta(
    name: str,
    value: Any,
    *,
    minimum: datetime.timedelta | None = None,
    above: datetime.timedelta | None = None,
    allow_none: bool = False,
) -> Any:
    """``value`` if it is a ``datetime.timedelta`` at least ``minimum`` / above ``above``."""
    if value is None and allow_none:
        return value
    expected = "a timedelta" + _bounds(minimum, None, above) + _or_none(allow_none)
    if not isinstance(value, datetime.timedelta):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    if (minimum is not None and value < minimum) or (above is not None and value <= above):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_seconds(name: str, value: Any) -> float | None:
    """A duration given as seconds (a number above 0) or a ``timedelta``, as float seconds;
    None for None or an infinite number (no limit)."""
    if isinstance(value, datetime.timedelta):
        return check_timedelta(name, value, above=datetime.timedelta(0)).total_seconds()
    if check_number(name, value, above=0, allow_none=True) is None or math.isinf(value):
        return None
    return float(value)


def check_str(name: str, value: Any, *, allow_empty: bool = True, allow_none: bool = False) -> Any:
    """``value`` if it is a str (non-empty unless ``allow_empty``), or None when allowed."""
    if value is None and allow_none:
        return value
    expected = ("a str" if allow_empty else "a non-empty str") + _or_none(allow_none)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    if not allow_empty and not value.strip():
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[_T]) -> _T:
    """The choice equal to ``value`` (an enum member for its string value).

    TypeError when ``value`` has none of the choices' types, ValueError when it has
    one but equals no choice.
    """
    options = list(choices)
    kinds = tuple({str if isinstance(choice, str) else type(choice) for choice in options})
    listed = ", ".join(
        repr(str(choice) if isinstance(choice, str) else choice) for choice in options
    )
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise TypeError(f"{name} must be one of {listed}, got {describe(value)}")
    for choice in options:
        if value == choice:
            return choice
    raise ValueError(f"{name} must be one of {listed}, got {value!r}")


def check_callable(name: str, value: _T, *, allow_none: bool = False) -> _T:
    """``value`` if it is callable (or None when allowed); TypeError otherwise."""
    if value is None and allow_none:
        return value
    if not callable(value):
        raise TypeError(f"{name} must be callable{_or_none(allow_none)}, got {describe(value)}")
    return value


def check_interface(
    name: str, value: _T, interface: str, methods: Iterable[str], *, allow_none: bool = False
) -> _T:
    """``value`` if it has every method in ``methods`` (or is None when allowed).

    For duck-typed protocols: ``check_interface("clock", clock, "Clock", ["now"])``
    raises ``TypeError: clock must be a Clock (with now()), got str 'now'``.
    """
    if value is None and allow_none:
        return value
    needed = list(methods)
    if not all(callable(getattr(value, method, None)) for method in needed):
        listed = ", ".join(f"{method}()" for method in needed)
        raise TypeError(
            f"{name} must be {_article(interface)} (with {listed}){_or_none(allow_none)}, "
            f"got {describe(value)}"
        )
    return value


def check_path(name: str, value: Any, *, allow_none: bool = False) -> Any:
    """``value`` as a :class:`~pathlib.Path` if it is a non-empty str or ``os.PathLike``."""
    if value is None and allow_none:
        return value
    expected = "a str or os.PathLike path" + _or_none(allow_none)
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    path = os.fspath(value)
    if not isinstance(path, str):
        raise TypeError(f"{name} must be {expected} of str, got {describe(value)}")
    if not path:
        raise ValueError(f"{name} must be a non-empty path, got {value!r}")
    return Path(path)


def check_shape(
    name: str, value: Any, *, allow_empty: bool = True, allow_none: bool = False
) -> Any:
    """``value`` as a tuple if it is a tuple or list of ints >= 1 (an array shape).

    TypeError when it is not a tuple or list, or holds something other than ints;
    ValueError when a size is below 1, or when it is empty and ``allow_empty`` is False.
    """
    if value is None and allow_none:
        return value
    expected = (
        ("a non-empty" if not allow_empty else "a") + " tuple of ints >= 1" + _or_none(allow_none)
    )
    if not isinstance(value, tuple | list) or any(
        isinstance(size, bool) or not isinstance(size, int) for size in value
    ):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    if any(size < 1 for size in value) or (not value and not allow_empty):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return tuple(value)


def _bounds(
    minimum: object = None, maximum: object = None, above: object = None, below: object = None
) -> str:
    parts = [
        f"{symbol} {0 if bound == datetime.timedelta(0) else bound}"
        for symbol, bound in ((">=", minimum), (">", above), ("<=", maximum), ("<", below))
        if bound is not None
    ]
    return " " + " and ".join(parts) if parts else ""


def _or_none(allow_none: bool) -> str:
    return " or None" if allow_none else ""


def _article(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"
