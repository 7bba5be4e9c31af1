"""The TFF backend kept to the contracts of the kit: TFFContext, FederatedDataSourceFromTFF and
TFFLearningProcess run the same suites as the library's own implementations.

Asyncio only, as every TFF test here: TFF's runtime runs on threads of its own,
whichever event loop drives ours.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from conftest import model_fn

from programlogic import ClientHandle
from programlogic.contexts.tff import (
    FederatedDataSourceFromTFF,
    TFFContext,
    TFFLearningProcess,
    build_tff_evaluation,
)
from programlogic.testing.contracts import (
    FederatedContextContract,
    FederatedDataSourceContract,
    LearningProcessContract,
)


class AsyncioOnly:
    @pytest.fixture(params=["asyncio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        return request.param


class TestTFFContext(AsyncioOnly, FederatedContextContract):
    @pytest.fixture
    def make_context(self) -> Callable[[], TFFContext]:
        return TFFContext


def numbered_datasets(count: int) -> list[tf.data.Dataset]:
    return [tf.data.Dataset.from_tensor_slices(np.full((3, 2), i, np.int32)) for i in range(count)]


class DatasetContract(FederatedDataSourceContract):
    """A data source whose clients load a ``tf.data.Dataset``."""

    def assert_same_data(self, actual: Any, expected: Any) -> None:
        assert isinstance(actual, tf.data.Dataset), type(actual)
        np.testing.assert_equal(
            list(actual.as_numpy_iterator()), list(expected.as_numpy_iterator())
        )


class TestTFFDatasetDataSource(AsyncioOnly, DatasetContract):
    loaders_pickle = False  # a client's loader holds its tf.data.Dataset: TFFContext is local

    @pytest.fixture
    def make_source(self) -> Callable[[], FederatedDataSourceFromTFF]:
        datasets = numbered_datasets(6)
        return lambda: FederatedDataSourceFromTFF(tff.program.DatasetDataSource(datasets))


class TestTFFClientDataDataSource(AsyncioOnly, DatasetContract):
    loaders_pickle = False  # the loader is a method of TFF's ClientData

    @pytest.fixture
    def make_source(self) -> Callable[[], FederatedDataSourceFromTFF]:
        client_data = tff.simulation.datasets.TestClientData(
            {f"w{i}": collections.OrderedDict(x=np.full((2, 1), i, np.int32)) for i in range(5)}
        )
        return lambda: FederatedDataSourceFromTFF(client_data)


class TestTFFClientIdDataSource(AsyncioOnly, FederatedDataSourceContract):
    @pytest.fixture
    def make_source(self) -> Callable[[], FederatedDataSourceFromTFF]:
        arrays = {f"id{i}": np.arange(i + 1) for i in range(5)}
        return lambda: FederatedDataSourceFromTFF(
            tff.program.ClientIdDataSource(list(arrays)), load=arrays.__getitem__
        )


class TestTFFLearningProcess(AsyncioOnly, LearningProcessContract):
    @pytest.fixture
    def process(self, fedavg: tff.learning.templates.LearningProcess) -> TFFLearningProcess:
        return TFFLearningProcess(fedavg)

    @pytest.fixture
    def clients(self, data_source) -> Sequence[ClientHandle]:
        return data_source.iterator(0).select(3, 1)

    @pytest.fixture
    def make_context(self) -> Callable[[], TFFContext]:
        return TFFContext


@functools.cache
def tff_evaluation() -> TFFLearningProcess:
    return build_tff_evaluation(model_fn)


class TestTFFEvaluation(AsyncioOnly, LearningProcessContract):
    @pytest.fixture
    def process(self) -> TFFLearningProcess:
        return tff_evaluation()

    @pytest.fixture
    def clients(self, data_source) -> Sequence[ClientHandle]:
        return data_source.iterator(0).select(3, 1)

    @pytest.fixture
    def make_context(self) -> Callable[[], TFFContext]:
        return TFFContext
