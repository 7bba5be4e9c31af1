"""The faults the testing fakes inject: a fault plan for :class:`FakeContext`, and the crash.

A :class:`~programlogic.testing.FakeContext` is given its faults up front, each keyed
by the number of a client call (``call=3``: the context's third ``map_clients`` or
``aggregate_clients``, counted from 1), or played in every call when ``call`` is None::

    FakeContext(
        faults=[
            FailClient("client_3", call=2),  # its work raises: ClientError naming it
            DropClients(["client_1", "client_4"], call=4),  # missed the round's deadline
            LoseCluster(call=5),  # ClusterConnectionError from call 5 on
            SlowCall(timedelta(minutes=5)),  # every call takes 5 minutes of the clock
        ],
        clock=clock,
    )
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable

from managers.validation import check_int, check_str, check_timedelta, check_type, describe

__all__ = [
    "DropClients",
    "FailClient",
    "Fault",
    "LoseCluster",
    "SimulatedCrash",
    "SlowCall",
]


class SimulatedCrash(Exception):
    """The crash a testing fake injects (:class:`CrashingStateManager`, :class:`FailClient`)."""


def _check_call(call: object, *, allow_none: bool) -> None:
    check_int("call", call, minimum=1, allow_none=allow_none)


@dataclasses.dataclass(frozen=True)
class FailClient:
    """The work of ``client`` raises ``error`` in call ``call`` (in every call when None).

    The call fails with the :class:`~programlogic.exceptions.ClientError` the real
    backends raise, naming the client (or its group, when the call groups clients),
    with ``error`` as its cause; ``error`` defaults to a :class:`SimulatedCrash` naming
    the client and the call. The failing client's work does not run.
    """

    client: str
    call: int | None = dataclasses.field(default=None, kw_only=True)
    error: Exception | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        check_str("client", self.client, allow_empty=False)
        _check_call(self.call, allow_none=True)
        check_type("error", self.error, Exception, allow_none=True)


@dataclasses.dataclass(frozen=True)
class DropClients:
    """``clients`` are dropped from call ``call`` (from every call when None), as a
    round deadline drops stragglers.

    Their work does not run; the call returns the other clients' results, reports the
    dropped ones to :func:`~programlogic.context.count_dropped_clients`, and raises
    :class:`~programlogic.exceptions.NotEnoughClientsError` when fewer than the
    context's ``min_clients`` finished. The other clients are grouped (``group_size``)
    as if the dropped ones had not been asked, so a group function sees only clients
    that finish (on Ray, a deadline drops a whole group). A named client the call did
    not ask for is ignored; a dropped client's :class:`FailClient` is not played.
    """

    clients: tuple[str, ...]
    call: int | None = None

    def __init__(self, clients: Iterable[str], *, call: int | None = None) -> None:
        if isinstance(clients, str) or not isinstance(clients, Iterable):
            raise TypeError(f"clients must be an iterable of client ids, got {describe(clients)}")
        ids = tuple(clients)
        for client in ids:
            check_str("a client of clients", client, allow_empty=False)
        _check_call(call, allow_none=True)
        object.__setattr__(self, "clients", ids)
        object.__setattr__(self, "call", call)


@dataclasses.dataclass(frozen=True)
class LoseCluster:
    """The cluster is lost in call ``call``: it and every later client call raise
    :class:`~programlogic.exceptions.ClusterConnectionError`, until the context is left.

    Entering the context again connects to a new cluster; call numbers go on counting,
    so the fault is not played again.
    """

    call: int = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        _check_call(self.call, allow_none=False)


@dataclasses.dataclass(frozen=True)
class SlowCall:
    """Call ``call`` (every call when None) takes ``takes`` of the context's clock.

    The clock (a :class:`~programlogic.testing.FakeClock`, given to the context) moves
    forward by ``takes`` once the call's work is done, before it returns (or raises
    :class:`~programlogic.exceptions.NotEnoughClientsError`); a call whose client work
    fails, that loses the cluster or that is cancelled does not move it. Nothing sleeps.
    """

    takes: datetime.timedelta
    call: int | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        check_timedelta("takes", self.takes, minimum=datetime.timedelta(0))
        _check_call(self.call, allow_none=True)


Fault = FailClient | DropClients | LoseCluster | SlowCall
"""Any fault of a :class:`~programlogic.testing.FakeContext`'s plan."""
