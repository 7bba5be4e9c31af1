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
``model/`` is TensorFlow Serving's model base path) and ``best_model/<round>/`` (the same
for each evaluated round that had the best held-out accuracy so far).

Stop it at any moment (Ctrl-C, or kill it) and run the same command again: it resumes
after the last saved round and ends with the model an uninterrupted run gives. A larger
``--rounds`` continues a finished run. ``samples/plot_metrics.py`` draws the curves.

    python samples/main_job.py [--rounds 50] [--dataset digits] [--model softmax] ...

The flags, the algorithms and differential privacy are explained in
``samples/main_job_flags.py``. ``--context ray`` runs the client work on Ray actors: a
local Ray cluster, or the cluster ``--ray-address HOST:PORT`` names.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

import programlogic
from main_job_flags import (
    ADAPTIVE,
    DamagedConfigError,
    OtherRunError,
    check_config,
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
    "ProgressBar",
    "build_process",
    "import_tensorflow",
    "main",
    "stderr_captured",
]

logger = logging.getLogger("main_job")

ACCURACY = "sparse_categorical_accuracy"
"""The accuracy metric's name, as the processes report it."""
HELD_OUT_ACCURACY = f"client_work/eval/total_rounds_metrics/{ACCURACY}"
"""The metric the best model is chosen by."""
KERAS_INTEGRATIONS = ("matplotlib", "sklearn")
"""What Keras imports, when installed, for its image galleries and scikit-learn
wrappers, which the job does not use: about 85 MB and a second of start-up."""
TRIMMED_FRACTION = 0.2
SERVER_MOMENTUM = 0.9
ADAPTIVITY = 1e-3


@contextlib.contextmanager
def stderr_captured() -> Iterator[None]:
    """File descriptor 2 on a temporary file while the block runs; what was written there
    goes to the terminal only if the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    failed = True
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                captured.seek(0)
                sys.stderr.write(captured.read().decode(errors="replace"))
                sys.stderr.flush()


def import_tensorflow(*, verbose: bool = False, without: tuple[str, ...] = ()) -> None:
    """Import TensorFlow and Keras, their C++ start-up lines shown only when ``verbose``
    or when the import fails; the top-level packages ``without`` names stay out meanwhile.

    TensorFlow's shared libraries print start-up lines (absl's, oneDNN's and CUDA's
    notes) whatever ``TF_CPP_MIN_LOG_LEVEL`` says, as they log before absl reads its
    settings: hence :func:`stderr_captured`. A package named in ``without`` has ``None``
    in ``sys.modules`` during the import, which makes Python refuse to import it, so
    Keras leaves out the integration that needs it; it imports as usual afterwards. Does
    nothing once TensorFlow is imported.
    """
    if "tensorflow" in sys.modules:
        return
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    kept_out = [name for name in without if name not in sys.modules]
    sys.modules.update(dict.fromkeys(kept_out))
    try:
        with contextlib.nullcontext() if verbose else stderr_captured():
            import keras  # noqa: F401 - imported for its side effect
            import tensorflow  # noqa: F401
    finally:
        for name in kept_out:
            sys.modules.pop(name, None)


class ProgressBar(ReleaseManager):
    """A progress bar fed by training and evaluation metrics: round, loss, accuracy, rounds/s,
    and epsilon when the round reports ``privacy/epsilon``. Drawn from :meth:`start` on."""

    def __init__(self, total_rounds: int) -> None:
        self._total = total_rounds
        self._bar: Any = None
        self._postfix: dict[str, str] = {}

    def start(self, first_round: int) -> None:
        """Draw the bar, ``first_round`` rounds of its total done."""
        from tqdm import tqdm

        self._bar = tqdm(total=self._total, initial=first_round, unit="round", dynamic_ncols=True)

    async def release(self, value: Any, key: ReleaseKey) -> None:
        if not isinstance(key, int) or self._bar is None:
            return
        if "train" in value.get("client_work", {}):
            train = value["client_work"]["train"]
            self._postfix.update(loss=f"{train['loss']:.4f}", acc=f"{train[ACCURACY]:.4f}")
            if "epsilon" in value.get("privacy", {}):
                self._postfix.update(eps=f"{float(value['privacy']['epsilon']):.3g}")
            self._bar.update(max(0, key - self._bar.n))
        else:
            held_out = value["client_work"]["eval"]["current_round_metrics"]
            self._postfix.update(eval_acc=f"{held_out[ACCURACY]:.4f}")
        self._bar.set_postfix(self._postfix, refresh=True)

    async def aclose(self) -> None:
        if self._bar is not None:
            self._bar.close()


def load_data(arguments: argparse.Namespace) -> Any:
    """The federated data set the flags name (blocking I/O)."""
    from programlogic import datasets

    if arguments.dataset == "digits":
        return datasets.load_digits_writers(sampling=arguments.sampling)
    if arguments.dataset == "fashion_mnist":
        return datasets.load_fashion_mnist(
            arguments.fashion_clients, seed=arguments.seed, sampling=arguments.sampling
        )
    return datasets.load_emnist_h5(
        arguments.emnist_train, arguments.emnist_test, sampling=arguments.sampling
    )


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


async def run(arguments: argparse.Namespace) -> None:
    """Train (or resume, or continue) the run the flags name, and say where its models are."""
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
    progress = ProgressBar(arguments.rounds)
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
        if done >= arguments.rounds:
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
        progress.start(done)
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
    logger.info("plot the curves with: python samples/plot_metrics.py %s", root)


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
    try:
        check_config(arguments.root, run_config(arguments))
    except DamagedConfigError as error:
        sys.stderr.write(f"main_job: {error}\n")
        sys.exit(2)
    except OtherRunError as error:
        sys.exit(f"main_job: {error}")
    logging.basicConfig(
        level=logging.DEBUG if arguments.verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
    )
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # not each SavedModel's assets
    logging.getLogger("absl").setLevel(logging.ERROR)  # not dp-accounting's skipped RDP orders
    from tqdm.contrib.logging import logging_redirect_tqdm

    try:
        import_tensorflow(verbose=arguments.verbose, without=KERAS_INTEGRATIONS)
        with logging_redirect_tqdm():
            programlogic.run(run(arguments))
    except KeyboardInterrupt:
        sys.exit("main_job: interrupted; rerun the same command to resume")
    except (FileNotFoundError, ImportError, programlogic.ClusterConnectionError) as error:
        sys.exit(f"main_job: {error}")


if __name__ == "__main__":
    main()
