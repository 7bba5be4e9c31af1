"""The learning processes of the library kept to the LearningProcess contract.

FedAvg and FedEval compile TensorFlow code: they run on one tiny model (4 features,
3 classes, 3 clients of a few examples).
"""

import functools
from collections.abc import Sequence

import numpy as np
import pytest

from programlogic import ClientHandle, InMemoryDataSource, LearningProcessOutput, LocalContext
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.testing import FakeDataSource, FakeLearningProcess
from programlogic.testing.contracts import LearningProcessContract

FEATURES, CLASSES = 4, 3


class TestFakeLearningProcess(LearningProcessContract):
    @pytest.fixture
    def process(self) -> FakeLearningProcess:
        return FakeLearningProcess(dim=3)

    @pytest.fixture
    def make_process(self):
        return lambda: FakeLearningProcess(dim=3)

    @pytest.fixture
    def other_process(self) -> FakeLearningProcess:
        return FakeLearningProcess(dim=3, learning_rate=0.1)

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
def fed_avg(client_optimizer=None):
    from programlogic.learning import build_weighted_fed_avg, softmax_regression

    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (FEATURES,), CLASSES),
        client_optimizer,
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=8),
        seed=5,
    )


@functools.cache
def fed_eval(preprocess=None):
    from programlogic.learning import build_fed_eval, softmax_regression

    model_fn = functools.partial(softmax_regression, (FEATURES,), CLASSES)
    return build_fed_eval(model_fn, preprocess=preprocess)


class TestWeightedFedAvg(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return fed_avg()

    @pytest.fixture
    def make_process(self):
        return fed_avg.__wrapped__

    @pytest.fixture
    def other_process(self):
        from programlogic.learning import sgd

        return fed_avg.__wrapped__(sgd(0.01))

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()


class TestFedEval(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return fed_eval()

    @pytest.fixture
    def make_process(self):
        return fed_eval.__wrapped__

    @pytest.fixture
    def other_process(self):
        return fed_eval.__wrapped__(Preprocessing(epochs=1, batch_size=7, shuffle_buffer=0))

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()


class Unstable(FakeLearningProcess):
    """A process whose description holds something of the object (as ``repr`` would)."""

    def describe_configuration(self) -> dict:
        return {**super().describe_configuration(), "built": id(self)}


@pytest.mark.anyio
async def test_the_suite_fails_a_description_that_differs_between_builds() -> None:
    suite = TestFakeLearningProcess()
    with pytest.raises(AssertionError, match="must describe the same configuration"):
        await suite.test_a_process_built_again_describes_the_same_configuration(
            Unstable(dim=3), lambda: Unstable(dim=3)
        )
    with pytest.raises(AssertionError, match="must return JSON"):
        await suite.test_a_configuration_description_is_a_json_dict_the_same_each_time(
            type(
                "Tupled", (FakeLearningProcess,), {"describe_configuration": lambda _: {"a": (1,)}}
            )()
        )


class Growing(FakeLearningProcess):
    """A process whose state keeps a growing history: it could not resume."""

    async def initialize(self) -> dict:
        return {**await super().initialize(), "history": []}

    async def next(self, state, clients):
        own = {"weights": state["weights"], "rounds": state["rounds"]}
        output = await super().next(own, clients)
        history = [*state["history"], output.metrics["client_work"]["train"]["loss"]]
        return LearningProcessOutput({**output.state, "history": history}, output.metrics)


@pytest.mark.anyio
async def test_the_suite_fails_a_state_whose_structure_drifts() -> None:
    suite = TestFakeLearningProcess()
    clients = FakeDataSource(5, dim=2).iterator(1).select(3, 1)
    async with LocalContext(max_workers=2) as context:
        with pytest.raises(AssertionError, match=r"keep the paths.*history/0: shape"):
            await suite.test_next_keeps_the_structure_of_the_initial_state(
                Growing(), clients, context
            )


@functools.cache
def fed_prox(proximal_strength=0.5):
    from programlogic.learning import build_unweighted_fed_prox, softmax_regression

    return build_unweighted_fed_prox(
        functools.partial(softmax_regression, (FEATURES,), CLASSES),
        proximal_strength,
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=8),
        seed=5,
    )


class TestFedProx(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return fed_prox()

    @pytest.fixture
    def make_process(self):
        return fed_prox.__wrapped__

    @pytest.fixture
    def other_process(self):
        return fed_prox.__wrapped__(0.1)

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()


@functools.cache
def fed_sgd(server_optimizer=None):
    from programlogic.learning import build_fed_sgd, softmax_regression

    return build_fed_sgd(
        functools.partial(softmax_regression, (FEATURES,), CLASSES),
        server_optimizer,
        preprocess=Preprocessing(epochs=1, batch_size=4, shuffle_buffer=8),
        seed=5,
    )


class TestFedSGD(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return fed_sgd()

    @pytest.fixture
    def make_process(self):
        return fed_sgd.__wrapped__

    @pytest.fixture
    def other_process(self):
        from programlogic.learning import sgd

        return fed_sgd.__wrapped__(sgd(0.5))

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()


@functools.cache
def with_keras_metrics(kind: str, k: int = 2):
    import keras

    from programlogic.learning import build_fed_eval, build_weighted_fed_avg, softmax_regression

    model_fn = functools.partial(softmax_regression, (FEATURES,), CLASSES)
    metrics = ["sparse_categorical_accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=k)]
    if kind == "eval":
        return build_fed_eval(model_fn, loss="sparse_categorical_crossentropy", metrics=metrics)
    return build_weighted_fed_avg(
        model_fn,
        loss="sparse_categorical_crossentropy",
        metrics=metrics,
        preprocess=Preprocessing(epochs=1, batch_size=4, shuffle_buffer=8),
        seed=5,
    )


class TestFedAvgWithKerasMetrics(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return with_keras_metrics("train")

    @pytest.fixture
    def make_process(self):
        return functools.partial(with_keras_metrics.__wrapped__, "train")

    @pytest.fixture
    def other_process(self):
        return with_keras_metrics.__wrapped__("train", k=1)

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()


class TestFedEvalWithKerasMetrics(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return with_keras_metrics("eval")

    @pytest.fixture
    def make_process(self):
        return functools.partial(with_keras_metrics.__wrapped__, "eval")

    @pytest.fixture
    def other_process(self):
        return with_keras_metrics.__wrapped__("eval", k=1)

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()


@functools.cache
def robust_fed_avg(clip_norm=0.05):
    from programlogic.learning import (
        build_weighted_fed_avg,
        clipping,
        softmax_regression,
        trimmed_mean,
    )

    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (FEATURES,), CLASSES),
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=8),
        seed=5,
        model_aggregator=clipping(clip_norm, trimmed_mean(0.2)),
    )


class TestFedAvgWithClippedTrimmedMean(LearningProcessContract):
    @pytest.fixture
    def process(self):
        return robust_fed_avg()

    @pytest.fixture
    def make_process(self):
        return robust_fed_avg.__wrapped__

    @pytest.fixture
    def other_process(self):
        return robust_fed_avg.__wrapped__(0.5)

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        return tiny_clients()
