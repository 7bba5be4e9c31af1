"""The main job's flags: what each one means, how it is checked, and which define a run.

:func:`parse_arguments` reads the command line; a bad value, or a flag that does not go
with the others, exits with argparse's one-line error (status 2).

``--algorithm`` picks the training process; the client optimizer is SGD with
``--client-lr`` for all of them:

- ``fedavg``: FedAvg weighted by examples, server SGD 1.0 (the new model is the mean of
  the client models, as in the TFF tutorial);
- ``fedprox``: FedAvg whose client loss adds ``mu / 2 * ||w - w_server||^2``
  (``--proximal-strength`` mu, default 0.01), server SGD 1.0;
- ``fedavgm``: server momentum 0.9 (Hsu et al. 2019), server learning rate 0.2: with
  momentum 0.9 a steady step is ten times the rate, so about twice FedAvg's;
- ``fedadam`` and ``fedyogi``: a server Adam or Yogi (Reddi et al. 2020), learning rate
  0.1 and epsilon (their adaptivity) 1e-3; 0.03 and 0.01 learned markedly slower on the
  digits.

``--aggregator`` combines the client updates: ``mean`` (by examples, the default), or
the robust ``median`` and ``trimmed_mean`` (beta 0.2), which hold when a minority of
clients send arbitrary updates; ``--clip-norm C`` first clips each update to L2 norm C.

``--dp-noise-multiplier Z`` trains with central, user-level differential privacy: the
clients are averaged with equal weights by ``dp_mean``, which clips each update to
``--dp-clip`` (a number, or ``adaptive`` to follow the median update norm) and adds
Gaussian noise of ``Z x clip`` (twice that under ``--sampling uniform``, whose adjacency
is replace-one). Rounds then sample by ``poisson`` by default (each client joins with
probability k / N); ``with_replacement`` is refused, and so are ``--aggregator`` and
``--clip-norm``. Epsilon is accounted at ``--dp-delta`` (default ``1 / N**1.1`` for N
training clients) and reported each round (``privacy/epsilon`` in ``metrics.csv``);
``--privacy-budget EPSILON`` stops training before the round that would spend more.

The flags in :data:`RUN_DEFINING` define a run: a run resumed with another model or
learning rate would end as no uninterrupted run does. The first run records them in
``<root>/config.json`` (:func:`record_config`, written atomically: a crash leaves the
file whole or absent) and every rerun compares (:func:`check_config`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from managers.files import write_atomically
from programlogic import Sampling

__all__ = [
    "ADAPTIVE",
    "AGGREGATORS",
    "ALGORITHMS",
    "CLIENT_LEARNING_RATES",
    "DATASETS",
    "RUN_DEFINING",
    "SERVER_LEARNING_RATES",
    "DamagedConfigError",
    "OtherRunError",
    "WrittenDefaults",
    "check_config",
    "flag_error",
    "parse_arguments",
    "positive_number",
    "record_config",
    "run_config",
    "whole_number",
]

DATASETS = ("digits", "fashion_mnist", "emnist")
ALGORITHMS = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi")
AGGREGATORS = ("mean", "median", "trimmed_mean")
CLIENT_LEARNING_RATES = {"softmax": 0.02, "mlp": 0.05, "cnn": 0.1}
"""Each model's ``--client-lr`` when none is given: the tutorial's for its softmax regression."""
SERVER_LEARNING_RATES = {
    "fedavg": 1.0,
    "fedprox": 1.0,
    "fedavgm": 0.2,
    "fedadam": 0.1,
    "fedyogi": 0.1,
}
"""Each algorithm's ``--server-lr`` when none is given."""
DEFAULT_PROXIMAL_STRENGTH = 0.01
ADAPTIVE = "adaptive"
"""The ``--dp-clip`` that follows the median update norm."""
DEFAULT_DP_CLIP = 1.0
"""Near the update norms of the default job (1.2 to 1.4), which it then clips mildly."""
COUNT_STDDEV_SHARE = 0.05
"""An adaptive clip's count noise, a share of the clients a round (TFF's default)."""

RUN_DEFINING = (
    "dataset",
    "emnist_train",
    "emnist_test",
    "fashion_clients",
    "model",
    "clients_per_round",
    "sampling",
    "epochs",
    "batch_size",
    "client_lr",
    "algorithm",
    "server_lr",
    "proximal_strength",
    "aggregator",
    "clip_norm",
    "dp_noise_multiplier",
    "dp_clip",
    "dp_delta",
    "privacy_budget",
    "seed",
)
"""The flags a rerun must repeat to resume; the others may change between runs."""

CONFIG = "config.json"


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def positive_number(text: str, expected: str = "a number") -> float:
    """An argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def _dp_clip(text: str) -> float | str:
    return ADAPTIVE if text == ADAPTIVE else positive_number(text, f"a number or {ADAPTIVE!r}")


def _probability(text: str) -> float:
    value = positive_number(text)
    if not value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (excluded), got {text}")
    return value


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked, with every default filled in.

    The EMNIST files it names must exist; a missing one exits with :func:`flag_error`.
    """
    parser = argparse.ArgumentParser(
        description="Federated averaging on real data, resumable (rerun to resume); "
        "samples/main_job_flags.py explains each flag.",
        formatter_class=WrittenDefaults,
    )
    data = _group(parser, "data")
    data(
        "--dataset",
        choices=DATASETS,
        default="digits",
        help="digits: scikit-learn's, by writer; fashion_mnist: Debian's "
        "dataset-fashion-mnist, Dirichlet label skew; emnist: HDF5 files",
    )
    data(
        "--fashion-clients",
        metavar="N",
        type=whole_number(1),
        default=100,
        help="Fashion-MNIST's clients",
    )
    data("--emnist-train", type=Path, metavar="FILE", help="federated EMNIST train .h5 file")
    data(
        "--emnist-test",
        type=Path,
        metavar="FILE",
        help="federated EMNIST test .h5 file (default: --emnist-train's with _test for _train)",
    )
    training = _group(parser, "model and training")
    training("--rounds", metavar="N", type=whole_number(1), default=50, help=ROUNDS_HELP)
    training(
        "--model",
        choices=list(CLIENT_LEARNING_RATES),
        default="softmax",
        help="softmax: the tutorial's; mlp: one hidden layer; cnn: two convolutions",
    )
    training(
        "--clients-per-round",
        metavar="K",
        type=whole_number(1),
        default=10,
        help="clients each round",
    )
    training(
        "--sampling",
        choices=[str(mode) for mode in Sampling],
        help="how each round picks its clients (default: uniform; poisson with DP)",
    )
    training(
        "--epochs", metavar="N", type=whole_number(1), default=5, help="local epochs per round"
    )
    training("--batch-size", metavar="N", type=whole_number(1), default=5, help="client batch size")
    training(
        "--client-lr",
        metavar="LR",
        type=positive_number,
        help="client SGD learning rate (default: 0.02 for softmax, 0.05 for mlp, 0.1 for cnn)",
    )
    training("--algorithm", choices=ALGORITHMS, default="fedavg", help="the training process")
    training(
        "--server-lr",
        metavar="LR",
        type=positive_number,
        help="server learning rate (default: 1.0 for fedavg and fedprox, 0.2 for fedavgm, "
        "0.1 for fedadam and fedyogi)",
    )
    training(
        "--proximal-strength",
        metavar="MU",
        type=positive_number,
        help="fedprox's mu (default: 0.01)",
    )
    training("--aggregator", choices=AGGREGATORS, help="how client updates combine (default: mean)")
    training(
        "--clip-norm",
        metavar="C",
        type=positive_number,
        help="clip each client's update to this L2 norm",
    )
    training(
        "--seed", metavar="N", type=whole_number(0), default=0, help="seeds sampling and shuffles"
    )
    privacy = _group(parser, "differential privacy")
    privacy("--dp-noise-multiplier", type=positive_number, metavar="Z", help="train with DP")
    privacy("--dp-clip", type=_dp_clip, metavar="C", help=f"DP clip, or {ADAPTIVE!r} (default: 1)")
    privacy("--dp-delta", type=_probability, metavar="DELTA", help="DP delta (default: 1 / N**1.1)")
    privacy(
        "--privacy-budget", type=positive_number, metavar="EPSILON", help="stop at this epsilon"
    )
    output = _group(parser, "run and output")
    output(
        "--root",
        metavar="DIR",
        type=Path,
        default=Path("runs/main_job"),
        help="the run's directory",
    )
    output(
        "--eval-every",
        metavar="N",
        type=whole_number(1),
        default=5,
        help="rounds between evaluations",
    )
    output(
        "--verbose",
        action="store_true",
        help="show TensorFlow's start-up lines and every log line, DEBUG included",
    )
    backend = _group(parser, "backend")
    backend(
        "--context",
        choices=("local", "ray"),
        default="local",
        help="local: threads of this process; ray: actors on a Ray cluster, with "
        "programlogic[ray] installed",
    )
    backend(
        "--ray-address",
        metavar="HOST:PORT",
        help="with --context ray: the cluster (default: a local Ray cluster)",
    )
    backend(
        "--workers",
        metavar="N",
        type=whole_number(1),
        help="threads or Ray actors for client work (default: the CPUs; with Ray, the cluster's)",
    )
    arguments = parser.parse_args(argv)
    _resolve(arguments, parser.error)
    for flag, path in (
        ("--emnist-train", arguments.emnist_train),
        ("--emnist-test", arguments.emnist_test),
    ):
        if path is not None and not path.is_file():
            flag_error(flag, f"{path} is a directory" if path.is_dir() else f"no file at {path}")
    return arguments


ROUNDS_HELP = (
    "train up to this round; a run that already holds more rounds ends at once, its last "
    "round's model the final one, and says so"
)


class WrittenDefaults(argparse.HelpFormatter):
    """``--help`` with each flag's help followed by its default, where the flag has one
    (not ``None`` or ``False``) and its help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False
        if unset or action.default == argparse.SUPPRESS or "(default:" in text:
            return text
        return f"{text} (default: %(default)s)"


def _group(parser: argparse.ArgumentParser, title: str) -> Callable[..., argparse.Action]:
    """A function adding flags under ``title`` in ``--help``."""
    return parser.add_argument_group(title).add_argument


def flag_error(flag: str, message: str) -> NoReturn:
    """Exit with status 2 and argparse's error line, ``prog: error: argument FLAG: ...``,
    alone: the flags parsed, what ``flag`` names on this machine is amiss."""
    prog = os.path.basename(sys.argv[0])
    sys.stderr.write(f"{prog}: error: argument {flag}: {message}\n")
    sys.exit(2)


def _resolve(arguments: argparse.Namespace, error: Callable[[str], Any]) -> None:
    """Fill in the defaults that depend on other flags; ``error`` reports a misfit."""
    a = arguments
    if a.client_lr is None:
        a.client_lr = CLIENT_LEARNING_RATES[a.model]
    if a.server_lr is None:
        a.server_lr = SERVER_LEARNING_RATES[a.algorithm]
    if a.algorithm != "fedprox" and a.proximal_strength is not None:
        error("--proximal-strength goes with --algorithm fedprox")
    if a.algorithm == "fedprox" and a.proximal_strength is None:
        a.proximal_strength = DEFAULT_PROXIMAL_STRENGTH
    if a.dp_noise_multiplier is None:
        for name in ("dp_clip", "dp_delta", "privacy_budget"):
            if getattr(a, name) is not None:
                error(f"--{name.replace('_', '-')} goes with --dp-noise-multiplier")
        a.sampling = a.sampling or "uniform"
        a.aggregator = a.aggregator or "mean"
    else:
        if a.aggregator is not None or a.clip_norm is not None:
            error(
                "--aggregator and --clip-norm do not go with --dp-noise-multiplier "
                "(dp_mean clips with --dp-clip and averages)"
            )
        a.sampling = a.sampling or "poisson"
        if a.sampling == "with_replacement":
            error(
                "--sampling with_replacement does not go with --dp-noise-multiplier "
                "(a client drawn twice would count twice): use poisson, uniform or fixed"
            )
        a.dp_clip = a.dp_clip or DEFAULT_DP_CLIP
        count_stddev = COUNT_STDDEV_SHARE * a.clients_per_round
        if a.dp_clip == ADAPTIVE and a.dp_noise_multiplier >= 2 * count_stddev:
            error(
                f"--dp-clip adaptive needs --dp-noise-multiplier below {2 * count_stddev:g} "
                "(a tenth of --clients-per-round): its clipped-count noise shares the "
                "privacy; use a fixed --dp-clip or more clients a round"
            )
    if a.dataset == "emnist" and a.emnist_train is None:
        error("--dataset emnist needs --emnist-train FILE.h5")
    if a.dataset != "emnist" and (a.emnist_train or a.emnist_test):
        error("--emnist-train and --emnist-test go with --dataset emnist")
    if a.ray_address is not None and a.context != "ray":
        error("--ray-address goes with --context ray")
    if a.ray_address is not None and not a.ray_address.strip():
        error("--ray-address must not be empty")


class DamagedConfigError(Exception):
    """The run's ``config.json`` cannot be read as a configuration."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"{path} is damaged ({reason}): restore it, or delete it and rerun with the flags "
            "the run was started with (or pick another --root to start over)"
        )


class OtherRunError(Exception):
    """The root holds a run whose defining flags differ from these."""


def run_config(arguments: argparse.Namespace) -> dict[str, Any]:
    """The defining flags of ``arguments``, as JSON values."""
    return {
        name: str(value) if isinstance(value, Path) else value
        for name in RUN_DEFINING
        for value in [getattr(arguments, name)]
    }


def check_config(root: Path, config: dict[str, Any], *, what: str = "a run configured") -> None:
    """Refuse to go on if ``root`` holds ``what`` otherwise, for the flags in ``config``.

    Reads only (blocking I/O). Raises :class:`DamagedConfigError` when the file is
    unreadable, not JSON or not a JSON object, :class:`OtherRunError` when it names other
    values for the flags.
    """
    path = root / CONFIG
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as error:
        raise DamagedConfigError(path, f"it cannot be read: {error.strerror}") from None
    if not content.strip():
        raise DamagedConfigError(path, "it is empty")
    try:
        recorded = json.loads(content)
    except ValueError as error:  # JSONDecodeError, or UnicodeDecodeError on binary content
        raise DamagedConfigError(path, f"it is not JSON: {error}") from None
    if not isinstance(recorded, dict):
        raise DamagedConfigError(path, f"it holds a {type(recorded).__name__}, not a JSON object")
    differing = [
        f"--{name.replace('_', '-')} {recorded.get(name)!r} -> {value!r}"
        for name, value in config.items()
        if recorded.get(name) != value
    ]
    if differing:
        raise OtherRunError(
            f"{root} holds {what} otherwise ({'; '.join(differing)}): "
            "repeat its flags to resume, or pick another --root"
        )


def record_config(root: Path, config: dict[str, Any]) -> None:
    """Write ``config`` to ``root``'s ``config.json`` unless it has one (blocking I/O)."""
    path = root / CONFIG
    if not path.exists():
        write_atomically(path, (json.dumps(config, indent=2) + "\n").encode())
