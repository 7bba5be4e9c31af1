"""What a federated data source is: client handles, sources and their samplers.

A data source knows its clients; ``source.iterator(seed)`` gives a sampler whose
``select(k, round_num)`` picks the clients of one round. Sampling is a pure function of
``(seed, round_num)``: no global random state, so a resumed run samples exactly what the
uninterrupted run would have, and rounds may be selected in any order.

Client data is not loaded by ``select``: a :class:`ClientHandle` carries the client id
and a loader, and the data is loaded where the client's work runs.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from managers.validation import (
    check_callable,
    check_str,
)

__all__ = [
    "AllClientsDataSource",
    "ClientHandle",
    "FederatedDataSource",
    "FederatedDataSourceIterator",
    "check_distinct_client_ids",
]

_DUPLICATES_SHOWN = 5


def check_distinct_client_ids(argument: str, client_ids: Iterable[str]) -> None:
    """Raise ``ValueError`` when an id occurs more than once in ``client_ids``.

    The message names ``argument``, the first duplicated ids (in order of first
    appearance) and how many ids are duplicated: a round of distinct clients drawn
    from a list that holds an id twice could hold that client twice.
    """
    counts = collections.Counter(client_ids)
    duplicated = [client_id for client_id, count in counts.items() if count > 1]
    if not duplicated:
        return
    shown = f"{duplicated[:_DUPLICATES_SHOWN]!r}"
    if len(duplicated) > _DUPLICATES_SHOWN:
        shown += f" and {len(duplicated) - _DUPLICATES_SHOWN} more"
    appear = "id appears" if len(duplicated) == 1 else "ids appear"
    raise ValueError(
        f"{argument} holds duplicated client ids: {shown} ({len(duplicated)} {appear} "
        "more than once); every client of a data source needs an id of its own"
    )


class ClientHandle:
    """One client of a round: its id and a loader for its data.

    Handles compare, hash, sort and print by client id. ``load()`` calls the loader;
    backends call it where the client's work runs, so the loader should be cheap to
    move (a picklable callable that reads the data, not the data itself, for remote
    backends).
    """

    __slots__ = ("_loader", "client_id")

    def __init__(self, client_id: str, loader: Callable[[], Any]) -> None:
        check_str("client_id", client_id)
        check_callable("loader", loader)
        self.client_id = client_id
        self._loader = loader

    def load(self) -> Any:
        """The client's data."""
        return self._loader()

    @property
    def loader(self) -> Callable[[], Any]:
        """The callable that loads the client's data (what backends ship to workers)."""
        return self._loader

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClientHandle):
            return self.client_id == other.client_id
        return NotImplemented

    def __lt__(self, other: ClientHandle) -> bool:
        if isinstance(other, ClientHandle):
            return self.client_id < other.client_id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.client_id)

    def __repr__(self) -> str:
        return f"ClientHandle({self.client_id!r})"

    def __str__(self) -> str:
        return self.client_id


@runtime_checkable
class FederatedDataSourceIterator(Protocol):
    """Picks the clients of each round; a pure function of its seed and the round."""

    def select(self, k: int, round_num: int) -> list[ClientHandle]:
        """The ``k`` clients of round ``round_num``."""
        ...

    def describe(self) -> dict[str, Any]:
        """A JSON-compatible description of the sampling (seed, mode, which clients).

        Two iterators that describe themselves equally select the same clients; a
        program stores it with its checkpoints to refuse resuming with another one.
        """
        ...


@runtime_checkable
class FederatedDataSource(Protocol):
    """A federated data set: a fixed set of clients and their data.

    Client ids are distinct. Optionally, a plain method ``describe_configuration()``
    returns a JSON-able dict telling its data apart from other data with the same ids
    (their sizes, say; the ids are in the sampler's ``describe()``), or ``None``:
    ``train_model`` records it and refuses to resume on other data unless told to
    (:meth:`HandleDataSource.describe_configuration` is the built-in one).
    """

    @property
    def client_ids(self) -> Sequence[str]:
        """The ids of every client, in a stable order."""
        ...

    def iterator(self, seed: int) -> FederatedDataSourceIterator:
        """A sampler of clients seeded with ``seed`` (an int >= 0)."""
        ...


@runtime_checkable
class AllClientsDataSource(FederatedDataSource, Protocol):
    """A data source that can also list every client (what ``evaluate_once`` evaluates on)."""

    def all_clients(self) -> list[ClientHandle]:
        """A handle for every client, sorted by id."""
        ...
