"""Federated data sources and seeded, resumable client sampling.

A data source knows its clients; ``source.iterator(seed)`` gives a sampler whose
``select(k, round_num)`` picks the clients of one round. Sampling is a pure function of
``(seed, round_num)``: no global random state, so a resumed run samples exactly what the
uninterrupted run would have, and rounds may be selected in any order.

Client data is not loaded by ``select``: a :class:`ClientHandle` carries the client id
and a loader, and the data is loaded where the client's work runs.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import json
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from managers.structure import flatten
from managers.validation import (
    check_callable,
    check_choice,
    check_int,
    check_str,
    check_type,
    describe,
)
from programlogic._poisson import poisson_select

__all__ = [
    "AllClientsDataSource",
    "ClientHandle",
    "ClientSampler",
    "ClientTable",
    "FederatedDataSource",
    "FederatedDataSourceIterator",
    "HandleDataSource",
    "InMemoryDataSource",
    "Sampling",
    "TableBackedLoader",
    "TableLoader",
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


class Sampling(enum.StrEnum):
    """How a sampler picks the clients of a round."""

    UNIFORM = "uniform"
    """k distinct clients, uniformly at random, new for every round."""
    WITH_REPLACEMENT = "with_replacement"
    """k clients drawn independently; a client may appear more than once in a round."""
    FIXED = "fixed"
    """The same k distinct clients every round, picked once from the seed."""
    POISSON = "poisson"
    """Each client joins a round with probability k / N (its coin keyed by seed, round, id)."""


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


class ClientSampler:
    """Samples clients from a fixed list of handles (what ``InMemoryDataSource.iterator`` gives).

    Handles are sorted by client id once, so the selection depends on the set of ids,
    not on the order they came in; an id given twice is a ``ValueError``. The random
    words of round ``r`` are the SHAKE-256 output of ``"{seed}/{r}"``
    (``"{seed}/fixed"`` for a fixed cohort): a standard that no library upgrade
    changes, so a resumed run selects what the first run selected even on another
    NumPy or Python. Distinct clients are drawn by a partial Fisher-Yates shuffle
    (words reduced modulo the remaining count; the bias is below ``count / 2**64``), so
    the first ``k`` of a fixed cohort are the same for every larger ``k``.
    """

    def __init__(
        self,
        handles: Sequence[ClientHandle],
        seed: int,
        sampling: Sampling | str = Sampling.UNIFORM,
    ) -> None:
        check_int("seed", seed, minimum=0)
        self._handles = sorted(handles)
        if not self._handles:
            raise ValueError(f"handles must hold at least one client, got {handles!r}")
        check_distinct_client_ids("handles", (handle.client_id for handle in self._handles))
        self._seed = seed
        self._sampling = check_choice("sampling", sampling, Sampling)

    def select(self, k: int, round_num: int) -> list[ClientHandle]:
        check_int("k", k, minimum=1)
        check_int("round_num", round_num, minimum=0)
        count = len(self._handles)
        if k > count and self._sampling is not Sampling.WITH_REPLACEMENT:
            raise ValueError(
                f"cannot select {k} distinct clients from {count} clients; "
                f"lower k or sample with replacement"
            )
        if self._sampling is Sampling.POISSON:  # see poisson_select for the coins
            return poisson_select(self._handles, self._seed, k, round_num)
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


def _data_shapes(data: Any) -> list[list[Any]]:
    """``[path, shape, dtype]`` of each array of ``data``, ``[path, type]`` of other values."""
    shapes: list[list[Any]] = []
    for path, leaf in flatten(data):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        try:
            shapes.append([path, [int(size) for size in shape], str(dtype)])
        except TypeError:  # not an array, or of a size known only when it is read
            shapes.append([path, type(leaf).__name__])
    return shapes


def _random_words(key: str, count: int) -> tuple[int, ...]:
    """``count`` uniformly random 64-bit words determined by ``key``."""
    return struct.unpack(f"<{count}Q", hashlib.shake_256(key.encode()).digest(8 * count))


class HandleDataSource:
    """A data source over a fixed list of client handles, each loading its own data.

    The base of the data sources here: give it the handles (a client id and a loader
    each, loaders picklable for remote backends) and ``sampling`` (see
    :class:`Sampling`). ``client_ids`` keeps the handles' order; ``all_clients`` and
    sampling sort by id. Client ids must be distinct: a duplicated id is a
    ``ValueError`` naming it (see :func:`check_distinct_client_ids`).
    """

    def __init__(
        self, handles: Sequence[ClientHandle], *, sampling: Sampling | str = Sampling.UNIFORM
    ) -> None:
        self._sampling = check_choice("sampling", sampling, Sampling)
        self._handles = list(handles)
        if not self._handles:
            raise ValueError(f"handles must hold at least one client, got {handles!r}")
        check_distinct_client_ids("handles", self.client_ids)

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

    def describe_configuration(self) -> dict[str, Any] | None:
        """The shapes of the clients' data, hashed, when they are known without loading.

        ``{"client_data_shapes_sha256": ...}`` over every client's id and the shape and
        dtype of each array (or the type of each other value) of its data, when every
        loader reads from a table held in memory (:class:`TableBackedLoader`, as
        :class:`InMemoryDataSource`'s do); ``None`` otherwise. The ids themselves are in
        the sampler's description. ``train_model`` records it to refuse resuming on
        other client data (of other sizes).
        """
        loaders = [handle.loader for handle in self._handles]
        if not all(isinstance(loader, TableBackedLoader) for loader in loaders):
            return None
        shapes = sorted(
            (loader.client_id, _data_shapes(loader.table.data[loader.client_id]))
            for loader in loaders
        )
        digest = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()
        return {"client_data_shapes_sha256": digest}


class InMemoryDataSource(HandleDataSource):
    """A data source whose client data is held in a mapping ``client id -> data``.

    The data of a client can be anything the learning process understands (arrays,
    lists of batches, ``tf.data.Dataset``). ``sampling`` chooses how rounds pick
    clients (see :class:`Sampling`). The mapping is copied, so changing it afterwards
    changes nothing here.
    """

    def __init__(self, clients: Mapping[str, Any], *, sampling: Sampling | str = Sampling.UNIFORM):
        check_type("clients", clients, Mapping)
        if not clients:
            raise ValueError(f"clients must hold at least one client, got {describe(clients)}")
        for client_id in clients:
            if not isinstance(client_id, str):
                raise TypeError(f"client ids must be str, got {describe(client_id)}")
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


@runtime_checkable
class TableBackedLoader(Protocol):
    """A loader that reads one client's data from a table many loaders share.

    What a loader may offer a remote backend: instead of pickling the table with every
    client of a round, the backend ships ``table`` once per ``table.key`` (a string
    that names the table in every process) and loads the client's data on the worker as
    ``table.data[client_id]``, which must equal what calling the loader returns.
    :class:`TableLoader` is the implementation; ``RayContext`` ships tables this way.
    """

    @property
    def table(self) -> ClientTable:
        """The table holding the data of this loader's client."""
        ...

    @property
    def client_id(self) -> str:
        """The client whose data this loader loads from ``table``."""
        ...

    def __call__(self) -> Any:
        """The client's data."""
        ...


class TableLoader:
    """Loads one client's data from a :class:`ClientTable` (picklable with the table).

    A :class:`TableBackedLoader`: remote backends ship its table once.
    """

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
