"""Federated data sources and seeded, resumable client sampling.

A data source knows its clients; ``source.iterator(seed)`` gives a sampler whose
``select(k, round_num)`` picks the clients of one round. Sampling is a pure function of
``(seed, round_num)``: no global random state, so a resumed run samples exactly what the
uninterrupted run would have, and rounds may be selected in any order.

Client data is not loaded by ``select``: a :class:`ClientHandle` carries the client id
and a loader, and the data is loaded where the client's work runs.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "ClientHandle",
    "ClientSampler",
    "FederatedDataSource",
    "FederatedDataSourceIterator",
    "InMemoryDataSource",
    "Sampling",
]


class ClientHandle:
    """One client of a round: its id and a loader for its data.

    Handles compare, hash, sort and print by client id. ``load()`` calls the loader;
    backends call it where the client's work runs, so the loader should be cheap to
    move (a picklable callable that reads the data, not the data itself, for remote
    backends).
    """

    __slots__ = ("_loader", "client_id")

    def __init__(self, client_id: str, loader: Callable[[], Any]) -> None:
        if not isinstance(client_id, str):
            raise TypeError(f"client_id must be a str, got {type(client_id).__name__}")
        if not callable(loader):
            raise TypeError(f"loader must be callable, got {type(loader).__name__}")
        self.client_id = client_id
        self._loader = loader

    def load(self) -> Any:
        """The client's data."""
        return self._loader()

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


class Sampling(enum.StrEnum):
    """How a sampler picks the clients of a round."""

    UNIFORM = "uniform"
    """k distinct clients, uniformly at random, new for every round."""
    WITH_REPLACEMENT = "with_replacement"
    """k clients drawn independently; a client may appear more than once in a round."""
    FIXED = "fixed"
    """The same k distinct clients every round, picked once from the seed."""


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
    """A federated data set: a fixed set of clients and their data."""

    @property
    def client_ids(self) -> Sequence[str]:
        """The ids of every client, in a stable order."""
        ...

    def iterator(self, seed: int) -> FederatedDataSourceIterator:
        """A sampler of clients seeded with ``seed`` (an int >= 0)."""
        ...


class ClientSampler:
    """Samples clients by id; what :meth:`InMemoryDataSource.iterator` returns.

    ``make_handle(client_id)`` builds the handle of a selected client. Ids are sorted
    once, so the selection depends on the set of ids, not on the order they came in.
    The random generator of round ``r`` is NumPy's PCG64 seeded with ``[seed, r]``
    (``[seed]`` for a fixed cohort).
    """

    def __init__(
        self,
        client_ids: Sequence[str],
        make_handle: Callable[[str], ClientHandle],
        seed: int,
        sampling: Sampling | str = Sampling.UNIFORM,
    ) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self._ids = sorted(client_ids)
        if not self._ids:
            raise ValueError("a data source needs at least one client")
        self._make_handle = make_handle
        self._seed = seed
        self._sampling = Sampling(sampling)
        self._fixed_order: list[int] | None = None

    def select(self, k: int, round_num: int) -> list[ClientHandle]:
        if not isinstance(k, int) or isinstance(k, bool):
            raise TypeError(f"k must be an int, got {type(k).__name__} {k!r}")
        if k <= 0:
            raise ValueError(f"k must be at least 1 client per round, got {k}")
        if k > len(self._ids) and self._sampling is not Sampling.WITH_REPLACEMENT:
            raise ValueError(
                f"cannot select {k} distinct clients from {len(self._ids)} clients; "
                f"lower k or sample with replacement"
            )
        if not isinstance(round_num, int) or isinstance(round_num, bool) or round_num < 0:
            raise ValueError(f"round_num must be an int >= 0, got {round_num!r}")
        count = len(self._ids)
        if self._sampling is Sampling.FIXED:
            if self._fixed_order is None:
                rng = np.random.default_rng([self._seed])
                self._fixed_order = rng.permutation(count).tolist()
            indices = self._fixed_order[:k]
        else:
            rng = np.random.default_rng([self._seed, round_num])
            replace = self._sampling is Sampling.WITH_REPLACEMENT
            indices = rng.choice(count, size=k, replace=replace).tolist()
        return [self._make_handle(self._ids[index]) for index in indices]

    def describe(self) -> dict[str, Any]:
        digest = hashlib.sha256("\n".join(self._ids).encode()).hexdigest()
        return {
            "seed": self._seed,
            "sampling": str(self._sampling),
            "num_clients": len(self._ids),
            "client_ids_sha256": digest,
        }


class InMemoryDataSource:
    """A data source whose client data is held in a mapping ``client id -> data``.

    The data of a client can be anything the learning process understands (arrays,
    lists of batches, ``tf.data.Dataset``). ``sampling`` chooses how rounds pick
    clients (see :class:`Sampling`). The mapping is copied, so changing it afterwards
    changes nothing here.
    """

    def __init__(self, clients: Mapping[str, Any], *, sampling: Sampling | str = Sampling.UNIFORM):
        if not isinstance(clients, Mapping):
            raise TypeError(f"clients must be a mapping of client id to data, got {type(clients).__name__}")
        if not clients:
            raise ValueError("clients must hold at least one client")
        for client_id in clients:
            if not isinstance(client_id, str):
                raise TypeError(f"client ids must be str, got {type(client_id).__name__} {client_id!r}")
        try:
            self._sampling = Sampling(sampling)
        except ValueError:
            choices = ", ".join(repr(str(mode)) for mode in Sampling)
            raise ValueError(f"sampling must be one of {choices}, got {sampling!r}") from None
        self._clients = dict(clients)

    @property
    def client_ids(self) -> list[str]:
        return list(self._clients)

    def iterator(self, seed: int) -> ClientSampler:
        return ClientSampler(self.client_ids, self._handle, seed, self._sampling)

    def _handle(self, client_id: str) -> ClientHandle:
        return ClientHandle(client_id, functools.partial(_lookup, self._clients, client_id))


def _lookup(clients: Mapping[str, Any], client_id: str) -> Any:
    return clients[client_id]
