"""Keras models for the built-in examples: the tutorial's softmax regression, an MLP, a CNN.

Each function returns a new, built model, so it can serve as the ``model_fn`` of
:func:`~programlogic.learning.build_weighted_fed_avg` through ``functools.partial``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from managers.validation import check_choice, check_shape
from programlogic.learning._tensorflow import keras

__all__ = ["MODELS", "build_model", "cnn", "mlp", "softmax_regression"]


def _check_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    return check_shape("input_shape", input_shape, allow_empty=False)


def softmax_regression(input_shape: Sequence[int], num_classes: int = 10) -> keras.Model:
    """The TFF EMNIST tutorial's model: flatten, one dense layer initialized to zeros, softmax."""
    shape = _check_shape(input_shape)
    return keras.Sequential(
        [
            keras.Input(shape),
            keras.layers.Reshape((math.prod(shape),)),
            keras.layers.Dense(num_classes, kernel_initializer="zeros"),
            keras.layers.Softmax(),
        ]
    )


def mlp(
    input_shape: Sequence[int], num_classes: int = 10, hidden: int = 128, seed: int = 0
) -> keras.Model:
    """Flatten, a ReLU hidden layer of ``hidden`` units, softmax; weights drawn from ``seed``."""
    shape = _check_shape(input_shape)
    return keras.Sequential(
        [
            keras.Input(shape),
            keras.layers.Reshape((math.prod(shape),)),
            keras.layers.Dense(
                hidden, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed)
            ),
            keras.layers.Dense(
                num_classes, kernel_initializer=keras.initializers.GlorotUniform(seed + 1)
            ),
            keras.layers.Softmax(),
        ]
    )


def cnn(
    input_shape: Sequence[int], num_classes: int = 10, filters: int = 32, seed: int = 0
) -> keras.Model:
    """A small CNN for square images (given as ``(h, w)`` or ``(h, w, 1)``, or flattened).

    A flattened input of ``n`` features is read as a ``sqrt(n) x sqrt(n)`` image. Two
    3x3 convolutions (the second strided), flatten, a dense softmax.
    """
    shape = _check_shape(input_shape)
    size = math.prod(shape)
    side = math.isqrt(size)
    if side * side != size:
        raise ValueError(f"cnn needs a square image, got input_shape {input_shape!r}")
    init = keras.initializers.GlorotUniform
    return keras.Sequential(
        [
            keras.Input(shape),
            keras.layers.Reshape((side, side, 1)),
            keras.layers.Conv2D(
                filters, 3, padding="same", activation="relu", kernel_initializer=init(seed)
            ),
            keras.layers.Conv2D(
                2 * filters,
                3,
                strides=2,
                padding="same",
                activation="relu",
                kernel_initializer=init(seed + 1),
            ),
            keras.layers.Flatten(),
            keras.layers.Dense(num_classes, kernel_initializer=init(seed + 2)),
            keras.layers.Softmax(),
        ]
    )


MODELS = {"softmax": softmax_regression, "mlp": mlp, "cnn": cnn}
"""The model builders by name, as the main job's ``--model`` flag names them."""


def build_model(name: str, input_shape: Sequence[int], num_classes: int = 10) -> keras.Model:
    """The model ``name`` (a key of :data:`MODELS`) for inputs of ``input_shape``."""
    check_choice("name", name, MODELS)
    return MODELS[name](input_shape, num_classes)
