import functools
import itertools
import math
import pickle

import keras
import numpy as np
import pytest

from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.learning import FunctionalModel, softmax_regression
from programlogic.learning.keras_model import bucket, stack_clients

pytestmark = pytest.mark.anyio


async def test_bucket_keeps_small_counts_and_pads_larger_ones_by_under_a_quarter() -> None:
    assert [bucket(n) for n in range(1, 9)] == list(range(1, 9))
    assert bucket(0) == 1
    assert [bucket(n) for n in (9, 11, 13, 15, 17, 100, 1000)] == [10, 12, 14, 16, 20, 112, 1024]
    sizes = [bucket(n) for n in range(1, 10_001)]
    for n, size in enumerate(sizes, start=1):
        assert size >= n
        assert (size - n) / size < 0.25, n
        if size > 8:  # m * 2**e with m in 4..7
            exponent = size.bit_length() - 3
            assert size % 2**exponent == 0 and 4 <= size // 2**exponent <= 7, size
    assert all(a <= b for a, b in itertools.pairwise(sizes))
    assert len(set(sizes)) <= 8 + 4 * math.ceil(math.log2(10_000))


def client(count: int, seed: int) -> ClientArrays:
    rng = np.random.default_rng(seed)
    return ClientArrays(rng.random((count, 2), dtype=np.float32), np.arange(count) % 3 + 1)


async def test_stack_clients_pads_clients_to_a_bucket_and_the_group_to_its_size() -> None:
    preprocess = Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0)
    small, large = client(3, 0), client(35, 1)  # 1 and 9 batches; 9 pads to 10
    examples = [preprocess.examples(small), preprocess.examples(large)]
    orders = [preprocess.order(3, 0), preprocess.order(35, 0)]

    group = stack_clients(examples, orders, group_size=3)

    assert group.x.shape == (3, 40, 2) and group.x.dtype == np.float32  # 35 pads to 40
    assert group.y.shape == (3, 40) and group.y.dtype == np.int32
    assert group.indices.shape == (3, 10, 4) and group.indices.dtype == np.int32
    assert group.mask.shape == (3, 10, 4) and group.mask.dtype == np.float32
    np.testing.assert_array_equal(group.x[0, :3], small.x)
    np.testing.assert_array_equal(group.x[1, :35], large.x)
    np.testing.assert_array_equal(group.y[1, :35], large.y)
    assert group.mask[0].sum() == 3 and group.mask[1].sum() == 35 and group.mask[2].sum() == 0
    assert group.mask[1, 8].tolist() == [1, 1, 1, 0] and not group.mask[1, 9].any()
    # Gathering by the indices gives the preprocessed batches wherever the mask is set.
    for index, data in enumerate((small, large)):
        batches = preprocess(data, 0)
        count = len(batches.mask)
        gathered = np.take(group.x[index], group.indices[index, :count], axis=0)
        np.testing.assert_array_equal(gathered[batches.mask == 1], batches.x[batches.mask == 1])
    # Padding examples are zero and padding slots point at example 0.
    assert not group.x[0, 3:].any() and not group.x[2].any()
    assert not group.indices[group.mask == 0].any()


async def test_stack_clients_with_whole_batches_pads_examples_to_the_batch_slots() -> None:
    # 9 and 12 examples pad to 10 and 12 (two shapes), but both fill 3 batches of 4.
    preprocess = Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0)
    shapes = set()
    for data in (client(9, 2), client(12, 3)):
        examples, order = [preprocess.examples(data)], [preprocess.order(len(data.y), 0)]
        assert stack_clients(examples, order, 1).x.shape[1] == bucket(len(data.y))

        group = stack_clients(examples, order, 1, whole_batches=True)

        shapes.add(tuple(array.shape for array in group))
        np.testing.assert_array_equal(group.x[0, : len(data.y)], data.x)
        assert not group.x[0, len(data.y) :].any()
        assert group.mask.sum() == len(data.y)
    assert shapes == {((1, 12, 2), (1, 12), (1, 3, 4), (1, 3, 4), (1, 0, 2))}


def linear_model() -> keras.Model:
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Softmax()])


LOSS = keras.losses.SparseCategoricalCrossentropy()


@pytest.mark.parametrize(
    ("model_fn", "loss", "metrics", "error", "message"),
    [
        (42, LOSS, (), TypeError, "model_fn must be callable, got int"),
        (lambda: "model", LOSS, (), TypeError, "model_fn must return a keras.Model, got str"),
        (
            lambda: keras.Sequential([keras.layers.Dense(3)]),
            LOSS,
            (),
            ValueError,
            r"model_fn must return a built model with weights: start it with keras\.Input",
        ),
        (linear_model, 3, (), TypeError, "loss must be a keras"),
        (linear_model, "no_such_loss", (), ValueError, "Keras knows no loss named 'no_such_loss'"),
        (
            linear_model,
            LOSS,
            ("no_such_metric",),
            ValueError,
            "Keras knows no metric named 'no_such_metric'",
        ),
        (
            linear_model,
            LOSS,
            "sparse_categorical_accuracy",
            TypeError,
            "metrics must be a sequence of Keras metrics or their names, got str "
            "'sparse_categorical_accuracy'",
        ),
    ],
    ids=[
        "not-callable",
        "not-a-model",
        "unbuilt",
        "loss-type",
        "loss-name",
        "unknown-metric",
        "metrics-str",
    ],
)
async def test_functional_model_refuses_bad_arguments(model_fn, loss, metrics, error, message):
    with pytest.raises(error, match=message):
        FunctionalModel(model_fn, loss, metrics)


@functools.cache
def functional_linear_model() -> FunctionalModel:
    return FunctionalModel(linear_model, LOSS)


async def test_initial_weights_and_check_weights_convert_to_the_model_dtypes() -> None:
    model = functional_linear_model()
    initial = model.initial_weights()
    assert [w.shape for w in initial["trainable"]] == [(4, 3), (3,)]
    assert initial["non_trainable"] == []
    assert model.input_shape == (4,)
    assert [metric.name for metric in model.metrics] == ["sparse_categorical_accuracy"]

    given = {"trainable": [np.ones((4, 3)), [0.5, 0.25, 0.0]], "non_trainable": ()}
    checked = model.check_weights(given)

    assert [w.dtype for w in checked["trainable"]] == [np.float32, np.float32]
    np.testing.assert_array_equal(checked["trainable"][1], [0.5, 0.25, 0.0])
    assert checked["non_trainable"] == []


@pytest.mark.parametrize(
    ("weights", "error", "message"),
    [
        ([np.ones((4, 3)), np.ones(3)], TypeError, "a dict with the keys 'trainable' and"),
        ({"trainable": [np.ones((4, 3)), np.ones(3)]}, TypeError, "got dict"),
        (
            {"trainable": [np.ones((4, 3))], "non_trainable": []},
            ValueError,
            "model weights 'trainable' holds 1 arrays, the model has 2",
        ),
        (
            {"trainable": [np.ones((4, 3)), np.ones(3)], "non_trainable": [np.ones(1)]},
            ValueError,
            "model weights 'non_trainable' holds 1 arrays, the model has 0",
        ),
        (
            {"trainable": [np.ones((4, 3)), np.ones(4)], "non_trainable": []},
            ValueError,
            r"model weights trainable\[1\] \(\S+/bias\) has shape \(4,\), the model expects \(3,\)",
        ),
        (
            {"trainable": [np.ones((3, 4)), np.ones(3)], "non_trainable": []},
            ValueError,
            r"trainable\[0\] \(\S+/kernel\) has shape \(3, 4\), the model expects \(4, 3\)",
        ),
    ],
    ids=["list", "missing-part", "too-few", "too-many-non-trainable", "bias-shape", "kernel-shape"],
)
async def test_check_weights_names_the_part_index_and_shapes(weights, error, message) -> None:
    with pytest.raises(error, match=message):
        functional_linear_model().check_weights(weights)


async def test_a_model_built_with_build_is_accepted() -> None:
    def built() -> keras.Model:
        model = keras.Sequential([keras.layers.Dense(3), keras.layers.Softmax()])
        model.build((None, 4))
        return model

    model = FunctionalModel(built, LOSS)
    assert model.input_shape == (4,)
    assert [w.shape for w in model.initial_weights()["trainable"]] == [(4, 3), (3,)]


async def test_a_model_with_non_trainable_weights_lists_them_apart() -> None:
    def normalized() -> keras.Model:
        return keras.Sequential(
            [keras.Input((4,)), keras.layers.BatchNormalization(), keras.layers.Dense(2)]
        )

    weights = FunctionalModel(normalized, LOSS).initial_weights()
    assert [w.shape for w in weights["trainable"]] == [(4,), (4,), (4, 2), (2,)]
    assert [w.shape for w in weights["non_trainable"]] == [(4,), (4,)]


async def test_softmax_regression_has_zero_weights_like_the_tutorial() -> None:
    weights = FunctionalModel(functools.partial(softmax_regression, (5,), 4), LOSS)
    kernel, bias = weights.initial_weights()["trainable"]
    assert kernel.shape == (5, 4) and not kernel.any() and not bias.any()


async def test_a_functional_model_pickles_with_its_weights() -> None:
    model = functional_linear_model()
    for variable in model.model.trainable_variables:
        variable.assign(np.full(variable.shape, 0.25, dtype=np.float32))
    copy = pickle.loads(pickle.dumps(model))
    assert copy.metrics == model.metrics and copy.input_shape == model.input_shape
    copied, original = copy.initial_weights(), model.initial_weights()
    for a, b in zip(copied["trainable"], original["trainable"], strict=True):
        np.testing.assert_array_equal(a, b)
