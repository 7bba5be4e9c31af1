"""What a running call of the Ray context hears about: its units, and the pool's actors."""

from __future__ import annotations

from typing import Any, NamedTuple

from programlogic.exceptions import ClientError, ProgramLogicError

__all__ = ["Died", "Done", "Event", "Failed", "Ready", "StartFailed", "Wake"]


class Wake(NamedTuple):
    """Another call freed or started actors: the call looks at the pool again."""


class Ready(NamedTuple):
    """A starting ``actor`` is up, in process ``pid`` of ``machine``."""

    actor: Any
    machine: str
    pid: int


class StartFailed(NamedTuple):
    """A starting ``actor`` never came up."""

    actor: Any
    error: ProgramLogicError


class Done(NamedTuple):
    """Unit ``index`` finished with ``results``."""

    index: int
    results: list[Any]


class Failed(NamedTuple):
    """The client work of unit ``index`` raised."""

    index: int
    error: ClientError


class Died(NamedTuple):
    """Unit ``index`` got no result: its actor, its node or its result died."""

    index: int
    error: ProgramLogicError


Event = Wake | Ready | StartFailed | Done | Failed | Died
