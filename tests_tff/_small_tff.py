"""A small TFF FedAvg process and a fixed cohort of its clients, as TFF programs build them."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from programlogic.contexts.tff.context import _stop_runtime


class FixedCohort(tff.program.FederatedDataSourceIterator):
    """The same clients every round (TFF's own sources sample with the global RNG)."""

    def __init__(self, datasets: list[tf.data.Dataset]) -> None:
        self._datasets = datasets

    @classmethod
    def source(cls, datasets: list[tf.data.Dataset]) -> tff.program.FederatedDataSource:
        cohort = cls(datasets)

        class Source(tff.program.FederatedDataSource):
            federated_type = cohort.federated_type

            def iterator(self) -> FixedCohort:
                return cohort

        return Source()

    @property
    def federated_type(self) -> tff.FederatedType:
        return tff.FederatedType(
            tff.SequenceType(tff.types.tensorflow_to_type(self._datasets[0].element_spec)),
            tff.CLIENTS,
        )

    def select(self, k: int | None = None) -> list[tf.data.Dataset]:
        return self._datasets[:k]

    def to_bytes(self) -> bytes:
        return b""

    @classmethod
    def from_bytes(cls, buffer: bytes) -> FixedCohort:
        raise NotImplementedError("the test never resumes")

    def __deepcopy__(self, memo: dict[int, object]) -> FixedCohort:
        return self


def tiny_tff_fed_avg(
    num_clients: int = 3,
) -> tuple[tff.templates.IterativeProcess, list[tf.data.Dataset]]:
    """TFF FedAvg on ``num_clients`` clients of 12 examples, 4 features, 3 classes."""
    rng = np.random.default_rng(0)
    datasets = [
        tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(
                x=rng.random((12, 4), dtype=np.float32),
                y=rng.integers(0, 3, (12, 1)).astype(np.int32),
            )
        ).batch(4)
        for _ in range(num_clients)
    ]
    spec = datasets[0].element_spec

    def model_fn() -> tff.learning.models.VariableModel:
        keras_model = tf.keras.Sequential(
            [
                tf.keras.layers.InputLayer(input_shape=(4,)),
                tf.keras.layers.Dense(3, kernel_initializer="zeros"),
                tf.keras.layers.Softmax(),
            ]
        )
        return tff.learning.models.from_keras_model(
            keras_model,
            input_spec=spec,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(),
            metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
        )

    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.5),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    )
    return process, datasets


@contextlib.contextmanager
def native_context() -> Iterator[None]:
    """TFF's own program context installed, its worker process stopped on leaving."""
    runtime = tff.backends.native.create_async_local_cpp_execution_context()
    try:
        with tff.framework.get_context_stack().install(tff.program.NativeFederatedContext(runtime)):
            yield
    finally:
        _stop_runtime(runtime)  # TFF would leave its worker process to the garbage collector
