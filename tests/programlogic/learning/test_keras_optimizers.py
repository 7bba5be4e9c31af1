"""Keras optimizers passed to FedAvg become the functional rule they map onto."""

import functools

import keras
import numpy as np
import pytest
from learning_support import CLASSES, FEATURES

from programlogic.learning import (
    Adagrad,
    Adam,
    RMSprop,
    adagrad,
    adam,
    as_optimizer,
    build_weighted_fed_avg,
    sgd,
    softmax_regression,
)
from programlogic.learning import RMSprop as OurRMSprop

pytestmark = pytest.mark.anyio

SMALL_MODEL = functools.partial(softmax_regression, (FEATURES,), CLASSES)
K = keras.optimizers


async def test_keras_hyperparameters_are_read_with_keras_defaults() -> None:
    assert as_optimizer(K.SGD(0.1, momentum=0.9), "x") == sgd(0.1, momentum=0.9)
    assert as_optimizer(K.SGD(), "x") == sgd(0.01)
    assert as_optimizer(K.Adam(0.02, beta_1=0.8, epsilon=1e-4), "x") == adam(
        0.02, beta_1=0.8, epsilon=1e-4
    )
    # Keras' Adagrad and RMSprop defaults, not TFF's.
    assert as_optimizer(K.Adagrad(), "x") == Adagrad(0.001, 0.1, 1e-7)
    assert as_optimizer(K.Adagrad(0.3, initial_accumulator_value=0.5, epsilon=1e-5), "x") == (
        adagrad(0.3, initial_preconditioner_value=0.5, epsilon=1e-5)
    )
    assert as_optimizer(K.RMSprop(0.05, rho=0.8), "x") == RMSprop(
        0.05, decay=0.8, epsilon=1e-7, epsilon_inside_sqrt=True
    )


async def test_an_optimizer_of_ours_is_returned_as_it_is() -> None:
    optimizer = adam(0.1)
    assert as_optimizer(optimizer, "x") is optimizer


@pytest.mark.parametrize(
    "make",
    [
        lambda: K.SGD(0.1),
        lambda: K.SGD(0.05, momentum=0.9),
        lambda: K.Adam(0.01),
        lambda: K.Adam(0.05, beta_1=0.5, beta_2=0.9, epsilon=1e-3),
        lambda: K.Adagrad(0.1),
        lambda: K.RMSprop(0.01),
        lambda: K.RMSprop(0.1, rho=0.5, epsilon=1e-3),
    ],
    ids=["sgd", "momentum", "adam", "adam-options", "adagrad", "rmsprop", "rmsprop-options"],
)
async def test_the_converted_rule_steps_as_the_keras_optimizer(make) -> None:
    keras_optimizer = make()  # a fresh one for each backend
    rng = np.random.default_rng(3)
    start = [rng.standard_normal((4, 3)).astype(np.float32), np.zeros(3, np.float32)]
    gradients = [
        [
            (rng.standard_normal(w.shape) * 10.0 ** rng.uniform(-2, 1)).astype(np.float32)
            for w in start
        ]
        for _ in range(10)
    ]
    optimizer = as_optimizer(keras_optimizer, "client_optimizer")
    variables = [keras.Variable(w) for w in start]
    weights, state = list(start), optimizer.initialize(start)
    for step in gradients:
        keras_optimizer.apply_gradients(zip(step, variables, strict=True))
        state, weights = optimizer.next(state, weights, step)
        for ours, theirs in zip(weights, variables, strict=True):
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize(
    ("keras_optimizer", "message"),
    [
        (K.SGD(0.1, nesterov=True), "the Keras SGD option nesterov=True is not supported"),
        (K.Adam(amsgrad=True), "the Keras Adam option amsgrad=True is not supported"),
        (K.RMSprop(momentum=0.5), "the Keras RMSprop option momentum=0.5 is not supported"),
        (K.RMSprop(centered=True), "the Keras RMSprop option centered=True is not supported"),
        (K.SGD(weight_decay=0.01), "option weight_decay=0.01 is not supported"),
        (K.Adam(clipnorm=1.0), "option clipnorm=1.0 is not supported"),
        (K.Adagrad(clipvalue=0.5), "option clipvalue=0.5 is not supported"),
        (K.SGD(global_clipnorm=2.0), "option global_clipnorm=2.0 is not supported"),
        (K.Adam(use_ema=True), "option use_ema=True is not supported"),
        (K.SGD(gradient_accumulation_steps=2), "option gradient_accumulation_steps=2"),
        (K.SGD(loss_scale_factor=128.0), "option loss_scale_factor=128.0"),
        (
            K.SGD(K.schedules.ExponentialDecay(0.1, 10, 0.9)),
            "a Keras SGD with a learning-rate schedule \\(ExponentialDecay\\) is not supported",
        ),
        (K.SGD(0.1, momentum=1.0), r"the Keras SGD's momentum must be .* < 1\.0, got 1\.0"),
    ],
    ids=[
        "nesterov",
        "amsgrad",
        "rmsprop-momentum",
        "centered",
        "weight-decay",
        "clipnorm",
        "clipvalue",
        "global-clipnorm",
        "ema",
        "accumulation",
        "loss-scale",
        "schedule",
        "momentum-1",
    ],
)
async def test_options_the_rules_lack_are_refused_by_name(keras_optimizer, message) -> None:
    with pytest.raises(ValueError, match=f"^server_optimizer: .*{message}"):
        build_weighted_fed_avg(SMALL_MODEL, server_optimizer=keras_optimizer)


class MySGD(keras.optimizers.SGD):
    pass


@pytest.mark.parametrize(
    ("value", "got"),
    [(K.Nadam(), "got Nadam"), (MySGD(0.1), "got MySGD"), ("adam", "got str 'adam'")],
    ids=["nadam", "subclass", "name"],
)
async def test_other_objects_are_refused_listing_what_is_supported(value, got) -> None:
    with pytest.raises(
        TypeError,
        match=(
            r"^client_optimizer must be a programlogic.learning optimizer \(sgd, adam, adagrad, "
            rf"yogi, rmsprop\) or a Keras SGD, Adam, Adagrad or RMSprop, {got}"
        ),
    ):
        build_weighted_fed_avg(SMALL_MODEL, client_optimizer=value)


async def test_fed_avg_takes_keras_optimizers_and_describes_the_rules() -> None:
    process = build_weighted_fed_avg(
        SMALL_MODEL,
        client_optimizer=K.SGD(0.1, momentum=0.9),
        server_optimizer=K.Adam(0.01),
    )
    assert process.client_optimizer == sgd(0.1, momentum=0.9)
    assert process.server_optimizer == Adam(0.01)
    configuration = process.describe_configuration()
    assert configuration["client_optimizer"] == {
        "class": "SGD",
        "learning_rate": 0.1,
        "momentum": 0.9,
    }
    assert configuration["server_optimizer"]["class"] == "Adam"
    assert isinstance(as_optimizer(K.RMSprop(), "x"), OurRMSprop)
