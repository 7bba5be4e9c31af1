"""Keras metrics and losses in FedAvg and FedEval: summed states, centralized references."""

import functools
import pickle

import keras
import numpy as np
import pytest
from learning_support import CLASSES, FEATURES, handles, known_weights, make_client

from programlogic import LocalContext
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.learning import (
    SummableMetric,
    build_fed_eval,
    build_weighted_fed_avg,
    sgd,
    softmax_regression,
)

pytestmark = pytest.mark.anyio

SMALL_MODEL = functools.partial(softmax_regression, (FEATURES,), CLASSES)
ONE_PASS = Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0)


def ragged() -> dict[str, ClientArrays]:
    """Five clients of unequal sizes: with 2 a group they make 3 groups, one partial."""
    sizes = {"a": 3, "b": 11, "c": 6, "d": 1, "e": 9}
    return {cid: make_client(size, 40 + seed) for seed, (cid, size) in enumerate(sizes.items())}


def classification_metrics() -> list:
    return [
        "sparse_categorical_accuracy",
        keras.metrics.SparseTopKCategoricalAccuracy(k=2),
        keras.metrics.SparseCategoricalCrossentropy(),
    ]


def central(metric_objects, outputs, y) -> dict[str, float]:
    """Each metric over the union of the clients' examples, updated once, with Keras."""
    results = {}
    for metric in metric_objects:
        metric.reset_state()
        metric.update_state(y, outputs)
        results[SummableMetric(metric).name] = float(metric.result())  # auc_1 is released as auc
    return results


def softmax_outputs(weights, x) -> np.ndarray:
    kernel, bias = weights["trainable"]
    return keras.ops.convert_to_numpy(keras.activations.softmax(x @ kernel + bias))


async def run_round(process, state, clients):
    async with LocalContext(max_workers=2):
        return await process.next(state, handles(clients))


async def test_evaluation_metrics_are_of_the_union_of_the_clients_data() -> None:
    process = build_fed_eval(
        SMALL_MODEL, metrics=classification_metrics(), preprocess=ONE_PASS, clients_per_group=2
    )
    weights = known_weights()
    clients = ragged()
    output = await run_round(
        process, process.set_model_weights(process.initialize(), weights), clients
    )

    x = np.concatenate([data.x for data in clients.values()])
    y = np.concatenate([data.y for data in clients.values()])
    expected = central(
        [
            keras.metrics.SparseCategoricalAccuracy(),
            keras.metrics.SparseTopKCategoricalAccuracy(k=2),
            keras.metrics.SparseCategoricalCrossentropy(),
        ],
        softmax_outputs(weights, x),
        y,
    )
    released = output.metrics["client_work"]["eval"]["current_round_metrics"]
    for name, value in expected.items():
        assert released[name] == pytest.approx(value, abs=1e-6), name
    assert released["num_examples"] == len(y)
    # The round's accuracy is of the summed states, not the mean of the client accuracies.
    client_means = [
        np.mean(np.argmax(softmax_outputs(weights, data.x), axis=1) == data.y)
        for data in clients.values()
    ]
    assert abs(np.mean(client_means) - released["sparse_categorical_accuracy"]) > 1e-3


def binary_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(
                1, activation="sigmoid", kernel_initializer=keras.initializers.GlorotUniform(0)
            ),
        ]
    )


def binary_clients() -> dict[str, ClientArrays]:
    clients = {}
    for index, size in enumerate((5, 13, 2, 8)):
        rng = np.random.default_rng(60 + index)
        x = rng.random((size, FEATURES), dtype=np.float32)
        y = (rng.random(size) < 0.4).astype(np.float32)
        clients[str(index)] = ClientArrays(x, y)
    return clients


async def test_confusion_count_metrics_sum_across_clients_and_groups() -> None:
    def metrics():
        return [
            keras.metrics.AUC(num_thresholds=50),
            keras.metrics.Precision(thresholds=0.45),
            keras.metrics.Recall(thresholds=0.45),
            keras.metrics.BinaryAccuracy(),
            keras.metrics.MeanSquaredError(),
            keras.metrics.MeanAbsoluteError(),
        ]

    process = build_fed_eval(
        binary_model,
        loss=keras.losses.BinaryCrossentropy(),
        metrics=metrics(),
        preprocess=ONE_PASS,
        clients_per_group=3,
    )
    state = process.initialize()
    clients = binary_clients()
    output = await run_round(process, state, clients)

    model = binary_model()
    model.set_weights(state["model"]["trainable"])
    x = np.concatenate([data.x for data in clients.values()])
    y = np.concatenate([data.y for data in clients.values()])[:, None]
    outputs = keras.ops.convert_to_numpy(model(x))
    released = output.metrics["client_work"]["eval"]["current_round_metrics"]
    for name, value in central(metrics(), outputs, y).items():
        assert released[name] == pytest.approx(value, abs=1e-6), name
    bce = keras.ops.convert_to_numpy(keras.losses.binary_crossentropy(y, outputs))
    assert released["loss"] == pytest.approx(float(bce.mean()), rel=1e-5)
    assert 0 < released["precision"] < 1 and 0 < released["auc"] < 1


async def test_training_metrics_with_a_frozen_model_are_those_of_the_union() -> None:
    # A client learning rate of 0 keeps every client's model at the broadcast one, so
    # the metrics of the training batches are the metrics of the initial model.
    process = build_weighted_fed_avg(
        SMALL_MODEL,
        sgd(0.0),
        metrics=classification_metrics(),
        preprocess=ONE_PASS,
        clients_per_group=2,
    )
    weights = known_weights()
    clients = ragged()
    output = await run_round(
        process, process.set_model_weights(process.initialize(), weights), clients
    )

    x = np.concatenate([data.x for data in clients.values()])
    y = np.concatenate([data.y for data in clients.values()])
    expected = central(
        [
            keras.metrics.SparseCategoricalAccuracy(),
            keras.metrics.SparseTopKCategoricalAccuracy(k=2),
            keras.metrics.SparseCategoricalCrossentropy(),
        ],
        softmax_outputs(weights, x),
        y,
    )
    train = output.metrics["client_work"]["train"]
    for name, value in expected.items():
        assert train[name] == pytest.approx(value, abs=1e-6), name
    assert train["num_examples"] == len(y)


async def test_a_metric_whose_state_does_not_sum_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'mean_io_u' \(MeanIoU\) is not summable"):
        build_weighted_fed_avg(SMALL_MODEL, metrics=[keras.metrics.MeanIoU(num_classes=3)])
    with pytest.raises(ValueError, match=r"\(R2Score\) is not summable"):
        build_fed_eval(SMALL_MODEL, metrics=[keras.metrics.R2Score()])
    with pytest.raises(ValueError, match="two metrics are named 'auc'"):
        build_fed_eval(SMALL_MODEL, metrics=["auc", keras.metrics.AUC(name="auc")])


def linear_clients(w: np.ndarray, b: float) -> dict[str, ClientArrays]:
    clients = {}
    for index in range(6):
        rng = np.random.default_rng(80 + index)
        size = 20 + 7 * index
        x = rng.normal(size=(size, len(w))).astype(np.float32)
        y = (x @ w + b + rng.normal(scale=0.01, size=size)).astype(np.float32)
        clients[f"client{index}"] = ClientArrays(x, y)
    return clients


def linear_model() -> keras.Model:
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="zeros")])


async def test_federated_linear_regression_recovers_the_weights() -> None:
    w, b = np.array([1.5, -2.0, 0.5]), 0.25
    clients = linear_clients(w, b)
    process = build_weighted_fed_avg(
        linear_model,
        sgd(0.05),
        loss="mse",
        metrics=[keras.metrics.MeanAbsoluteError()],
        preprocess=Preprocessing(epochs=2, batch_size=8, shuffle_buffer=16),
    )
    state = process.initialize()
    released = []
    async with LocalContext(max_workers=2):
        for _ in range(15):
            output = await process.next(state, handles(clients))
            state = output.state
            released.append(output.metrics["client_work"]["train"])

    kernel, bias = process.get_model_weights(state)["trainable"]
    np.testing.assert_allclose(kernel[:, 0], w, atol=0.02)
    assert float(bias[0]) == pytest.approx(b, abs=0.02)
    assert released[0]["mean_absolute_error"] > 1.0
    assert released[-1]["mean_absolute_error"] < 0.02
    assert released[-1]["loss"] < 1e-3

    evaluation = build_fed_eval(
        linear_model, loss=keras.losses.Huber(delta=0.5), metrics=["mae"], preprocess=ONE_PASS
    )
    eval_state = evaluation.set_model_weights(
        evaluation.initialize(), process.get_model_weights(state)
    )
    output = await run_round(evaluation, eval_state, clients)
    final = output.metrics["client_work"]["eval"]["current_round_metrics"]
    x = np.concatenate([data.x for data in clients.values()])
    y = np.concatenate([data.y for data in clients.values()])
    error = np.abs(x @ kernel[:, 0] + bias[0] - y)
    assert final["mean_absolute_error"] == pytest.approx(error.mean(), rel=1e-4)
    assert final["loss"] == pytest.approx(np.mean(0.5 * error**2), rel=1e-3)


async def test_configuration_names_metric_and_loss_objects_by_class_and_values() -> None:
    process = build_weighted_fed_avg(
        SMALL_MODEL,
        loss=keras.losses.Huber(delta=2.0),
        metrics=["sparse_categorical_accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3)],
    )
    model = process.describe_configuration()["model"]
    assert model["loss"] == {"class": "Huber", "delta": 2.0}
    assert model["metrics"][0] == "sparse_categorical_accuracy"
    assert model["metrics"][1]["class"] == "SparseTopKCategoricalAccuracy"
    assert model["metrics"][1]["config"]["k"] == 3
    default = build_weighted_fed_avg(SMALL_MODEL).describe_configuration()["model"]
    assert default["loss"] == {"class": "SparseCategoricalCrossentropy", "from_logits": False}
    assert default["metrics"] == ["sparse_categorical_accuracy"]


async def test_metric_objects_pickle_with_the_process() -> None:
    process = build_fed_eval(
        SMALL_MODEL, metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=2), "auc"]
    )
    copy = pickle.loads(pickle.dumps(process))
    assert copy.model.metrics == process.model.metrics
    assert [metric.name for metric in copy.model.metrics] == [
        "sparse_top_k_categorical_accuracy",
        "auc",
    ]
    assert isinstance(copy.model.metrics[0], SummableMetric)


async def test_evaluation_totals_sum_vector_states_over_rounds() -> None:
    process = build_fed_eval(
        binary_model,
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(num_thresholds=30), keras.metrics.Precision()],
        preprocess=ONE_PASS,
    )
    state = process.initialize()
    clients = binary_clients()
    names = list(clients)
    async with LocalContext(max_workers=2):
        first = await process.next(state, handles({n: clients[n] for n in names[:2]}))
        second = await process.next(first.state, handles({n: clients[n] for n in names[2:]}))

    model = binary_model()
    model.set_weights(state["model"]["trainable"])
    x = np.concatenate([data.x for data in clients.values()])
    y = np.concatenate([data.y for data in clients.values()])[:, None]
    expected = central(
        [keras.metrics.AUC(num_thresholds=30), keras.metrics.Precision()],
        keras.ops.convert_to_numpy(model(x)),
        y,
    )
    totals = second.metrics["client_work"]["eval"]["total_rounds_metrics"]
    assert totals["auc"] == pytest.approx(expected["auc"], abs=1e-6)
    assert totals["precision"] == pytest.approx(expected["precision"], abs=1e-6)
    assert totals["num_examples"] == len(y)
    assert second.state["totals"]["auc/0"].shape == (30,)
