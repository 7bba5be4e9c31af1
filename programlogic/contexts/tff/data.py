"""Federated data sources across the TFF boundary, in both directions.

- :class:`FederatedDataSourceFromTFF` makes TFF's data (``tff.program.DatasetDataSource``,
  ``tff.program.ClientIdDataSource``, their iterators, or a
  ``tff.simulation.datasets.ClientData``) a data source of ours: its clients are
  sampled by our :class:`~programlogic.data.ClientSampler`, a pure function of
  ``(seed, round)``, where TFF's own iterators draw from Python's global random
  generator (so a resumed TFF program samples other clients than the uninterrupted one
  would have).
- :class:`FederatedDataSourceForTFF` makes a data source of ours a
  ``tff.program.FederatedDataSource``, for TFF program logic: its iterator selects the
  clients of successive rounds with our sampler, and serializes as the seed and the next
  round, so TFF's program state resumes it where it stopped.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable
from typing import Any, ClassVar

import tensorflow as tf
import tensorflow_federated as tff

from managers.validation import check_callable, check_int
from programlogic.data import (
    ClientHandle,
    FederatedDataSource,
    HandleDataSource,
    Sampling,
    check_distinct_client_ids,
)
from programlogic.exceptions import ResumeError

__all__ = [
    "FederatedDataSourceForTFF",
    "FederatedDataSourceFromTFF",
    "client_dataset_type",
]


class FederatedDataSourceFromTFF(HandleDataSource):
    """TFF's federated data as a data source of ours.

    ``source`` is one of:

    - a ``tff.program.DatasetDataSource`` (or its iterator): one client per
      ``tf.data.Dataset``, in the order given, with ids ``"0"``, ``"1"``, ... zero-padded
      to one width (``"00"`` to ``"11"`` for 12 clients) so that they sort in that order;
      a client's data is its dataset;
    - a ``tff.program.ClientIdDataSource`` (or its iterator): one client per id; a
      client's data is its id, as TFF hands ids to a computation, or ``load(id)`` when
      ``load`` is given (``client_data.create_tf_dataset_for_client``, say);
    - a ``tff.simulation.datasets.ClientData``: one client per id of ``client_ids``; a
      client's data is ``create_tf_dataset_for_client(id)``, made where the client's work
      runs (apply TFF's ``ClientData.preprocess`` first to batch it).

    ``sampling`` chooses how rounds pick clients (:class:`~programlogic.data.Sampling`);
    a round's clients depend only on the seed, the round and the set of client ids. Other
    ``tff.program.FederatedDataSource`` types cannot be listed client by client and raise
    ``TypeError``: wrap their clients in :class:`~programlogic.data.InMemoryDataSource`.
    """

    def __init__(
        self,
        source: Any,
        *,
        sampling: Sampling | str = Sampling.UNIFORM,
        load: Callable[[str], Any] | None = None,
    ) -> None:
        check_callable("load", load, allow_none=True)
        handles, federated_type = _handles(source, load)
        check_distinct_client_ids("source", (handle.client_id for handle in handles))
        super().__init__(handles, sampling=sampling)
        self._source = source
        self._federated_type = federated_type

    @property
    def tff_source(self) -> Any:
        """The TFF source given."""
        return self._source

    @property
    def federated_type(self) -> tff.FederatedType | None:
        """The TFF type of a round's data as TFF's source declares it (None for ClientData)."""
        return self._federated_type


def _handles(source: Any, load: Callable[[str], Any] | None) -> tuple[list[ClientHandle], Any]:
    if isinstance(source, tff.program.DatasetDataSource | tff.program.DatasetDataSourceIterator):
        if load is not None:
            raise TypeError("load applies to client ids; a DatasetDataSource holds its datasets")
        datasets = list(source._datasets)  # TFF 0.87 keeps them here; it is the last release
        width = len(str(len(datasets) - 1))
        handles = [
            ClientHandle(f"{index:0{width}d}", functools.partial(operator.getitem, datasets, index))
            for index in range(len(datasets))
        ]
        return handles, source.federated_type
    if isinstance(source, tff.program.ClientIdDataSource | tff.program.ClientIdDataSourceIterator):
        ids = list(source._client_ids)
        loader: Callable[[str], Any] = _identity if load is None else load
        return [ClientHandle(i, functools.partial(loader, i)) for i in ids], source.federated_type
    if isinstance(source, tff.simulation.datasets.ClientData):
        if load is not None:
            raise TypeError("load applies to client ids; a ClientData makes its own datasets")
        handles = [
            ClientHandle(i, functools.partial(source.create_tf_dataset_for_client, i))
            for i in source.client_ids
        ]
        return handles, None
    raise TypeError(
        "source must be a tff.program.DatasetDataSource, a tff.program.ClientIdDataSource "
        "(or an iterator of either) or a tff.simulation.datasets.ClientData, got "
        f"{type(source).__name__}; other sources cannot be listed client by client: put "
        "their clients in programlogic.InMemoryDataSource"
    )


def _identity(client_id: str) -> str:
    return client_id


class FederatedDataSourceForTFF(tff.program.FederatedDataSource):
    """A data source of ours as a ``tff.program.FederatedDataSource``.

    ``iterator()`` returns a fresh iterator whose ``select(k)`` is the data of
    ``source.iterator(seed).select(k, round)`` for rounds 1, 2, ... in turn (each handle
    loaded, in the order selected). Its ``to_bytes`` holds the seed and the next round,
    so TFF's ``FileProgramStateManager`` restores an iterator that continues where the
    saved one stopped and a resumed TFF program trains on the clients the
    uninterrupted run would have; restoring it over a source that samples other clients
    (other ids, sampling mode or seed) raises :class:`~programlogic.ResumeError`.
    ``federated_type`` is the TFF type of the selected
    data (for datasets: ``tff.FederatedType(tff.SequenceType(element type),
    tff.CLIENTS)``).
    """

    def __init__(
        self, source: FederatedDataSource, federated_type: tff.FederatedType, *, seed: int = 0
    ) -> None:
        if not isinstance(source, FederatedDataSource):
            raise TypeError(
                f"source must be a programlogic FederatedDataSource, got {type(source).__name__}"
            )
        if not isinstance(federated_type, tff.FederatedType):
            raise TypeError(
                f"federated_type must be a tff.FederatedType, got {type(federated_type).__name__}"
            )
        check_int("seed", seed, minimum=0)
        self._source = source
        self._federated_type = federated_type
        self._seed = seed
        # TFF restores an iterator with from_bytes on the saved iterator's class, so each
        # source gets its own subclass that knows the source.
        self._iterator_class = type(
            "SeededIterator", (_SeededIterator,), {"_data_source": self, "__module__": __name__}
        )

    @property
    def federated_type(self) -> tff.FederatedType:
        """The TFF type of the data a round selects."""
        return self._federated_type

    @property
    def source(self) -> FederatedDataSource:
        """Our data source."""
        return self._source

    def iterator(self) -> tff.program.FederatedDataSourceIterator:
        """An iterator at round 1."""
        return self._iterator_class(self._seed, 1)


class _SeededIterator(tff.program.FederatedDataSourceIterator):
    """Selects the clients of successive rounds with our sampler."""

    _data_source: ClassVar[FederatedDataSourceForTFF]

    def __init__(self, seed: int, next_round: int) -> None:
        self._seed = seed
        self._next_round = next_round
        self._sampler = self._data_source.source.iterator(seed)

    @property
    def federated_type(self) -> tff.FederatedType:
        return self._data_source.federated_type

    def select(self, k: int | None = None) -> list[Any]:
        if k is None:
            raise ValueError("k must be the number of clients to select, got None")
        handles = self._sampler.select(k, self._next_round)
        self._next_round += 1
        return [handle.load() for handle in handles]

    def to_bytes(self) -> bytes:
        saved = {
            "seed": self._seed,
            "next_round": self._next_round,
            "sampling": self._sampler.describe(),
        }
        return json.dumps(saved).encode()

    @classmethod
    def from_bytes(cls, buffer: bytes) -> _SeededIterator:
        saved = json.loads(bytes(buffer).decode())
        restored = cls(saved["seed"], saved["next_round"])
        if restored._sampler.describe() != saved["sampling"]:
            raise ResumeError(
                "the saved data iterator sampled other clients: saved "
                f"{saved['sampling']}, this data source {restored._sampler.describe()}"
            )
        return restored

    def __deepcopy__(self, memo: dict[int, Any]) -> _SeededIterator:
        return type(self)(self._seed, self._next_round)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _SeededIterator):
            return NotImplemented
        return (self._data_source, self._seed, self._next_round) == (
            other._data_source,
            other._seed,
            other._next_round,
        )

    __hash__ = None  # type: ignore[assignment]


def client_dataset_type(dataset: tf.data.Dataset) -> tff.FederatedType:
    """The ``federated_type`` of a source whose clients are datasets like ``dataset``."""
    return tff.FederatedType(
        tff.SequenceType(tff.types.tensorflow_to_type(dataset.element_spec)), tff.CLIENTS
    )
