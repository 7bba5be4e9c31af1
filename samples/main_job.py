"""The main job: federated averaging (or FedProx, FedAvgM, FedAdam, FedYogi) on real data.

The TensorFlow Federated EMNIST tutorial, done with programlogic: each round 10 clients
train the tutorial's softmax regression for 5 epochs of batches of 5 with SGD 0.02, and
the server applies the example-weighted mean of their updates (SGD 1.0). The default
data set is scikit-learn's bundled handwritten digits split by writer: 10 writers train,
4 held-out writers evaluate. Under ``--root`` (default ``runs/main_job``) it keeps what
:class:`programlogic.FileRun` keeps (``state/``, a checkpoint per round, the newest 3
and the first; ``metrics.csv`` and ``evaluation.csv``; ``tensorboard/``; ``models/``,
the final weights), and beside it ``config.json`` (the flags that define the run),
``model/<round>/`` (the final model as ``model.keras`` and a TensorFlow SavedModel:
``model/`` is TensorFlow Serving's model base path), ``best_model/<round>/`` (the same
for each evaluated round that had the best held-out accuracy so far), and ``main_job.log``
(every line logged, each rerun's appended).

On a terminal it shows its opening line, a progress bar, warnings and its final lines;
the library's lines (evaluations, checkpoints) go to ``main_job.log`` only. Where
standard error is no terminal (a pipe, a file, CI) there is no bar: a progress line every
tenth of the rounds takes its place. A missing ``--emnist-train`` or ``--emnist-test``
file, or a ``--root`` it cannot write, ends in argparse's one-line error (status 2).

Stop it at any moment (Ctrl-C, or kill it) and run the same command again: it resumes
after the last saved round and ends with the model an uninterrupted run gives. A larger
``--rounds`` continues a finished run; a smaller one ends at once, with the run's last
round's model as the final one, and says so. ``samples/plot_metrics.py`` draws the curves.

    python samples/main_job.py [--rounds 50] [--dataset digits] [--model softmax] ...

The flags, the algorithms and differential privacy are explained in
``samples/main_job_flags.py``. ``--context ray`` runs the client work on Ray actors: a
local Ray cluster, or the cluster ``--ray-address HOST:PORT`` names.
"""

from __future__ import annotations

import argparse
import csv
import functools
import logging
import math
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

import programlogic
from main_job_flags import (
    ADAPTIVE,
    DamagedConfigError,
    OtherRunError,
    check_config,
    flag_error,
    parse_arguments,
    record_config,
    run_config,
)
from managers import (
    BestModelReleaseManager,
    FileProgramStateManager,
    LoggingReleaseManager,
    ReleaseKey,
    ReleaseManager,
)
from programlogic import FileRun, FileRunEvaluation, LocalContext, final_model_key, train_model

__all__ = [
    "ACCURACY",
    "HELD_OUT_ACCURACY",
    "KERAS_INTEGRATIONS",
    "LOG_FILE",
    "PROGRESS_LINES",
    "Progress",
    "build_process",
    "configure_logging",
    "import_tensorflow",
    "main",
]

logger = logging.getLogger("main_job")
progress_logger = logging.getLogger("main_job.progress")

ACCURACY = "sparse_categorical_accuracy"
"""The accuracy metric's name, as the processes report it."""
HELD_OUT_ACCURACY = f"client_work/eval/total_rounds_metrics/{ACCURACY}"
"""The metric the best model is chosen by."""
KERAS_INTEGRATIONS = ("matplotlib", "sklearn")
"""What Keras imports, when installed, for its image galleries and scikit-learn
wrappers, which the job does not use: about 85 MB and a second of start-up."""
LOG_FILE = "main_job.log"
"""The run's log under ``--root``: every line logged (DEBUG too with ``--verbose``), each
rerun's appended."""
PROGRESS_LINES = 10
"""About how many progress lines a run writes where standard error is no terminal."""
TRIMMED_FRACTION = 0.2
SERVER_MOMENTUM = 0.9
ADAPTIVITY = 1e-3


def import_tensorflow(*, verbose: bool = False, without: tuple[str, ...] = ()) -> None:
    """Import TensorFlow and Keras, their start-up lines kept off the terminal
    (:func:`programlogic.quiet_tensorflow`) unless ``verbose``; the top-level packages
    ``without`` names stay out meanwhile.

    A package named in ``without`` has ``None`` in ``sys.modules`` during the import,
    which makes Python refuse to import it, so Keras leaves out the integration that
    needs it; it imports as usual afterwards. Does nothing once TensorFlow is imported.
    """
    if "tensorflow" in sys.modules:
        return
    if not verbose:
        programlogic.quiet_tensorflow()
    kept_out = [name for name in without if name not in sys.modules]
    sys.modules.update(dict.fromkeys(kept_out))
    try:
        import keras  # noqa: F401 - imported for its side effect
        import tensorflow  # noqa: F401
    finally:
        for name in kept_out:
            sys.modules.pop(name, None)


class Progress(ReleaseManager):
    """Training and evaluation metrics as they come: round, loss, accuracy, the latest
    held-out accuracy, and epsilon when the round reports ``privacy/epsilon``.

    With ``bar`` (standard error is a terminal) a progress bar with rounds/s, drawn from
    :meth:`start` on; without, a line on the ``main_job.progress`` logger every
    ``total_rounds / PROGRESS_LINES`` rounds (at least 1) and at round ``total_rounds``.
    """

    def __init__(self, total_rounds: int, *, bar: bool = True) -> None:
        self._total = total_rounds
        self._every = max(1, math.ceil(total_rounds / PROGRESS_LINES))
        self._draw = bar
        self._bar: Any = None
        self._first: int | None = None
        self._postfix: dict[str, str] = {}
        self._held_out: tuple[int, float] | None = None

    def start(self, first_round: int, total_rounds: int | None = None) -> None:
        """Show progress from here on, ``first_round`` rounds done, of ``total_rounds``
        (default: the constructor's)."""
        self._first = first_round
        if total_rounds is not None:
            self._total = total_rounds
            self._every = max(1, math.ceil(total_rounds / PROGRESS_LINES))
        if self._draw:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self._total, initial=first_round, unit="round", dynamic_ncols=True
            )

    async def release(self, value: Any, key: ReleaseKey) -> None:
        if not isinstance(key, int) or self._first is None:
            return
        trained = "train" in value.get("client_work", {})
        if trained:
            train = value["client_work"]["train"]
            self._postfix.update(loss=f"{train['loss']:.4f}", acc=f"{train[ACCURACY]:.4f}")
            if "epsilon" in value.get("privacy", {}):
                self._postfix.update(eps=f"{float(value['privacy']['epsilon']):.3g}")
        else:
            accuracy = float(value["client_work"]["eval"]["current_round_metrics"][ACCURACY])
            if self._held_out is None or key >= self._held_out[0]:
                self._held_out = (key, accuracy)
            self._postfix.update(eval_acc=f"{accuracy:.4f}")
        if self._bar is not None:
            self._bar.update(max(0, key - self._bar.n) if trained else 0)
            self._bar.set_postfix(self._postfix, refresh=True)
        elif trained and key > self._first and (key % self._every == 0 or key == self._total):
            self._log_line(key)

    def _log_line(self, round_num: int) -> None:
        shown = [f"loss {self._postfix['loss']}", f"accuracy {self._postfix['acc']}"]
        if self._held_out is not None:
            shown.append(f"held-out accuracy {self._held_out[1]:.4f} at round {self._held_out[0]}")
        if "eps" in self._postfix:
            shown.append(f"epsilon {self._postfix['eps']}")
        progress_logger.info("round %d of %d: %s", round_num, self._total, ", ".join(shown))

    async def aclose(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _AboveTheBar(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each line above tqdm's progress bars, which it clears and redraws."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def configure_logging(root: Path, *, verbose: bool, terminal: bool) -> Path:
    """Log every line to ``root``'s :data:`LOG_FILE` (appended), and to standard error
    the job's own lines and every warning (every line with ``verbose``).

    Progress lines reach standard error only where it is no ``terminal`` (a terminal
    shows the bar). Python warnings are logged too. Returns the log file's path;
    :class:`OSError` when it cannot be opened for writing.
    """
    path = root / LOG_FILE
    formatter = logging.Formatter("%(asctime)s %(name)s: %(message)s")
    to_file = logging.FileHandler(path, encoding="utf-8")
    console = (_AboveTheBar if terminal else logging.StreamHandler)(sys.stderr)

    def shown(record: logging.LogRecord) -> bool:
        if record.name == progress_logger.name:
            return not terminal
        return verbose or record.levelno >= logging.WARNING or record.name == logger.name

    console.addFilter(shown)
    for handler in (to_file, console):
        handler.setFormatter(formatter)
        logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # not each SavedModel's assets
    logging.getLogger("absl").setLevel(logging.ERROR)  # not dp-accounting's skipped RDP orders
    logging.captureWarnings(True)  # a warning printed as it comes would break the bar
    return path


def load_data(arguments: argparse.Namespace) -> Any:
    """The federated data set the flags name (blocking I/O)."""
    from programlogic import datasets

    if arguments.dataset == "digits":
        return datasets.load_digits_writers(sampling=arguments.sampling)
    if arguments.dataset == "fashion_mnist":
        return datasets.load_fashion_mnist(
            arguments.fashion_clients, seed=arguments.seed, sampling=arguments.sampling
        )
    try:
        return datasets.load_emnist_h5(
            arguments.emnist_train, arguments.emnist_test, sampling=arguments.sampling
        )
    except FileNotFoundError as error:  # the given files exist: the default test file
        flag_error("--emnist-test", f"{error} (the default beside --emnist-train)")


def dp_delta(arguments: argparse.Namespace, num_clients: int) -> float:
    """``--dp-delta``, or ``1 / num_clients**1.1``."""
    return float(arguments.dp_delta or num_clients**-1.1)


def mechanism(arguments: argparse.Namespace, num_clients: int) -> Any:
    """The :class:`~programlogic.privacy.GaussianMechanism` of a DP run on ``num_clients``."""
    from programlogic.privacy import GaussianMechanism

    return GaussianMechanism(
        arguments.dp_noise_multiplier,
        num_clients,
        arguments.clients_per_round,
        sampling=arguments.sampling,
    )


def build_process(
    arguments: argparse.Namespace, model_fn: Callable[[], Any], *, num_clients: int | None = None
) -> Any:
    """The training process the flags name, for the model ``model_fn`` builds.

    A DP run (``--dp-noise-multiplier``) needs ``num_clients``, the number of training
    clients its rounds sample from.
    """
    from programlogic import learning
    from programlogic.datasets import Preprocessing

    server = {
        "fedavgm": functools.partial(learning.sgd, momentum=SERVER_MOMENTUM),
        "fedadam": functools.partial(learning.adam, epsilon=ADAPTIVITY),
        "fedyogi": functools.partial(learning.yogi, epsilon=ADAPTIVITY),
    }.get(arguments.algorithm, learning.sgd)(arguments.server_lr)
    private = arguments.dp_noise_multiplier is not None
    if private:
        if num_clients is None:
            raise ValueError("a DP run needs num_clients, the number of training clients")
        clip = learning.adaptive_clipping() if arguments.dp_clip == ADAPTIVE else arguments.dp_clip
        delta = dp_delta(arguments, num_clients)
        aggregator = learning.dp_mean(mechanism(arguments, num_clients), clip, delta=delta)
    else:
        aggregator = {
            "mean": learning.mean,
            "median": learning.median,
            "trimmed_mean": lambda: learning.trimmed_mean(TRIMMED_FRACTION),
        }[arguments.aggregator]()
        if arguments.clip_norm is not None:
            aggregator = learning.clipping(arguments.clip_norm, aggregator)
    preprocess = Preprocessing(
        epochs=arguments.epochs, batch_size=arguments.batch_size, shuffle_buffer=100
    )
    common = {"model_aggregator": aggregator, "preprocess": preprocess, "seed": arguments.seed}
    client = learning.sgd(arguments.client_lr)
    if arguments.algorithm == "fedprox":
        build = learning.build_unweighted_fed_prox if private else learning.build_weighted_fed_prox
        return build(model_fn, arguments.proximal_strength, client, server, **common)
    build = learning.build_unweighted_fed_avg if private else learning.build_weighted_fed_avg
    return build(model_fn, client, server, **common)


async def run(arguments: argparse.Namespace, *, terminal: bool = False) -> None:
    """Train (or resume, or continue) the run the flags name, and say where its models are;
    progress as a bar on a ``terminal``, as log lines elsewhere."""
    from programlogic.learning import KerasModelReleaseManager, build_fed_eval, build_model

    root: Path = arguments.root
    data = await anyio.to_thread.run_sync(load_data, arguments)
    num_train = len(data.train.client_ids)
    if arguments.clients_per_round > num_train and arguments.sampling != "with_replacement":
        raise SystemExit(
            f"main_job: --clients-per-round {arguments.clients_per_round} is more than the "
            f"{num_train} training clients of {arguments.dataset}"
        )
    await anyio.to_thread.run_sync(record_config, root, run_config(arguments))
    model_fn = functools.partial(build_model, arguments.model, data.feature_shape, data.num_classes)
    stopping = None
    if arguments.privacy_budget is not None:
        from programlogic.privacy import PrivacyBudgetStopping

        stopping = PrivacyBudgetStopping(
            mechanism(arguments, num_train),
            epsilon=arguments.privacy_budget,
            delta=dp_delta(arguments, num_train),
        )
    if arguments.context == "ray":
        from programlogic.contexts.ray import RayContext

        context: programlogic.FederatedContext = RayContext(
            arguments.ray_address, max_workers=arguments.workers
        )
    else:
        context = LocalContext(max_workers=arguments.workers)
    progress = Progress(arguments.rounds, bar=terminal)
    shipped = KerasModelReleaseManager(root, model_fn)
    async with (
        context,
        FileProgramStateManager(root / "best_model_state", keep_total=1) as best_so_far,
        progress,
        FileRun(
            root,
            tensorboard=True,
            metrics_managers=[progress],
            model_managers=[shipped],
            evaluation=FileRunEvaluation(
                build_fed_eval(model_fn),
                data.test,
                cohort_size=len(data.test.client_ids),
                seed=arguments.seed,
                metrics_managers=[progress],
                per_round_metrics_manager=LoggingReleaseManager(logger, level=logging.DEBUG),
                evaluated_model_manager=BestModelReleaseManager(
                    KerasModelReleaseManager(root, model_fn, name="best_model"),
                    HELD_OUT_ACCURACY,
                    state_manager=best_so_far,
                ),
            ),
        ) as files,
    ):
        done = max(await files.state.get_versions(), default=0)
        within = arguments.rounds
        if stopping is not None:
            within = await anyio.to_thread.run_sync(stopping.rounds_within_budget)
            logger.info(
                "privacy budget: epsilon %g at delta %.3g allows %d round%s",
                stopping.epsilon,
                stopping.delta,
                within,
                "" if within == 1 else "s",
            )
        if done > arguments.rounds:
            logger.info(
                "--rounds %d is below the %d rounds %s holds, and a run never goes back: it "
                "ends at once with round %d's model as the final one (pick another --root "
                "to train %d rounds)",
                arguments.rounds,
                done,
                root,
                done,
                arguments.rounds,
            )
        elif done == arguments.rounds:
            logger.info(
                "%s already holds round %d of %d: pass --rounds > %d to train on",
                root,
                done,
                arguments.rounds,
                done,
            )
        elif done and done >= within:
            logger.info("%s already holds round %d, the last the privacy budget allows", root, done)
        elif done:
            logger.info("resuming after round %d from %s", done, root / "state")
        else:
            logger.info(
                "training %d rounds on %s (%d train clients, %d test clients) in %s",
                arguments.rounds,
                arguments.dataset,
                num_train,
                len(data.test.client_ids),
                root,
            )
        progress.start(done, max(arguments.rounds, done))
        result = await train_model(
            train_process=build_process(arguments, model_fn, num_clients=num_train),
            train_data_source=data.train,
            train_per_round_clients=arguments.clients_per_round,
            train_total_rounds=max(arguments.rounds, done),
            evaluation_periodicity=arguments.eval_every,
            seed=arguments.seed,
            stopping=stopping,
            **files.train_model_arguments(),
        )
    logger.info(
        "%s at round %d%s; held-out accuracy %s; final model %s in %s",
        result.stop_reason,
        result.round_num,
        "" if result.resumed_from is None else f" (resumed after round {result.resumed_from})",
        await held_out_accuracy(root / "evaluation.csv", result.round_num),
        final_model_key(result.round_num),
        root / "models",
    )
    if arguments.dp_noise_multiplier is not None:
        await log_privacy(arguments, num_train, result)
    version = shipped.version_path(final_model_key(result.round_num))
    logger.info("load the Keras model: keras.saving.load_model(%r)", str(version / "model.keras"))
    logger.info(
        "load the SavedModel: tf.saved_model.load(%r).signatures['serving_default']", str(version)
    )
    plot = Path(__file__).with_name("plot_metrics.py")
    logger.info(
        "plot the curves with: %s", shlex.join([interpreter(), shown_path(plot), str(root)])
    )
    logger.info("every line logged is in %s", root / LOG_FILE)


def interpreter() -> str:
    """This Python as the user ran it: as typed when that names it (``.venv/bin/python``,
    ``python3``), else its full path."""
    typed = sys.orig_argv[0] if sys.orig_argv else ""
    found = shutil.which(typed) if typed else None
    if found and sys.executable and os.path.samefile(found, sys.executable):
        return typed
    return sys.executable or "python"


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, else absolute."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith(os.pardir) else relative


async def held_out_accuracy(path: Path, round_num: int) -> str:
    """The held-out accuracy ``evaluation.csv`` at ``path`` holds for ``round_num``, or n/a."""
    text = await anyio.Path(path).read_text()
    for row in csv.DictReader(text.splitlines()):
        if row["key"] == str(round_num):
            return f"{float(row[f'client_work/eval/current_round_metrics/{ACCURACY}']):.4f}"
    return "n/a"


async def log_privacy(
    arguments: argparse.Namespace, num_train: int, result: programlogic.TrainingResult
) -> None:
    """Log the final model's epsilon, and whether the privacy budget stopped training."""
    from programlogic.privacy import PRIVACY_BUDGET_EXHAUSTED

    delta = dp_delta(arguments, num_train)
    spent = mechanism(arguments, num_train)
    epsilon = await anyio.to_thread.run_sync(spent.epsilon, result.round_num, delta)
    logger.info(
        "privacy: epsilon %.4g at delta %.3g after round %d (noise multiplier %g, clip %s, "
        "%s sampling of %d of %d clients)",
        epsilon,
        delta,
        result.round_num,
        arguments.dp_noise_multiplier,
        arguments.dp_clip,
        arguments.sampling,
        arguments.clients_per_round,
        num_train,
    )
    if result.stop_reason == PRIVACY_BUDGET_EXHAUSTED:
        logger.info(
            "the privacy budget (epsilon %g) stopped training after round %d of %d",
            arguments.privacy_budget,
            result.round_num,
            arguments.rounds,
        )


def main(argv: list[str] | None = None) -> None:
    """Run the main job on the command line ``argv`` (default: ``sys.argv[1:]``)."""
    arguments = parse_arguments(argv)
    root: Path = arguments.root
    if root.exists() and not root.is_dir():
        flag_error("--root", f"{root} is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        flag_error("--root", f"cannot create {root}: {error.strerror}")
    try:
        check_config(root, run_config(arguments))
    except DamagedConfigError as error:
        sys.stderr.write(f"main_job: {error}\n")
        sys.exit(2)
    except OtherRunError as error:
        sys.exit(f"main_job: {error}")
    terminal = sys.stderr.isatty()
    try:
        configure_logging(root, verbose=arguments.verbose, terminal=terminal)
    except OSError as error:
        flag_error("--root", f"cannot write to {root}: {error.strerror}")
    try:
        import_tensorflow(verbose=arguments.verbose, without=KERAS_INTEGRATIONS)
        programlogic.run(run(arguments, terminal=terminal))
    except KeyboardInterrupt:
        sys.exit("main_job: interrupted; rerun the same command to resume")
    except (FileNotFoundError, ImportError, programlogic.ClusterConnectionError) as error:
        sys.exit(f"main_job: {error}")


if __name__ == "__main__":
    main()
