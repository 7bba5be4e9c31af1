"""The units of work of a round: how every backend splits and computes a round's clients.

A backend's :meth:`~programlogic.FederatedContext.stream_units` cuts
the clients with :func:`split_units` and computes each unit with :func:`compute_unit`
where its work runs. Backends that split clients identically compute identical groups,
so a vectorized group function (FedAvg's) gives the same bits on every backend, and
results folded in unit order add up in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from managers.validation import check_int
from programlogic.exceptions import ClientError

if TYPE_CHECKING:
    from programlogic.context import ClientFn, GroupFn
    from programlogic.data import ClientHandle

__all__ = ["check_group_size", "compute_unit", "split_units"]


def check_group_size(group_size: object) -> None:
    """Raise unless ``group_size`` is None or an int >= 1 (TypeError or ValueError)."""
    check_int("group_size", group_size, minimum=1, allow_none=True)


def split_units(
    clients: Sequence[ClientHandle], group_size: int | None
) -> list[list[ClientHandle]]:
    """``clients`` cut, in order, into consecutive units of ``group_size`` (1 when None)."""
    size = group_size or 1
    return [list(clients[start : start + size]) for start in range(0, len(clients), size)]


def compute_unit(
    fn: ClientFn | GroupFn,
    broadcast: Any,
    client_ids: Sequence[str],
    load: Sequence[Any],
    grouped: bool,
) -> list[Any]:
    """The results of one unit: its clients' data loaded by ``load`` and passed to ``fn``.

    ``load`` holds a zero-argument callable per client (its handle's ``loader``);
    ``grouped`` says whether ``fn`` is a group function (the caller gave a
    ``group_size``). A loader or work that raises, or a group function that returns
    the wrong number of results, raises :class:`ClientError`. A module-level function
    of picklable arguments: a backend may run it in another process.
    """
    ids = list(client_ids)
    try:
        if not grouped:
            return [fn(broadcast, ids[0], load[0]())]
        outputs = list(fn(broadcast, ids, [loader() for loader in load]))
    except Exception as error:
        raise ClientError(ids, error) from error
    if len(outputs) != len(ids):
        raise ClientError(
            ids,
            ValueError(
                f"the group function returned {len(outputs)} results for {len(ids)} clients"
            ),
        )
    return outputs
