"""The client update of FedAvg and FedProx: how a group of clients trains, as a choice.

The training builders (:func:`~programlogic.learning.build_weighted_fed_avg`, the FedProx
and unweighted variants) take ``client_update``, one of :data:`CLIENT_UPDATES`:

- ``"traced"``: the update traced with TensorFlow and compiled with XLA, a group of
  clients vectorized in one call (:mod:`~programlogic.learning.client_update.traced`).
  It trains any Keras model with any client optimizer.
- ``"compiled"``: a C loop for a softmax regression trained with plain SGD
  (:mod:`~programlogic.learning.client_update.compiled`), several times faster on
  such a model, where the latency of a tiny step bounds the traced update.
- ``"portable"``: the same loop in its baseline build, summing in a fixed order: the
  same bits on any CPU, for a cluster of mixed machines (Ray).
- ``"auto"`` (the default): ``"compiled"`` where it applies and the extension was
  built, ``"traced"`` otherwise; it logs its choice, and why, once per choice.

``"compiled"`` and ``"portable"`` raise ValueError, naming the cause, where the loop
cannot train the model or the install did not build it. The choice is made where the
process is built, and again where a copy of it is unpickled (a Ray worker): a worker
whose install lacks the extension runs ``"auto"`` traced, and refuses the others.

Bits: every update gives the same bits from run to run on one machine type (for a
fixed seed and configuration). ``"traced"`` and ``"compiled"`` may differ in the last
float32 places across CPU types (XLA and the loop each compile for the CPU they run
on), and differ from each other by float32 rounding; ``"portable"`` does not depend on
the CPU, with the :class:`~programlogic.learning.aggregators.Mean` aggregator (another
aggregator folds the deltas with XLA).
"""

from __future__ import annotations

import logging

from managers.validation import check_choice
from programlogic.learning.aggregators import ModelAggregator
from programlogic.learning.client_update.compiled import SoftmaxGroupUpdate, unsupported
from programlogic.learning.keras_model import FunctionalModel
from programlogic.learning.optimizers import Optimizer

__all__ = ["CLIENT_UPDATES", "check_client_update", "compiled_update"]

CLIENT_UPDATES = ("auto", "compiled", "portable", "traced")
"""The values of the training builders' ``client_update``."""

_logger = logging.getLogger(__name__)
_logged: set[str] = set()


def check_client_update(client_update: object) -> str:
    """``client_update`` if it is one of :data:`CLIENT_UPDATES` (TypeError or ValueError)."""
    return check_choice("client_update", client_update, CLIENT_UPDATES)


def compiled_update(
    client_update: str,
    model: FunctionalModel,
    optimizer: Optimizer,
    proximal_strength: float,
    client_weighting: str,
    aggregator: ModelAggregator,
) -> SoftmaxGroupUpdate | None:
    """The compiled group update ``client_update`` asks for, or None for the traced one.

    The other arguments are the process's: its model, client optimizer, proximal
    strength (0 for FedAvg), client weighting and model aggregator.
    """
    if client_update == "traced":
        return None
    reason = unsupported(model, optimizer)
    if reason is None:
        try:
            update = SoftmaxGroupUpdate(
                model,
                optimizer.learning_rate,
                proximal_strength,
                client_weighting,
                aggregator,
                portable=client_update == "portable",
            )
        except ImportError as error:
            if client_update != "auto":
                raise ValueError(f"client_update={client_update!r}: {error}") from error
            _log_once(
                logging.WARNING,
                f"client_update='auto' trains this softmax regression with the slower "
                f"traced update, since {error}",
            )
            return None
        if client_update == "auto":
            _log_once(
                logging.INFO,
                "client_update='auto' chose the compiled loop: the model is a softmax "
                "regression trained with plain SGD",
            )
        return update
    if client_update != "auto":
        raise ValueError(
            f"client_update={client_update!r} runs a C loop for softmax regressions "
            f"trained with plain SGD; this model cannot run there: {reason}"
        )
    _log_once(logging.INFO, f"client_update='auto' chose the traced update: {reason}")
    return None


def _log_once(level: int, message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        _logger.log(level, message)
