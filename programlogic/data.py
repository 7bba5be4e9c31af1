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
import hashlib
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ClientHandle",
    "ClientSampler",
    "FederatedDataSource",
    "FederatedDataSourceIterator",
    "HandleDataSource",
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
    """Samples clients from a fixed list of handles (what ``InMemoryDataSource.iterator`` gives).

    Handles are sorted by client id once, so the selection depends on the set of ids,
    not on the order they came in. The random words of round ``r`` are the SHAKE-256
    output of ``"{seed}/{r}"`` (``"{seed}/fixed"`` for a fixed cohort): a standard
    that no library upgrade changes, so a resumed run selects what the first run
    selected even on another NumPy or Python. Distinct clients are drawn by a partial
    Fisher-Yates shuffle (words reduced modulo the remaining count; the bias is below
    ``count / 2**64``), so the first ``k`` of a fixed cohort are the same for every
    larger ``k``.
    """

    def __init__(
        self,
        handles: Sequence[ClientHandle],
        seed: int,
        sampling: Sampling | str = Sampling.UNIFORM,
    ) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int >= 0, got {type(seed).__name__} {seed!r}")
        if seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self._handles = sorted(handles)
        if not self._handles:
            raise ValueError("a data source needs at least one client")
        self._seed = seed
        self._sampling = Sampling(sampling)

    def select(self, k: int, round_num: int) -> list[ClientHandle]:
        if not isinstance(k, int) or isinstance(k, bool):
            raise TypeError(f"k must be an int, got {type(k).__name__} {k!r}")
        if k <= 0:
            raise ValueError(f"k must be at least 1 client per round, got {k}")
        count = len(self._handles)
        if k > count and self._sampling is not Sampling.WITH_REPLACEMENT:
            raise ValueError(
                f"cannot select {k} distinct clients from {count} clients; "
                f"lower k or sample with replacement"
            )
        if not isinstance(round_num, int) or isinstance(round_num, bool):
            raise TypeError(
                f"round_num must be an int >= 0, got {type(round_num).__name__} {round_num!r}"
            )
        if round_num < 0:
            raise ValueError(f"round_num must be an int >= 0, got {round_num!r}")
        stream = "fixed" if self._sampling is Sampling.FIXED else str(round_num)
        words = _random_words(f"{self._seed}/{stream}", k)
        handles = self._handles
        if self._sampling is Sampling.WITH_REPLACEMENT:
            return [handles[word % count] for word in words]
        swapped: dict[int, int] = {}
        chosen = []
        for position, word in enumerate(words):
            pick = position + word % (count - position)
            chosen.append(handles[swapped.get(pick, pick)])
            swapped[pick] = swapped.get(position, position)
        return chosen

    def describe(self) -> dict[str, Any]:
        ids = "\n".join(handle.client_id for handle in self._handles)
        return {
            "seed": self._seed,
            "sampling": str(self._sampling),
            "num_clients": len(self._handles),
            "client_ids_sha256": hashlib.sha256(ids.encode()).hexdigest(),
        }


def _random_words(key: str, count: int) -> tuple[int, ...]:
    """``count`` uniformly random 64-bit words determined by ``key``."""
    return struct.unpack(f"<{count}Q", hashlib.shake_256(key.encode()).digest(8 * count))


class HandleDataSource:
    """A data source over a fixed list of client handles, each loading its own data.

    The base of the data sources here: give it the handles (a client id and a loader
    each, loaders picklable for remote backends) and ``sampling`` (see
    :class:`Sampling`). ``client_ids`` keeps the handles' order; ``all_clients`` and
    sampling sort by id.
    """

    def __init__(
        self, handles: Sequence[ClientHandle], *, sampling: Sampling | str = Sampling.UNIFORM
    ) -> None:
        try:
            self._sampling = Sampling(sampling)
        except ValueError:
            choices = ", ".join(repr(str(mode)) for mode in Sampling)
            raise ValueError(f"sampling must be one of {choices}, got {sampling!r}") from None
        self._handles = list(handles)
        if not self._handles:
            raise ValueError("a data source needs at least one client")

    @property
    def client_ids(self) -> list[str]:
        """The ids of every client, in the order of the handles."""
        return [handle.client_id for handle in self._handles]

    def all_clients(self) -> list[ClientHandle]:
        """A handle for every client, sorted by id (e.g. to evaluate on a whole test set)."""
        return sorted(self._handles)

    def iterator(self, seed: int) -> ClientSampler:
        """A sampler of clients seeded with ``seed`` (an int >= 0)."""
        return ClientSampler(self._handles, seed, self._sampling)


class InMemoryDataSource(HandleDataSource):
    """A data source whose client data is held in a mapping ``client id -> data``.

    The data of a client can be anything the learning process understands (arrays,
    lists of batches, ``tf.data.Dataset``). ``sampling`` chooses how rounds pick
    clients (see :class:`Sampling`). The mapping is copied, so changing it afterwards
    changes nothing here.
    """

    def __init__(self, clients: Mapping[str, Any], *, sampling: Sampling | str = Sampling.UNIFORM):
        if not isinstance(clients, Mapping):
            raise TypeError(
                f"clients must be a mapping of client id to data, got {type(clients).__name__}"
            )
        if not clients:
            raise ValueError("clients must hold at least one client")
        for client_id in clients:
            if not isinstance(client_id, str):
                raise TypeError(
                    f"client ids must be str, got {type(client_id).__name__} {client_id!r}"
                )
        self._clients = ClientTable(clients)
        super().__init__(
            [TableLoader(self._clients, client_id).handle() for client_id in clients],
            sampling=sampling,
        )


class ClientTable:
    """The data of every client of an :class:`InMemoryDataSource`, by client id.

    ``key`` names the table across processes: a distributed context ships a table once
    (to its object store) and the handles' loaders refer to it by key.
    """

    __slots__ = ("data", "key")

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = dict(data)
        self.key = uuid.uuid4().hex

    def __getstate__(self) -> tuple[dict[str, Any], str]:
        return self.data, self.key

    def __setstate__(self, state: tuple[dict[str, Any], str]) -> None:
        self.data, self.key = state


class TableLoader:
    """Loads one client's data from a :class:`ClientTable` (picklable with the table)."""

    __slots__ = ("client_id", "table")

    def __init__(self, table: ClientTable, client_id: str) -> None:
        self.table, self.client_id = table, client_id

    def __call__(self) -> Any:
        return self.table.data[self.client_id]

    def __getstate__(self) -> tuple[ClientTable, str]:
        return self.table, self.client_id

    def __setstate__(self, state: tuple[ClientTable, str]) -> None:
        self.table, self.client_id = state

    def handle(self) -> ClientHandle:
        """A handle of the client that this loader loads."""
        return ClientHandle(self.client_id, self)
