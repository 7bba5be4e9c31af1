"""Data sources over client handles, and in-memory client data shared as one table.

:class:`HandleDataSource` samples a fixed list of handles (each loads its own data);
:class:`InMemoryDataSource` holds every client's data in a :class:`ClientTable`, which a
remote backend ships once (:class:`TableBackedLoader`) instead of with every client.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from managers.structure import flatten
from managers.validation import (
    check_choice,
    check_type,
    describe,
)
from programlogic.data.protocols import ClientHandle, check_distinct_client_ids
from programlogic.data.sampling import ClientSampler, Sampling

__all__ = [
    "ClientTable",
    "HandleDataSource",
    "InMemoryDataSource",
    "TableBackedLoader",
    "TableLoader",
]


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
