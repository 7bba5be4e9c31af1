"""managers.validation: the checks every public argument goes through."""

from __future__ import annotations

import datetime
import enum
import math
from pathlib import Path

import numpy as np
import pytest

from managers.validation import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_interface,
    check_number,
    check_path,
    check_str,
    check_timedelta,
    check_type,
    describe,
)

pytestmark = pytest.mark.anyio


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


async def test_valid_values_come_back() -> None:
    assert check_int("n", 3, minimum=1, maximum=3) == 3
    assert check_int("n", None, allow_none=True) is None
    assert check_number("rate", 0.5, minimum=0, below=1) == 0.5
    assert check_number("rate", np.float32(0.25), above=0) == np.float32(0.25)
    assert check_number("limit", math.inf, minimum=0) == math.inf
    assert check_bool("flag", False) is False
    assert check_str("name", "") == ""
    assert check_callable("fn", len) is len
    assert check_type("items", [1], (list, tuple)) == [1]
    zero = datetime.timedelta(0)
    assert check_timedelta("wait", zero, minimum=zero) == zero
    assert check_path("root", "runs/1") == Path("runs/1")
    assert check_path("root", Path("/tmp")) == Path("/tmp")


async def test_a_choice_comes_back_as_the_member_it_equals() -> None:
    assert check_choice("color", "red", Color) is Color.RED
    assert check_choice("mode", "max", ("min", "max")) == "max"


@pytest.mark.parametrize(
    ("check", "error", "message"),
    [
        (lambda: check_int("n", True), TypeError, "n must be an int, got bool True"),
        (lambda: check_int("n", 2.0, minimum=1), TypeError, "n must be an int >= 1, got float 2.0"),
        (
            lambda: check_int("n", np.int64(2)),
            TypeError,
            f"n must be an int, got int64 {np.int64(2)!r}",
        ),
        (lambda: check_int("n", 0, minimum=1), ValueError, "n must be an int >= 1, got 0"),
        (
            lambda: check_int("n", 9, minimum=1, maximum=5, allow_none=True),
            ValueError,
            "n must be an int >= 1 and <= 5 or None, got 9",
        ),
        (lambda: check_number("x", False), TypeError, "x must be a number, got bool False"),
        (lambda: check_number("x", "1"), TypeError, "x must be a number, got str '1'"),
        (lambda: check_number("x", math.nan), ValueError, "x must be a number, got nan"),
        (
            lambda: check_number("x", math.inf, finite=True),
            ValueError,
            "x must be a finite number, got inf",
        ),
        (lambda: check_number("x", 0, above=0), ValueError, "x must be a number > 0, got 0"),
        (
            lambda: check_number("x", 1.0, below=1.0),
            ValueError,
            "x must be a number < 1.0, got 1.0",
        ),
        (lambda: check_bool("flag", 1), TypeError, "flag must be a bool, got int 1"),
        (lambda: check_str("name", b"a"), TypeError, "name must be a str, got bytes b'a'"),
        (
            lambda: check_str("name", " ", allow_empty=False),
            ValueError,
            "name must be a non-empty str, got ' '",
        ),
        (
            lambda: check_choice("color", "green", Color),
            ValueError,
            "color must be one of 'red', 'blue', got 'green'",
        ),
        (
            lambda: check_choice("color", 3, Color),
            TypeError,
            "color must be one of 'red', 'blue', got int 3",
        ),
        (lambda: check_callable("fn", 3), TypeError, "fn must be callable, got int 3"),
        (
            lambda: check_type("items", 3, (list, tuple), allow_none=True),
            TypeError,
            "items must be a list or a tuple or None, got int 3",
        ),
        (
            lambda: check_interface("clock", "now", "Clock", ["now"]),
            TypeError,
            r"clock must be a Clock (with now()), got str 'now'",
        ),
        (
            lambda: check_timedelta("wait", 5, above=datetime.timedelta(0)),
            TypeError,
            "wait must be a timedelta > 0, got int 5",
        ),
        (
            lambda: check_timedelta("wait", datetime.timedelta(0), above=datetime.timedelta(0)),
            ValueError,
            "wait must be a timedelta > 0, got datetime.timedelta(0)",
        ),
        (lambda: check_path("root", 3), TypeError, "root must be a str or os.PathLike path"),
        (lambda: check_path("root", ""), ValueError, "root must be a non-empty path, got ''"),
    ],
)
async def test_wrong_types_and_values_raise_naming_argument_and_value(check, error, message):
    with pytest.raises(error) as raised:
        check()
    assert str(raised.value).startswith(message)


async def test_long_values_are_shortened_in_messages() -> None:
    assert len(describe("x" * 1000)) < 80
    assert describe(list(range(100))).startswith("list [0, 1, 2, 3, 4, 5, ...]")
