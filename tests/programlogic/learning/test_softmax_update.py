"""The softmax regression's compiled client loop trains as the traced TensorFlow graph does."""

import functools

import numpy as np
import pytest
from learning_support import CLASSES, FEATURES, handles, known_weights, make_client

from programlogic import LocalContext
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.learning import (
    _softmax_update,
    adam,
    build_fed_sgd,
    build_weighted_fed_avg,
    build_weighted_fed_prox,
    clipping,
    mean,
    median,
    mlp,
    sgd,
    softmax_regression,
)
from programlogic.learning._client_update import train_group_graph
from programlogic.learning._grouped import functional_model
from programlogic.learning._softmax_update import SoftmaxGroupUpdate, softmax_group_update
from programlogic.learning._tensorflow import CompiledFunction, keras, tf
from programlogic.learning.keras_model import stack_clients

pytestmark = pytest.mark.anyio

SHUFFLED = Preprocessing(epochs=2, batch_size=4, shuffle_buffer=8)


def softmax_model() -> keras.Model:
    return softmax_regression((FEATURES,), CLASSES)


def softmax_activation_model() -> keras.Model:
    """The softmax as the dense layer's activation, the input given as a 2x4 image."""
    return keras.Sequential(
        [
            keras.Input((2, FEATURES // 2)),
            keras.layers.Flatten(),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ]
    )


def logits_model() -> keras.Model:
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])


def regularized_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(CLASSES, kernel_regularizer="l2"),
            keras.layers.Softmax(),
        ]
    )


def channels_first_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((2, FEATURES // 2, 1)),
            keras.layers.Flatten(data_format="channels_first"),
            keras.layers.Dense(CLASSES),
            keras.layers.Softmax(),
        ]
    )


MODELS = {
    "softmax layer": (softmax_model, None),
    "softmax activation": (softmax_activation_model, None),
    "logits": (logits_model, keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
}


def a_group(model_fn, sizes=(3, 9, 12, 0), group_size=5, seed=7):
    """Ragged clients (one without examples) and a padding slot, shuffled batches."""
    clients = [make_client(count, seed + index) for index, count in enumerate(sizes)]
    if model_fn is softmax_activation_model:
        clients = [ClientArrays(c.x.reshape(-1, 2, FEATURES // 2), c.y) for c in clients]
    examples = [SHUFFLED.examples(client) for client in clients]
    orders = [SHUFFLED.order(len(client.y), 100 + i) for i, client in enumerate(examples)]
    return stack_clients(examples, orders, group_size)


def both_updates(model_name, rate=0.4, proximal=0.0, weighting="num_examples", aggregator=None):
    model_fn, loss = MODELS[model_name]
    model = functional_model(model_fn, loss, ("sparse_categorical_accuracy",))
    config = (sgd(rate), proximal, weighting, mean() if aggregator is None else aggregator)
    loop = softmax_group_update(model, *config)
    graph = CompiledFunction(functools.partial(train_group_graph, model, *config))
    return model_fn, loop, graph


def assert_same_update(loop_result, graph_result) -> None:
    (loop_partial, loop_finite, loop_sums), (graph_partial, graph_finite, graph_sums) = (
        loop_result,
        graph_result,
    )
    np.testing.assert_array_equal(loop_finite, np.asarray(graph_finite))
    assert set(loop_sums) == set(graph_sums)
    for name, value in graph_sums.items():
        np.testing.assert_allclose(loop_sums[name], np.asarray(value), rtol=1e-5, err_msg=name)
    tf.nest.assert_same_structure(loop_partial, graph_partial)
    for loop_part, graph_part in zip(
        tf.nest.flatten(loop_partial), tf.nest.flatten(graph_partial), strict=True
    ):
        np.testing.assert_allclose(loop_part, np.asarray(graph_part), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("proximal", [0.0, 0.3])
async def test_the_loop_equals_the_traced_graph_on_ragged_shuffled_clients(
    model_name, proximal
) -> None:
    model_fn, loop, graph = both_updates(model_name, proximal=proximal)
    assert isinstance(loop, SoftmaxGroupUpdate)
    weights = known_weights()
    group = a_group(model_fn)

    result = loop(weights["trainable"], [], group, {})

    assert_same_update(result, graph(weights["trainable"], [], group, {}))
    _, finite, sums = result
    assert list(sums["num_examples"]) == [6.0, 18.0, 24.0, 0.0, 0.0]
    assert finite.all()


@pytest.mark.parametrize(
    "weighting, aggregator",
    [("uniform", None), ("num_examples", clipping(0.05)), ("num_examples", median())],
)
async def test_the_loop_folds_its_deltas_as_the_graph_does(weighting, aggregator) -> None:
    aggregator = mean() if aggregator is None else aggregator
    _, loop, graph = both_updates("softmax layer", weighting=weighting, aggregator=aggregator)
    params = aggregator.params(aggregator.initialize())
    group = a_group(softmax_model)
    weights = known_weights()["trainable"]

    assert_same_update(loop(weights, [], group, params), graph(weights, [], group, params))


async def test_a_label_outside_the_classes_leaves_the_client_out_as_the_graph_does() -> None:
    _, loop, graph = both_updates("softmax layer")
    good, bad = make_client(8, 1), make_client(8, 2)
    bad = ClientArrays(bad.x, np.where(np.arange(8) == 3, CLASSES + 2, bad.y).astype(np.int32))
    examples = [SHUFFLED.examples(client) for client in (good, bad)]
    group = stack_clients(examples, [SHUFFLED.order(8, 1), SHUFFLED.order(8, 2)], 2)
    weights = known_weights()["trainable"]

    partial, finite, sums = loop(weights, [], group, {})

    assert list(finite) == [True, False]
    assert np.isnan(sums["loss_sum"][1])
    assert partial["weight"] == 16.0  # the good client's examples alone
    # The broken client's accuracy on NaN probabilities is the argmax's convention; the
    # rest of what the loop returns is the graph's.
    graph_partial, graph_finite, graph_sums = graph(weights, [], group, {})
    assert np.isnan(graph_sums["loss_sum"][1])
    good_sums = {name: value[:1] for name, value in sums.items()}
    graph_good = {name: np.asarray(value)[:1] for name, value in graph_sums.items()}
    assert_same_update((partial, finite, good_sums), (graph_partial, graph_finite, graph_good))


async def test_one_hot_labels_are_refused_with_their_shape() -> None:
    _, loop, _ = both_updates("softmax layer")
    client = make_client(4, 0)
    one_hot = ClientArrays(client.x, np.eye(CLASSES, dtype=np.float32)[client.y])
    group = stack_clients([SHUFFLED.examples(one_hot)], [SHUFFLED.order(4, 0)], 1)

    with pytest.raises(ValueError, match=r"one class index an example.*\(3,\)"):
        loop(known_weights()["trainable"], [], group, {})


@pytest.mark.parametrize(
    "build",
    [
        functools.partial(
            build_weighted_fed_avg, functools.partial(mlp, (FEATURES,), CLASSES, 4), sgd(0.1)
        ),
        functools.partial(build_weighted_fed_avg, softmax_model, sgd(0.1, momentum=0.5)),
        functools.partial(build_weighted_fed_avg, softmax_model, adam(0.1)),
        functools.partial(build_weighted_fed_avg, regularized_model, sgd(0.1)),
        functools.partial(build_weighted_fed_avg, channels_first_model, sgd(0.1)),
        functools.partial(build_weighted_fed_avg, softmax_model, sgd(0.1), metrics=("accuracy",)),
        functools.partial(build_weighted_fed_avg, softmax_model, sgd(0.1), loss="mse"),
        functools.partial(build_fed_sgd, softmax_model),
    ],
    ids=[
        "mlp",
        "momentum",
        "adam",
        "regularizer",
        "channels first",
        "other metric",
        "other loss",
        "fed sgd",
    ],
)
async def test_other_models_and_optimizers_train_in_the_traced_graph(build) -> None:
    assert isinstance(build()._compiled, CompiledFunction)


async def run_rounds(process, rounds=3):
    state = process.set_model_weights(process.initialize(), known_weights())
    clients = handles({str(i): make_client(count, i) for i, count in enumerate((3, 7, 12, 5))})
    history = []
    async with LocalContext(max_workers=2):
        for _ in range(rounds):
            output = await process.next(state, clients)
            state = output.state
            history.append(output)
    return history


@pytest.mark.parametrize("build", [build_weighted_fed_avg, build_weighted_fed_prox])
async def test_a_run_without_the_extension_trains_the_model_the_loop_trains(
    build, monkeypatch
) -> None:
    def process():
        if build is build_weighted_fed_prox:
            return build(softmax_model, 0.2, sgd(0.3), preprocess=SHUFFLED, seed=5)
        return build(softmax_model, sgd(0.3), preprocess=SHUFFLED, seed=5)

    with_loop = process()
    assert isinstance(with_loop._compiled, SoftmaxGroupUpdate)
    looped = await run_rounds(with_loop)
    monkeypatch.setattr(_softmax_update, "_softmax_kernel", None)
    without = process()
    assert isinstance(without._compiled, CompiledFunction)
    traced = await run_rounds(without)

    for loop_output, graph_output in zip(looped, traced, strict=True):
        for loop_weight, graph_weight in zip(
            loop_output.state["model"]["trainable"],
            graph_output.state["model"]["trainable"],
            strict=True,
        ):
            np.testing.assert_allclose(loop_weight, graph_weight, rtol=1e-5, atol=1e-6)
        loop_train = loop_output.metrics["client_work"]["train"]
        graph_train = graph_output.metrics["client_work"]["train"]
        assert loop_train.keys() == graph_train.keys()
        for name, value in graph_train.items():
            assert loop_train[name] == pytest.approx(value, rel=1e-5), name


async def test_an_install_with_a_c_compiler_builds_the_loop() -> None:
    # The development install (and CI's) compiles the extension; a user's install
    # without a compiler goes on without it (setup.py: optional), into the graph.
    assert _softmax_update._softmax_kernel is not None
    assert isinstance(build_weighted_fed_avg(softmax_model)._compiled, SoftmaxGroupUpdate)


async def test_without_the_extension_a_softmax_process_says_so_in_the_log(
    monkeypatch, caplog
) -> None:
    monkeypatch.setattr(_softmax_update, "_softmax_kernel", None)
    with caplog.at_level("INFO", logger="programlogic.learning._softmax_update"):
        build_weighted_fed_avg(softmax_model, sgd(0.25))
        assert "was not built" in caplog.text
        caplog.clear()
        build_weighted_fed_avg(softmax_model, adam(0.1))  # would not use it anyway
    assert caplog.text == ""
