"""Last call wins: the order in which wrappers hand on overlapping releases of one key."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio

from managers.release.base import ReleaseKey

__all__ = ["CallOrder", "Ticket"]


@dataclass
class _Turn:
    """The calls in flight for one key."""

    lock: anyio.Lock | None = None
    handed_on: int = 0  # the latest call handed on
    users: int = 0  # calls in flight


@dataclass
class Ticket:
    """One release call's place in the order of its key."""

    call: int
    turn: _Turn = field(repr=False)

    @property
    def lock(self) -> anyio.Lock:
        """A lock shared by the calls of this key, for handing them on one at a time."""
        if self.turn.lock is None:
            self.turn.lock = anyio.Lock(fast_acquire=True)
        return self.turn.lock

    def hand_on(self) -> bool:
        """Whether this call may be handed on: no later call of its key was."""
        if self.turn.handed_on > self.call:
            return False
        self.turn.handed_on = self.call
        return True


class CallOrder:
    """Numbers release calls per key so that a call overtaken by a later one is dropped."""

    def __init__(self) -> None:
        self._calls = 0
        self._turns: dict[ReleaseKey, _Turn] = {}  # only keys being released

    @contextmanager
    def call(self, key: ReleaseKey) -> Iterator[Ticket]:
        """A ticket for a release of ``key``, valid while the release runs."""
        self._calls += 1
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = _Turn()
        turn.users += 1
        try:
            yield Ticket(self._calls, turn)
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[key]
