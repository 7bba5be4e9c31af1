"""Functional optimizers: pure update rules for client and server steps.

An optimizer here holds no variables. ``initialize(weights)`` returns its state (a
structure of arrays, stored in checkpoints like any other state) and
``next(state, weights, gradients)`` returns ``(new_state, new_weights)``. The rules use
only arithmetic operators, so the same optimizer runs on NumPy arrays (server steps)
and on TensorFlow tensors inside compiled client updates.

For FedAvg's server step the "gradient" is the averaged client delta
(``initial - trained``), so ``sgd(1.0)`` on the server sets the model to the weighted
mean of the clients' models, as in TensorFlow Federated.
"""

from __future__ import annotations

import abc
import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

from managers.validation import check_number

__all__ = ["SGD", "Adam", "Optimizer", "adam", "sgd"]


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


@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
    """Stochastic gradient descent, with optional heavy-ball momentum.

    ``w -= learning_rate * g`` without momentum; with it, ``m = momentum * m + g`` then
    ``w -= learning_rate * m`` (the rule of ``tff.learning.optimizers.build_sgdm``).
    """

    learning_rate: float
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
    """Adam (Kingma and Ba), with bias correction and ``epsilon`` outside the square root."""

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


def sgd(learning_rate: float, momentum: float = 0.0) -> SGD:
    """An :class:`SGD` optimizer."""
    return SGD(learning_rate, momentum)


def adam(
    learning_rate: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7
) -> Adam:
    """An :class:`Adam` optimizer."""
    return Adam(learning_rate, beta_1, beta_2, epsilon)
