"""The main job's differential privacy: ``--dp-noise-multiplier`` and the flags that go with it.

``--dp-noise-multiplier Z`` trains with central, user-level DP: the process is FedAvg
averaging the clients with equal weights (FedProx's with ``--algorithm fedprox``; the
server optimizer is ``--algorithm``'s) whose model aggregator is
:func:`programlogic.learning.dp_mean`: each client's update is clipped to ``--dp-clip``
(a number, or ``adaptive`` for :func:`programlogic.learning.adaptive_clipping`'s clip
that follows the median update norm), the sum gets Gaussian noise of standard deviation
``Z x clip`` (twice that under ``--sampling uniform``, whose adjacency is replace-one),
and is divided by ``--clients-per-round``. Rounds sample clients by Poisson sampling
(``--sampling poisson``, the default with DP: each training client joins a round with
probability k / N), or ``uniform`` or ``fixed``; ``with_replacement`` is refused.

Epsilon is accounted at ``--dp-delta`` (default ``1 / N**1.1`` for N training clients)
by RDP and reported each round (``privacy/epsilon`` in ``metrics.csv``);
``--privacy-budget EPSILON`` stops training before the round that would spend more.
``--aggregator`` and ``--clip-norm`` do not go with DP: ``dp_mean`` clips and averages.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = [
    "ADAPTIVE",
    "DEFAULT_DP_CLIP",
    "DP_FLAGS",
    "add_privacy_flags",
    "dp_clip",
    "dp_delta",
    "dp_model_aggregator",
    "mechanism",
    "privacy_stopping",
    "resolve_privacy_flags",
]

ADAPTIVE = "adaptive"
"""The ``--dp-clip`` that adapts to the median update norm."""

DEFAULT_DP_CLIP = 1.0
"""``--dp-clip`` when none is given: near the update norms of the default job (the softmax
regression's on the digits writers are 1.2 to 1.4), which it then clips mildly."""

DP_FLAGS = ("dp_clip", "dp_delta", "privacy_budget")
"""The flags that go with ``--dp-noise-multiplier`` only (their destinations)."""

COUNT_STDDEV_SHARE = 0.05
"""An adaptive clip's count noise, a share of the clients a round (TFF's default)."""


def dp_clip(text: str) -> float | str:
    """An argparse type: a positive clip, or ``adaptive``."""
    if text == ADAPTIVE:
        return ADAPTIVE
    return _positive(text, expected=f"a number or {ADAPTIVE!r}")


def _number(text: str, expected: str) -> float:
    """``text`` as a float, or the argparse error saying what was ``expected``."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def _probability(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1."""
    value = _number(text, "a number")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (excluded), got {text}")
    return value


def _positive(text: str, expected: str = "a number") -> float:
    """An argparse type: a finite number above 0."""
    value = _number(text, expected)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def add_privacy_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--dp-noise-multiplier``, ``--dp-clip``, ``--dp-delta`` and ``--privacy-budget``."""
    parser.add_argument(
        "--dp-noise-multiplier",
        type=_positive,
        metavar="Z",
        help="train with differential privacy: dp_mean's Gaussian noise of this multiple of "
        "the clip (default: no DP; see samples/_job_privacy.py)",
    )
    parser.add_argument(
        "--dp-clip",
        type=dp_clip,
        metavar="C",
        help=f"with DP: clip each client's update to this L2 norm, or {ADAPTIVE!r} to follow "
        f"the median norm (default: {DEFAULT_DP_CLIP})",
    )
    parser.add_argument(
        "--dp-delta",
        type=_probability,
        metavar="DELTA",
        help="with DP: the delta epsilon is reported at (default: 1 / N**1.1, N training clients)",
    )
    parser.add_argument(
        "--privacy-budget",
        type=_positive,
        metavar="EPSILON",
        help="with DP: stop before the round that would take epsilon past this",
    )


def resolve_privacy_flags(
    arguments: argparse.Namespace, error: Callable[[str], Any]
) -> argparse.Namespace:
    """Fill in ``sampling``, ``aggregator`` and ``dp_clip`` in place; ``error`` (the
    parser's) reports a flag that does not go with the others."""
    private = arguments.dp_noise_multiplier is not None
    if not private:
        given = [name for name in DP_FLAGS if getattr(arguments, name) is not None]
        if given:
            error(f"{_flag(given[0])} goes with --dp-noise-multiplier")
        if arguments.sampling is None:
            arguments.sampling = "uniform"
        if arguments.aggregator is None:
            arguments.aggregator = "mean"
        return arguments
    if arguments.aggregator is not None or arguments.clip_norm is not None:
        error(
            "--aggregator and --clip-norm do not go with --dp-noise-multiplier "
            "(dp_mean clips with --dp-clip and averages)"
        )
    if arguments.sampling is None:
        arguments.sampling = "poisson"
    if arguments.sampling == "with_replacement":
        error(
            "--sampling with_replacement does not go with --dp-noise-multiplier "
            "(a client drawn twice would count twice): use poisson, uniform or fixed"
        )
    if arguments.dp_clip is None:
        arguments.dp_clip = DEFAULT_DP_CLIP
    if arguments.dp_clip == ADAPTIVE:
        count_stddev = COUNT_STDDEV_SHARE * arguments.clients_per_round
        if arguments.dp_noise_multiplier >= 2 * count_stddev:
            error(
                f"--dp-clip adaptive needs --dp-noise-multiplier below "
                f"{2 * count_stddev:g} (a tenth of --clients-per-round): its clipped-count "
                "noise shares the privacy; use a fixed --dp-clip or more clients a round"
            )
    return arguments


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def dp_delta(arguments: argparse.Namespace, num_clients: int) -> float:
    """``--dp-delta``, or ``1 / num_clients**1.1`` by default."""
    if arguments.dp_delta is not None:
        return float(arguments.dp_delta)
    return float(num_clients**-1.1)


def mechanism(arguments: argparse.Namespace, num_clients: int) -> Any:
    """The :class:`~programlogic.privacy.GaussianMechanism` of a DP run on ``num_clients``."""
    from programlogic.privacy import GaussianMechanism

    return GaussianMechanism(
        arguments.dp_noise_multiplier,
        num_clients,
        arguments.clients_per_round,
        sampling=arguments.sampling,
    )


def dp_model_aggregator(arguments: argparse.Namespace, num_clients: int) -> Any:
    """The ``dp_mean`` model aggregator of a DP run on ``num_clients`` training clients."""
    from programlogic.learning import adaptive_clipping, dp_mean

    clip = adaptive_clipping() if arguments.dp_clip == ADAPTIVE else float(arguments.dp_clip)
    return dp_mean(mechanism(arguments, num_clients), clip, delta=dp_delta(arguments, num_clients))


def privacy_stopping(arguments: argparse.Namespace, num_clients: int) -> Any:
    """The :class:`~programlogic.privacy.PrivacyBudgetStopping` of ``--privacy-budget``, or None."""
    from programlogic.privacy import PrivacyBudgetStopping

    if arguments.dp_noise_multiplier is None or arguments.privacy_budget is None:
        return None
    return PrivacyBudgetStopping(
        mechanism(arguments, num_clients),
        epsilon=arguments.privacy_budget,
        delta=dp_delta(arguments, num_clients),
    )
