"""The learning processes of the library kept to the LearningProcess contract.

FedAvg and FedEval compile TensorFlow code: they run on one tiny model (4 features,
3 classes, 3 clients of a few examples).
"""

import functools
from collections.abc import Sequence

import numpy as np
import pytest

from programlogic import ClientHandle, InMemoryDataSource, LearningProcessOutput
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.testing import FakeDataSource, FakeLearningProcess
from programlogic.testing.contracts import LearningProcessContract

FEATURES, CLASSES = 4, 3


class TestFakeLearningProcess(LearningProcessContract):
    @pytest.fixture
    def process(self) -> FakeLearningProcess:
        return FakeLearningProcess(dim=3)

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return FakeDataSource(5, dim=3).iterator(1).select(3, 1)


class SyncRunningMean:
    """A process whose four methods are plain functions: next runs through context.run."""

    def initialize(self) -> dict:
        return {"mean": np.zeros(3), "examples": np.int64(0)}

    def next(self, state: dict, clients: Sequence[ClientHandle]) -> LearningProcessOutput:
        datas = [np.asarray(client.load()) for client in clients]
        examples = state["examples"] + sum(len(data) for data in datas)
        total = state["mean"] * state["examples"] + sum(data.sum(axis=0) for data in datas)
        metrics = {"client_work": {"train": {"num_examples": int(examples)}}}
        return LearningProcessOutput({"mean": total / examples, "examples": examples}, metrics)

    def get_model_weights(self, state: dict) -> np.ndarray:
        return state["mean"]

    def set_model_weights(self, state: dict, weights: np.ndarray) -> dict:
        return {**state, "mean": np.asarray(weights, dtype=np.float64)}


class TestSyncLearningProcess(LearningProcessContract):
    @pytest.fixture
    def process(self) -> SyncRunningMean:
        return SyncRunningMean()

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return FakeDataSource(4, dim=3).all_clients()


@functools.cache
def tiny_clients() -> list[ClientHandle]:
    clients = {}
    for index, count in enumerate((3, 6, 5)):
        rng = np.random.default_rng(index)
        x = rng.random((count, FEATURES), dtype=np.float32)
        clients[f"c{index}"] = ClientArrays(x, rng.integers(0, CLASSES, count).astype(np.int32))
    return InMemoryDataSource(clients).all_clients()


@functools.cache
def fed_avg():
    from programlogic.learning import build_weighted_fed_avg, softmax_regression

    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (FEATURES,), CLASSES),
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=8),
        seed=5,
    )


@functools.cache
def fed_eval():
    from programlogic.learning import build_fed_eval, softmax_regression

    return build_fed_eval(functools.partial(softmax_regression, (FEATURES,), CLASSES))


class TestWeightedFedAvg(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return fed_avg()

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()


class TestFedEval(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return fed_eval()

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()
