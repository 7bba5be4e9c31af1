import copy

import numpy as np
import pytest

from programlogic.learning import (
    SGD,
    Adagrad,
    Adam,
    RMSprop,
    Yogi,
    adagrad,
    adam,
    rmsprop,
    sgd,
    yogi,
)

pytestmark = pytest.mark.anyio


def steps(optimizer, weights, gradients_per_step):
    """The weights after each step, and the final state."""
    state = optimizer.initialize(weights)
    history = []
    for gradients in gradients_per_step:
        state, weights = optimizer.next(state, weights, gradients)
        history.append(weights)
    return history, state


def vector(*values: float) -> list[np.ndarray]:
    return [np.array(values, dtype=np.float64)]


async def test_sgd_subtracts_the_rate_times_the_gradient() -> None:
    history, state = steps(sgd(0.1), vector(1.0, -2.0), [vector(0.5, 4.0), vector(1.0, -1.0)])
    np.testing.assert_allclose(history[0][0], [0.95, -2.4], rtol=1e-12)
    np.testing.assert_allclose(history[1][0], [0.85, -2.3], rtol=1e-12)
    assert state == {}


async def test_sgd_with_momentum_accumulates_a_velocity() -> None:
    # v1 = g1 = (0.5, 4); w1 = (0.95, -2.4)
    # v2 = 0.9 v1 + g2 = (1.45, 2.6); w2 = (0.805, -2.66)
    # v3 = 0.9 v2 + 0 = (1.305, 2.34); w3 = (0.6745, -2.894): the velocity moves w alone
    history, state = steps(
        sgd(0.1, momentum=0.9),
        vector(1.0, -2.0),
        [vector(0.5, 4.0), vector(1.0, -1.0), vector(0.0, 0.0)],
    )
    np.testing.assert_allclose(history[0][0], [0.95, -2.4], rtol=1e-12)
    np.testing.assert_allclose(history[1][0], [0.805, -2.66], rtol=1e-12)
    np.testing.assert_allclose(history[2][0], [0.6745, -2.894], rtol=1e-12)
    np.testing.assert_allclose(state["momentum"][0], [1.305, 2.34], rtol=1e-12)


async def test_adam_with_bias_correction() -> None:
    # Without epsilon, the bias-corrected first step is rate * sign(g) and a constant
    # gradient keeps stepping by exactly the rate (m_hat = g, v_hat = g**2).
    # Coordinate 0 sees g = 2 then -1: m = 0.08, v = 0.004996, and the step is
    # 0.1 * sqrt(1 - 0.999**2) / (1 - 0.9**2) * 0.08 / sqrt(0.004996) = 0.0266337...
    history, state = steps(
        adam(0.1, epsilon=0.0), vector(1.0, -2.0), [vector(2.0, -0.5), vector(-1.0, -0.5)]
    )
    np.testing.assert_allclose(history[0][0], [0.9, -1.9], rtol=1e-12)
    np.testing.assert_allclose(history[1][0], [0.87336629603396, -1.8], rtol=1e-12)
    assert state["step"] == 2.0
    np.testing.assert_allclose(state["first"][0], [0.08, -0.095], rtol=1e-12)
    np.testing.assert_allclose(state["second"][0], [0.004996, 0.00049975], rtol=1e-12)


async def test_adam_adds_epsilon_outside_the_square_root() -> None:
    # 1 - 0.1 * sqrt(0.001) / 0.1 * 0.2 / (sqrt(0.004) + 1.0)
    history, _ = steps(adam(0.1, epsilon=1.0), vector(1.0), [vector(2.0)])
    np.testing.assert_allclose(history[0][0], [0.9940516512848024], rtol=1e-12)


async def test_adam_defaults_are_keras_defaults() -> None:
    assert adam() == Adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    assert sgd(0.5) == SGD(learning_rate=0.5, momentum=0.0)


async def test_defaults_are_those_of_tensorflow_federated_builders() -> None:
    # build_sgdm(learning_rate=0.01, momentum=None), build_adagrad(lr, 0.1, 1e-7),
    # build_yogi(lr, 0.9, 0.999, 1e-3, initial_preconditioner_value=1e-6),
    # build_rmsprop(lr, decay=0.9, epsilon=1e-7).
    assert sgd() == SGD(learning_rate=0.01, momentum=0.0)
    assert adagrad(0.5) == Adagrad(0.5, initial_preconditioner_value=0.1, epsilon=1e-7)
    assert yogi(0.5) == Yogi(
        0.5, beta_1=0.9, beta_2=0.999, epsilon=1e-3, initial_preconditioner_value=1e-6
    )
    assert rmsprop(0.5) == RMSprop(0.5, decay=0.9, epsilon=1e-7, epsilon_inside_sqrt=False)


async def test_adagrad_divides_by_the_root_of_the_summed_squares() -> None:
    # s = 0 + 9 -> w = 1 - 0.1 * 3 / 3; s = 9 + 16 -> w = 0.9 - 0.1 * 4 / 5.
    history, state = steps(
        adagrad(0.1, initial_preconditioner_value=0.0, epsilon=0.0),
        vector(1.0),
        [vector(3.0), vector(4.0)],
    )
    np.testing.assert_allclose([h[0][0] for h in history], [0.9, 0.82], rtol=1e-12)
    np.testing.assert_allclose(state["preconditioner"][0], [25.0], rtol=1e-12)


async def test_adagrad_starts_from_its_preconditioner_and_adds_epsilon_inside_the_root() -> None:
    # s = 7 + 9 = 16 -> w = 1 - 0.1 * 3 / sqrt(16 + 9) = 0.94 (not 1 - 0.3 / (4 + 9)).
    history, _ = steps(
        adagrad(0.1, initial_preconditioner_value=7.0, epsilon=9.0), vector(1.0), [vector(3.0)]
    )
    np.testing.assert_allclose(history[0][0], [0.94], rtol=1e-12)


async def test_yogi_moves_its_second_moment_by_the_sign_of_the_difference() -> None:
    # Coordinate 0, from v = 1: g = 2, g**2 > v so v = 1 + 0.5 * 4 = 3; then g = 1,
    # g**2 < v so v = 3 - 0.5 * 1 = 2.5 (Adam's moving mean would give 2).
    # Coordinate 1 sees g**2 = v = 1: v stays 1.  m = 1 then 1 for coordinate 0.
    # The step is Adam's: rate * sqrt(1 - 0.5**t) / (1 - 0.5**t) * m / sqrt(v).
    history, state = steps(
        yogi(0.1, beta_1=0.5, beta_2=0.5, epsilon=0.0, initial_preconditioner_value=1.0),
        vector(1.0, 1.0),
        [vector(2.0, 1.0), vector(1.0, -1.0)],
    )
    first = 1 - 0.1 * np.sqrt(0.5) / 0.5 * 1.0 / np.sqrt(3.0)
    second = first - 0.1 * np.sqrt(0.75) / 0.75 * 1.0 / np.sqrt(2.5)
    np.testing.assert_allclose([h[0][0] for h in history], [first, second], rtol=1e-12)
    np.testing.assert_allclose(state["second"][0], [2.5, 1.0], rtol=1e-12)
    np.testing.assert_allclose(state["first"][0], [1.0, -0.25], rtol=1e-12)
    assert state["step"] == 2.0


async def test_rmsprop_scales_by_a_moving_mean_of_squares_epsilon_where_asked() -> None:
    # s = 0.5 * 0 + 0.5 * 4 = 2 then 0.5 * 2 + 0.5 * 4 = 3; w -= 0.1 * 2 / sqrt(s).
    history, state = steps(
        rmsprop(0.1, decay=0.5, epsilon=0.0), vector(1.0), [vector(2.0), vector(2.0)]
    )
    first = 1 - 0.2 / np.sqrt(2.0)
    np.testing.assert_allclose(
        [h[0][0] for h in history], [first, first - 0.2 / np.sqrt(3.0)], rtol=1e-12
    )
    np.testing.assert_allclose(state["preconditioner"][0], [3.0], rtol=1e-12)
    # TFF's epsilon is added to sqrt(s), Keras' to s.
    outside, _ = steps(rmsprop(0.1, decay=0.5, epsilon=1.0), vector(1.0), [vector(2.0)])
    inside, _ = steps(RMSprop(0.1, 0.5, 1.0, epsilon_inside_sqrt=True), vector(1.0), [vector(2.0)])
    np.testing.assert_allclose(outside[0][0], [1 - 0.2 / (np.sqrt(2.0) + 1)], rtol=1e-12)
    np.testing.assert_allclose(inside[0][0], [1 - 0.2 / np.sqrt(3.0)], rtol=1e-12)


async def test_describe_names_the_class_and_its_hyperparameters() -> None:
    assert yogi(0.1).describe() == {
        "class": "Yogi",
        "learning_rate": 0.1,
        "beta_1": 0.9,
        "beta_2": 0.999,
        "epsilon": 0.001,
        "initial_preconditioner_value": 1e-6,
    }
    assert adagrad(0.2).describe() == {
        "class": "Adagrad",
        "learning_rate": 0.2,
        "initial_preconditioner_value": 0.1,
        "epsilon": 1e-7,
    }
    assert rmsprop(0.3).describe() == {
        "class": "RMSprop",
        "learning_rate": 0.3,
        "decay": 0.9,
        "epsilon": 1e-7,
        "epsilon_inside_sqrt": False,
    }


@pytest.mark.parametrize(
    "optimizer",
    [sgd(0.1), sgd(0.1, momentum=0.5), adam(0.01), adagrad(0.1), yogi(0.1), rmsprop(0.1)],
    ids=["sgd", "momentum", "adam", "adagrad", "yogi", "rmsprop"],
)
async def test_steps_are_pure_and_keep_float32(optimizer) -> None:
    weights = [np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)]
    gradients = [np.full((2, 3), 0.5, np.float32), np.array([1, -1, 2], np.float32)]
    state = optimizer.initialize(weights)
    before = copy.deepcopy((weights, gradients, state))

    new_state, new_weights = optimizer.next(state, weights, gradients)
    again_state, again_weights = optimizer.next(state, weights, gradients)

    for original, kept in zip((weights, gradients, state), before, strict=True):
        np.testing.assert_equal(original, kept)
    np.testing.assert_equal(again_weights, new_weights)
    np.testing.assert_equal(again_state, new_state)
    assert [w.dtype for w in new_weights] == [np.float32, np.float32]
    assert [w.shape for w in new_weights] == [(2, 3), (3,)]
    assert not np.array_equal(new_weights[0], weights[0])


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: sgd(-0.1), ValueError, r"learning_rate must be a number >= 0, got -0\.1"),
        (lambda: sgd("0.1"), TypeError, r"learning_rate must be a number >= 0, got str '0\.1'"),
        (lambda: sgd(True), TypeError, r"learning_rate must be a number >= 0, got bool True"),
        (lambda: sgd(0.1, momentum=1.0), ValueError, r"momentum .* < 1\.0, got 1\.0"),
        (lambda: sgd(0.1, momentum=-0.5), ValueError, r"momentum must be .* got -0\.5"),
        (lambda: adam(-1.0), ValueError, r"learning_rate must be a number >= 0, got -1\.0"),
        (
            lambda: adam(beta_1=1.0),
            ValueError,
            r"beta_1 must be .* and < 1\.0, got 1\.0",
        ),
        (lambda: adam(beta_2=1.5), ValueError, r"beta_2 must be .* < 1\.0, got 1\.5"),
        (lambda: adam(epsilon=-1e-7), ValueError, r"epsilon must be a number >= 0, got -1e-07"),
        (lambda: adagrad(-0.1), ValueError, r"learning_rate must be a number >= 0, got -0\.1"),
        (
            lambda: adagrad(0.1, initial_preconditioner_value=-1.0),
            ValueError,
            r"initial_preconditioner_value must be a number >= 0, got -1\.0",
        ),
        (lambda: adagrad(0.1, epsilon="0"), TypeError, r"epsilon must be a number >= 0, got str"),
        (lambda: yogi(0.1, beta_1=1.0), ValueError, r"beta_1 must be .* < 1\.0, got 1\.0"),
        (lambda: yogi(0.1, beta_2=-0.1), ValueError, r"beta_2 must be .* got -0\.1"),
        (lambda: yogi(0.1, epsilon=-1.0), ValueError, r"epsilon must be a number >= 0, got -1"),
        (
            lambda: yogi(0.1, initial_preconditioner_value=None),
            TypeError,
            "initial_preconditioner_value must be a number >= 0, got None",
        ),
        (lambda: rmsprop(0.1, decay=1.0), ValueError, r"decay must be .* < 1\.0, got 1\.0"),
        (lambda: rmsprop(0.1, epsilon=-1.0), ValueError, r"epsilon must be a number >= 0"),
        (
            lambda: RMSprop(0.1, epsilon_inside_sqrt=1),
            TypeError,
            "epsilon_inside_sqrt must be a bool, got int 1",
        ),
        (lambda: yogi(), TypeError, "learning_rate"),
    ],
)
async def test_invalid_hyperparameters_are_refused(build, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build()
