"""The compiled client update (both builds of the loop) trains a softmax regression as the
traced TensorFlow graph does, to float32 rounding."""

import functools

import numpy as np
import pytest
from learning_support import CLASSES, FEATURES, known_weights, make_client

from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.learning import (
    clipping,
    mean,
    median,
    sgd,
    softmax_regression,
)
from programlogic.learning._grouped import functional_model
from programlogic.learning._tensorflow import CompiledFunction, keras, tf
from programlogic.learning.client_update.compiled import SoftmaxGroupUpdate, unsupported
from programlogic.learning.client_update.traced import train_group_graph
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


def both_updates(
    model_name, rate=0.4, proximal=0.0, weighting="num_examples", aggregator=None, portable=False
):
    model_fn, loss = MODELS[model_name]
    model = functional_model(model_fn, loss, ("sparse_categorical_accuracy",))
    config = (proximal, weighting, mean() if aggregator is None else aggregator)
    assert unsupported(model, sgd(rate)) is None
    loop = SoftmaxGroupUpdate(model, rate, *config, portable=portable)
    graph = CompiledFunction(functools.partial(train_group_graph, model, sgd(rate), *config))
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


@pytest.mark.parametrize("portable", [False, True], ids=["default", "baseline"])
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("proximal", [0.0, 0.3])
async def test_the_loop_equals_the_traced_graph_on_ragged_shuffled_clients(
    model_name, proximal, portable
) -> None:
    model_fn, loop, graph = both_updates(model_name, proximal=proximal, portable=portable)
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
@pytest.mark.parametrize("portable", [False, True], ids=["default", "baseline"])
async def test_the_loop_folds_its_deltas_as_the_graph_does(weighting, aggregator, portable) -> None:
    aggregator = mean() if aggregator is None else aggregator
    _, loop, graph = both_updates(
        "softmax layer", weighting=weighting, aggregator=aggregator, portable=portable
    )
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
