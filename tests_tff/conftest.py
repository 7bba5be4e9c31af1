"""Fixtures of the TensorFlow Federated tests: run them in the venv of scripts/install_tff.sh.

One tiny FedAvg process (a linear Keras model on 8 features, 3 classes) and one small
synthetic federated data set serve every test, so TFF compiles each process once.
The clients' data is the same ``tf.data.Dataset`` whether our data source or the TFF
data source below hands it out, so TFF's program logic and ours see equal inputs.
"""

from __future__ import annotations

import collections
import os
import warnings

import numpy as np
import pytest

from programlogic import InMemoryDataSource

# TensorFlow, TFF and their dependencies warn about each other; the project's
# `filterwarnings = error` is for warnings of this project, which still fail a test.
THIRD_PARTY = r"(tensorflow|keras|tensorflow_federated|jax|ml_dtypes|tree|absl|google)(\..*)?"
warnings_of_tff = [
    f"ignore::DeprecationWarning:{THIRD_PARTY}",
    f"ignore::PendingDeprecationWarning:{THIRD_PARTY}",
    f"ignore::FutureWarning:{THIRD_PARTY}",
    f"ignore::UserWarning:{THIRD_PARTY}",
]


def pytest_configure(config: pytest.Config) -> None:
    for line in warnings_of_tff:
        config.addinivalue_line("filterwarnings", line)


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tensorflow as tf
    import tensorflow_federated as tff

NUM_CLIENTS = 12
PER_ROUND = 4
SEED = 3
FEATURES = 8
CLASSES = 3
ELEMENT_SPEC = collections.OrderedDict(
    x=tf.TensorSpec([None, FEATURES], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """asyncio: TFF's runtime runs on its own threads, whichever loop drives ours."""
    return "asyncio"


def model_fn() -> tff.learning.models.VariableModel:
    """A linear classifier with zero initial weights: every initialize() is equal."""
    keras_model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
            tf.keras.layers.Dense(CLASSES, kernel_initializer="zeros"),
        ]
    )
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=ELEMENT_SPEC,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )


def client_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each client's (x, y): 10 to 30 examples, a class-dependent mean shift."""
    rng = np.random.default_rng(0)
    clients = {}
    for index in range(NUM_CLIENTS):
        size = int(rng.integers(10, 31))
        y = rng.integers(0, CLASSES, size).astype(np.int32)
        x = (rng.normal(size=(size, FEATURES)) + y[:, None]).astype(np.float32)
        clients[f"client_{index:02d}"] = (x, y)
    return clients


def to_dataset(arrays: tuple[np.ndarray, np.ndarray]) -> tf.data.Dataset:
    """A client's arrays as the batched dataset the process trains on."""
    x, y = arrays
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(8)


def build_fedavg() -> tff.learning.templates.LearningProcess:
    """FedAvg of :func:`model_fn`'s model; server momentum, so the state holds more than weights."""
    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0, momentum=0.9),
    )


@pytest.fixture(scope="session")
def fedavg() -> tff.learning.templates.LearningProcess:
    """The TFF FedAvg process every training test runs."""
    return build_fedavg()


@pytest.fixture(scope="session")
def arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return client_arrays()


@pytest.fixture(scope="session")
def datasets(arrays) -> dict[str, tf.data.Dataset]:
    return {client_id: to_dataset(data) for client_id, data in arrays.items()}


@pytest.fixture(scope="session")
def data_source(datasets) -> InMemoryDataSource:
    """Our data source whose clients load their ``tf.data.Dataset``."""
    return InMemoryDataSource(datasets)
