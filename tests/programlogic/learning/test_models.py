import keras
import numpy as np
import pytest

from programlogic.learning import MODELS, build_model, cnn, mlp, softmax_regression

pytestmark = pytest.mark.anyio

SHAPES = [(64,), (784,), (28, 28)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", ["softmax", "mlp", "cnn"])
async def test_every_model_is_built_and_predicts_a_distribution(name: str, shape) -> None:
    model = build_model(name, shape, num_classes=7)

    assert isinstance(model, keras.Model) and model.built
    assert tuple(model.inputs[0].shape) == (None, *shape)
    assert tuple(model.outputs[0].shape) == (None, 7)
    x = np.random.default_rng(0).random((2, *shape), dtype=np.float32)
    predicted = np.asarray(model(x))
    assert predicted.shape == (2, 7)
    np.testing.assert_allclose(predicted.sum(axis=1), 1.0, rtol=1e-5)


async def test_models_are_named_as_the_main_job_names_them() -> None:
    assert MODELS == {"softmax": softmax_regression, "mlp": mlp, "cnn": cnn}


async def test_seeded_models_are_reproducible_and_the_seed_matters() -> None:
    def weights(model: keras.Model) -> list[np.ndarray]:
        return [np.asarray(w) for w in model.weights]

    first, again, other = cnn((8, 8), seed=3), cnn((8, 8), seed=3), cnn((8, 8), seed=4)
    np.testing.assert_equal(weights(again), weights(first))
    assert not np.array_equal(weights(other)[0], weights(first)[0])
    np.testing.assert_equal(weights(mlp((5,), seed=1)), weights(mlp((5,), seed=1)))


async def test_model_sizes_follow_their_arguments() -> None:
    assert [w.shape for w in mlp((6,), 3, hidden=5).weights] == [(6, 5), (5,), (5, 3), (3,)]
    shapes = [tuple(w.shape) for w in cnn((16,), 2, filters=4).weights]
    assert shapes[:4] == [(3, 3, 1, 4), (4,), (3, 3, 4, 8), (8,)]
    assert shapes[-2][-1] == 2 and shapes[-1] == (2,)


@pytest.mark.parametrize("shape", [(10, 12), (50,), (2, 3, 4)], ids=str)
async def test_cnn_needs_a_square_image(shape) -> None:
    with pytest.raises(ValueError, match=r"cnn needs a square image, got input_shape \("):
        cnn(shape)


@pytest.mark.parametrize(
    ("shape", "error", "message"),
    [
        ((), ValueError, r"input_shape must be a non-empty tuple of ints >= 1, got \(\)"),
        ((0,), ValueError, r"input_shape must be .* got \(0,\)"),
        ((28, -1), ValueError, r"input_shape must be .* got \(28, -1\)"),
        ((2.0,), TypeError, r"input_shape must be .* got tuple \(2.0,\)"),
        ((True,), TypeError, r"input_shape must be .* got tuple \(True,\)"),
        (784, TypeError, r"input_shape must be .* got int 784"),
    ],
    ids=str,
)
async def test_input_shapes_must_be_positive_ints(shape, error, message) -> None:
    with pytest.raises(error, match=message):
        softmax_regression(shape)


async def test_build_model_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match="name must be one of 'softmax', 'mlp', 'cnn', got 'rnn'"):
        build_model("rnn", (64,))
