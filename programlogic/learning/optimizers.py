"""Functional optimizers: pure update rules for client and server steps.

An optimizer here holds no variables. ``initialize(weights)`` returns its state (a
structure of arrays, stored in checkpoints like any other state) and
``next(state, weights, gradients)`` returns ``(new_state, new_weights)``. The rules use
arithmetic operators (and, for Yogi, the sign of NumPy or TensorFlow), so the same
optimizer runs on NumPy arrays (server steps) and on TensorFlow tensors inside compiled
client updates.

For FedAvg's server step the "gradient" is the averaged client delta
(``initial - trained``), so ``sgd(1.0)`` on the server sets the model to the weighted
mean of the clients' models, as in TensorFlow Federated. The rules, their arguments and
their defaults are those of ``tff.learning.optimizers`` (0.87): ``build_sgdm``,
``build_adam``, ``build_adagrad``, ``build_yogi`` and ``build_rmsprop``. As FedAvg's
server optimizer, ``adam``, ``yogi`` and ``adagrad`` make FedAdam, FedYogi and FedAdagrad
(Reddi et al. 2020), ``sgd`` with momentum FedAvgM. :func:`as_optimizer` also takes a
Keras optimizer that maps onto one of these rules.
"""

from __future__ import annotations

import abc
import dataclasses
import numbers
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from managers.validation import check_bool, check_number, describe

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "Optimizer",
    "RMSprop",
    "Yogi",
    "adagrad",
    "adam",
    "as_optimizer",
    "rmsprop",
    "sgd",
    "yogi",
]


class Optimizer(abc.ABC):
    """An update rule ``weights, gradients -> weights`` with explicit state.

    ``weights`` and ``gradients`` are sequences of arrays of equal shapes. Both methods
    must be pure: they never change their arguments, and the state they return is a
    dict of arrays (or of lists of arrays) that a state manager stores losslessly.
    """

    @abc.abstractmethod
    def initialize(self, weights: Sequence[Any]) -> dict[str, Any]:
        """The optimizer's state before its first step on ``weights``."""

    @abc.abstractmethod
    def next(
        self, state: dict[str, Any], weights: Sequence[Any], gradients: Sequence[Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        """One step: ``(new_state, new_weights)``."""

    def describe(self) -> dict[str, Any]:
        """Its class name and, for a dataclass optimizer, its fields (the hyperparameters).

        What a learning process's ``describe_configuration`` reports of it; JSON-able.
        """
        fields = dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}
        return {"class": type(self).__name__, **{k: _json(v) for k, v in fields.items()}}


def _json(value: Any) -> Any:
    """A hyperparameter as JSON: NumPy numbers as Python's, other objects by name."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return getattr(value, "__name__", None) or type(value).__name__


def _check_rate(name: str, value: float, *, upper: float | None = None) -> None:
    check_number(name, value, minimum=0, below=upper)


def _sign(value: Any) -> Any:
    """-1, 0 or 1 elementwise, for a NumPy array or a TensorFlow tensor."""
    if isinstance(value, np.ndarray | np.generic | numbers.Number):
        return np.sign(value)
    return sys.modules["tensorflow"].sign(value)


def _filled(weights: Sequence[Any], value: float) -> list[Any]:
    """Arrays (or tensors) like ``weights`` holding ``value`` everywhere."""
    return [weight * 0 + value for weight in weights]


@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
    """Stochastic gradient descent, with optional heavy-ball momentum.

    ``w -= learning_rate * g`` without momentum; with it, ``m = momentum * m + g`` then
    ``w -= learning_rate * m`` (the rule of ``tff.learning.optimizers.build_sgdm``;
    ``momentum=0`` is its ``momentum=None``). State ``{}``, or ``{"momentum": m}``.
    """

    learning_rate: float = 0.01
    momentum: float = 0.0

    def __post_init__(self) -> None:
        _check_rate("learning_rate", self.learning_rate)
        _check_rate("momentum", self.momentum, upper=1.0)

    def initialize(self, weights: Sequence[Any]) -> dict[str, Any]:
        if self.momentum == 0.0:
            return {}
        return {"momentum": [weight * 0 for weight in weights]}

    def next(
        self, state: dict[str, Any], weights: Sequence[Any], gradients: Sequence[Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        rate = self.learning_rate
        if self.momentum == 0.0:
            return state, [w - rate * g for w, g in zip(weights, gradients, strict=True)]
        velocity = [
            self.momentum * m + g for m, g in zip(state["momentum"], gradients, strict=True)
        ]
        return {"momentum": velocity}, [
            w - rate * v for w, v in zip(weights, velocity, strict=True)
        ]


@dataclasses.dataclass(frozen=True)
class Adam(Optimizer):
    """Adam (Kingma and Ba), with bias correction and ``epsilon`` outside the square root.

    ``m = beta_1 m + (1 - beta_1) g``, ``v = beta_2 v + (1 - beta_2) g**2`` and
    ``w -= learning_rate * sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (sqrt(v) + epsilon)``
    at step ``t`` (``build_adam``'s rule, also Keras'). State ``{"step", "first", "second"}``.
    """

    learning_rate: float = 0.001
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7

    def __post_init__(self) -> None:
        _check_rate("learning_rate", self.learning_rate)
        _check_rate("beta_1", self.beta_1, upper=1.0)
        _check_rate("beta_2", self.beta_2, upper=1.0)
        _check_rate("epsilon", self.epsilon)

    def initialize(self, weights: Sequence[Any]) -> dict[str, Any]:
        zeros = [weight * 0 for weight in weights]
        return {"step": 0.0, "first": zeros, "second": list(zeros)}

    def next(
        self, state: dict[str, Any], weights: Sequence[Any], gradients: Sequence[Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        step = state["step"] + 1.0
        first = [
            self.beta_1 * m + (1 - self.beta_1) * g
            for m, g in zip(state["first"], gradients, strict=True)
        ]
        second = [
            self.beta_2 * v + (1 - self.beta_2) * g * g
            for v, g in zip(state["second"], gradients, strict=True)
        ]
        rate = self.learning_rate * (1 - self.beta_2**step) ** 0.5 / (1 - self.beta_1**step)
        new_weights = [
            w - rate * m / (v**0.5 + self.epsilon)
            for w, m, v in zip(weights, first, second, strict=True)
        ]
        return {"step": step, "first": first, "second": second}, new_weights


@dataclasses.dataclass(frozen=True)
class Adagrad(Optimizer):
    """Adagrad (Duchi et al.), with ``epsilon`` inside the square root.

    ``s = s + g**2`` then ``w -= learning_rate * g / sqrt(s + epsilon)``, ``s`` starting
    at ``initial_preconditioner_value`` (``build_adagrad``'s rule and defaults, also
    Keras'). State ``{"preconditioner": s}``.
    """

    learning_rate: float
    initial_preconditioner_value: float = 0.1
    epsilon: float = 1e-7

    def __post_init__(self) -> None:
        _check_rate("learning_rate", self.learning_rate)
        _check_rate("initial_preconditioner_value", self.initial_preconditioner_value)
        _check_rate("epsilon", self.epsilon)

    def initialize(self, weights: Sequence[Any]) -> dict[str, Any]:
        return {"preconditioner": _filled(weights, self.initial_preconditioner_value)}

    def next(
        self, state: dict[str, Any], weights: Sequence[Any], gradients: Sequence[Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        preconditioner = [
            s + g * g for s, g in zip(state["preconditioner"], gradients, strict=True)
        ]
        new_weights = [
            w - self.learning_rate * g / (s + self.epsilon) ** 0.5
            for w, g, s in zip(weights, gradients, preconditioner, strict=True)
        ]
        return {"preconditioner": preconditioner}, new_weights


@dataclasses.dataclass(frozen=True)
class Yogi(Optimizer):
    """Yogi (Zaheer et al. 2018): Adam whose second moment moves additively.

    ``m = beta_1 m + (1 - beta_1) g``, ``v = v + (1 - beta_2) sign(g**2 - v) g**2``
    (``v`` starting at ``initial_preconditioner_value``) and ``w`` steps as Adam's, with
    ``epsilon`` outside the square root (``build_yogi``'s rule and defaults).
    State ``{"step", "first", "second"}``.
    """

    learning_rate: float
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-3
    initial_preconditioner_value: float = 1e-6

    def __post_init__(self) -> None:
        _check_rate("learning_rate", self.learning_rate)
        _check_rate("beta_1", self.beta_1, upper=1.0)
        _check_rate("beta_2", self.beta_2, upper=1.0)
        _check_rate("epsilon", self.epsilon)
        _check_rate("initial_preconditioner_value", self.initial_preconditioner_value)

    def initialize(self, weights: Sequence[Any]) -> dict[str, Any]:
        return {
            "step": 0.0,
            "first": _filled(weights, 0.0),
            "second": _filled(weights, self.initial_preconditioner_value),
        }

    def next(
        self, state: dict[str, Any], weights: Sequence[Any], gradients: Sequence[Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        step = state["step"] + 1.0
        first = [
            self.beta_1 * m + (1 - self.beta_1) * g
            for m, g in zip(state["first"], gradients, strict=True)
        ]
        second = []
        for v, g in zip(state["second"], gradients, strict=True):
            square = g * g
            second.append(v + (1 - self.beta_2) * _sign(square - v) * square)
        rate = self.learning_rate * (1 - self.beta_2**step) ** 0.5 / (1 - self.beta_1**step)
        new_weights = [
            w - rate * m / (v**0.5 + self.epsilon)
            for w, m, v in zip(weights, first, second, strict=True)
        ]
        return {"step": step, "first": first, "second": second}, new_weights


@dataclasses.dataclass(frozen=True)
class RMSprop(Optimizer):
    """RMSprop (Tieleman and Hinton): steps scaled by a moving mean of squared gradients.

    ``s = decay s + (1 - decay) g**2`` (``s`` starting at 0) then
    ``w -= learning_rate * g / (sqrt(s) + epsilon)`` (``build_rmsprop``'s rule and
    defaults), or ``w -= learning_rate * g / sqrt(s + epsilon)`` with
    ``epsilon_inside_sqrt=True``, Keras' placement. State ``{"preconditioner": s}``.
    """

    learning_rate: float
    decay: float = 0.9
    epsilon: float = 1e-7
    epsilon_inside_sqrt: bool = False

    def __post_init__(self) -> None:
        _check_rate("learning_rate", self.learning_rate)
        _check_rate("decay", self.decay, upper=1.0)
        _check_rate("epsilon", self.epsilon)
        check_bool("epsilon_inside_sqrt", self.epsilon_inside_sqrt)

    def initialize(self, weights: Sequence[Any]) -> dict[str, Any]:
        return {"preconditioner": _filled(weights, 0.0)}

    def next(
        self, state: dict[str, Any], weights: Sequence[Any], gradients: Sequence[Any]
    ) -> tuple[dict[str, Any], list[Any]]:
        preconditioner = [
            self.decay * s + (1 - self.decay) * g * g
            for s, g in zip(state["preconditioner"], gradients, strict=True)
        ]
        if self.epsilon_inside_sqrt:
            scales = [(s + self.epsilon) ** 0.5 for s in preconditioner]
        else:
            scales = [s**0.5 + self.epsilon for s in preconditioner]
        new_weights = [
            w - self.learning_rate * g / scale
            for w, g, scale in zip(weights, gradients, scales, strict=True)
        ]
        return {"preconditioner": preconditioner}, new_weights


def sgd(learning_rate: float = 0.01, momentum: float = 0.0) -> SGD:
    """An :class:`SGD` optimizer (``tff.learning.optimizers.build_sgdm``)."""
    return SGD(learning_rate, momentum)


def adam(
    learning_rate: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7
) -> Adam:
    """An :class:`Adam` optimizer (``tff.learning.optimizers.build_adam``)."""
    return Adam(learning_rate, beta_1, beta_2, epsilon)


def adagrad(
    learning_rate: float, initial_preconditioner_value: float = 0.1, epsilon: float = 1e-7
) -> Adagrad:
    """An :class:`Adagrad` optimizer (``tff.learning.optimizers.build_adagrad``)."""
    return Adagrad(learning_rate, initial_preconditioner_value, epsilon)


def yogi(
    learning_rate: float,
    beta_1: float = 0.9,
    beta_2: float = 0.999,
    epsilon: float = 1e-3,
    initial_preconditioner_value: float = 1e-6,
) -> Yogi:
    """A :class:`Yogi` optimizer (``tff.learning.optimizers.build_yogi``)."""
    return Yogi(learning_rate, beta_1, beta_2, epsilon, initial_preconditioner_value)


def rmsprop(learning_rate: float, decay: float = 0.9, epsilon: float = 1e-7) -> RMSprop:
    """An :class:`RMSprop` optimizer (``tff.learning.optimizers.build_rmsprop``)."""
    return RMSprop(learning_rate, decay, epsilon)


def as_optimizer(value: Any, argument_name: str) -> Optimizer:
    """``value`` as an :class:`Optimizer`: itself, or the rule a Keras optimizer maps onto.

    A Keras 3 ``SGD``, ``Adam``, ``Adagrad`` or ``RMSprop`` becomes :class:`SGD`,
    :class:`Adam`, :class:`Adagrad` or :class:`RMSprop` with the Keras object's own
    hyperparameters (Keras' defaults, not TensorFlow Federated's: Keras' ``Adagrad``
    starts its accumulator at 0.1 with ``epsilon=1e-7``, its ``RMSprop`` has
    ``learning_rate=0.001`` and adds ``epsilon`` inside the square root). Its
    learning rate, which Keras keeps in float32, is read back as the shortest decimal
    of that float32 (0.1, not 0.10000000149). Nothing else of the object is used: not
    its variables nor its iteration count. ValueError, naming the option, for what the
    rules here lack: a learning-rate schedule, ``nesterov``, ``amsgrad``, RMSprop's
    ``momentum`` or ``centered``, weight decay, gradient clipping, EMA, loss scaling,
    gradient accumulation. TypeError, naming ``argument_name``, for anything else.
    """
    if isinstance(value, Optimizer):
        return value

    converted = _from_keras(value, argument_name)
    if converted is None:
        raise TypeError(
            f"{argument_name} must be a programlogic.learning optimizer (sgd, adam, adagrad, "
            "yogi, rmsprop) or a Keras SGD, Adam, Adagrad or RMSprop, got "
            f"{describe(value)}"
        )
    return converted


# Reading a Keras optimizer's hyperparameters into one of the functional optimizers.

_KERAS_ONLY = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "loss_scale_factor",
    "gradient_accumulation_steps",
)
"""The options of every Keras optimizer that the rules here lack (off when None, 0 or False)."""

_REFUSED: dict[str, tuple[str, ...]] = {
    "SGD": ("nesterov",),
    "Adam": ("amsgrad",),
    "Adagrad": (),
    "RMSprop": ("momentum", "centered"),
}
"""The Keras classes converted, and the options of each that the rules here lack."""


def _rule(name: str, config: dict[str, Any], rate: float) -> Optimizer:
    if name == "SGD":
        return SGD(rate, config["momentum"])
    if name == "Adam":
        return Adam(rate, config["beta_1"], config["beta_2"], config["epsilon"])
    if name == "Adagrad":
        return Adagrad(rate, config["initial_accumulator_value"], config["epsilon"])
    return RMSprop(rate, config["rho"], config["epsilon"], epsilon_inside_sqrt=True)


def _from_keras(value: Any, argument_name: str) -> Optimizer | None:
    """The rule a Keras 3 optimizer maps onto, or None if ``value`` is no such optimizer.

    ValueError naming the option (and ``argument_name``) when it uses one the rules lack.
    """
    from programlogic.learning._tensorflow import keras

    name = next((name for name in _REFUSED if type(value) is getattr(keras.optimizers, name)), None)
    if name is None:
        return None
    config = value.get_config()
    rate = config["learning_rate"]
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real):
        raise ValueError(
            f"{argument_name}: a Keras {name} with a learning-rate schedule "
            f"({type(getattr(value, '_learning_rate', rate)).__name__}) is not supported: "
            "give a constant rate"
        )
    for option in (*_REFUSED[name], *_KERAS_ONLY):
        if config.get(option):
            raise ValueError(
                f"{argument_name}: the Keras {name} option {option}={config[option]!r} is not "
                f"supported by programlogic.learning's {name}"
            )
    try:
        return _rule(name, config, float(str(np.float32(rate))))
    except (TypeError, ValueError) as error:
        raise type(error)(f"{argument_name}: the Keras {name}'s {error}") from error
