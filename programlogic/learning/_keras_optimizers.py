"""Reading a Keras optimizer's hyperparameters into one of the functional optimizers."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from programlogic.learning.optimizers import SGD, Adagrad, Adam, Optimizer, RMSprop

__all__ = ["from_keras"]

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


def from_keras(value: Any, argument_name: str) -> Optimizer | None:
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
