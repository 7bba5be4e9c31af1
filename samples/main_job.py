"""The main job: federated averaging (or FedProx, FedAvgM, FedAdam, FedYogi) on real data.

The TensorFlow Federated EMNIST tutorial, done with programlogic: each round 10 clients
train the tutorial's softmax regression for 5 epochs of batches of 5 with SGD 0.02, and
the server applies the example-weighted mean of their updates (SGD 1.0). The default
data set is scikit-learn's bundled handwritten digits split by writer: 10 writers train,
4 held-out writers evaluate. Under ``--root`` (default ``runs/main_job``) it keeps:

- ``state/``: the program state, a checkpoint per round (the newest 3 and the first);
- ``metrics.csv`` and ``evaluation.csv``: training and held-out metrics per round;
- ``tensorboard/``: the same for ``tensorboard --logdir runs/main_job/tensorboard``;
- ``models/``: the final model weights; ``config.json``: the run's configuration;
- ``model/<round>/``: the final model as ``model.keras`` and a TensorFlow SavedModel
  (``model/`` is TensorFlow Serving's model base path); ``best_model/<round>/`` the same
  for each evaluated round that had the best held-out accuracy so far.

Stop it at any moment (Ctrl-C, or kill it) and run the same command again: it resumes
after the last saved round and ends with the model an uninterrupted run gives. A larger
``--rounds`` continues a finished run. ``samples/plot_metrics.py`` draws the curves.

    python samples/main_job.py [--rounds 50] [--dataset digits] [--model softmax] ...

``--algorithm fedprox|fedavgm|fedadam|fedyogi`` and ``--aggregator mean|median|trimmed_mean``
(``--clip-norm``): see ``samples/_job_algorithms.py``.

``--dp-noise-multiplier Z`` trains with differential privacy (``--dp-clip``,
``--dp-delta``, ``--privacy-budget EPSILON``): see ``samples/_job_privacy.py``.

TensorFlow's C++ start-up lines (absl, oneDNN, CUDA) are kept off the terminal, and
Keras' Matplotlib and scikit-learn integrations are not imported (see
``samples/_job_startup.py``); ``--verbose`` shows those lines and logs at DEBUG.

``--context ray`` runs the client work on Ray actors: a local Ray cluster, or the
cluster ``--ray-address HOST:PORT`` names (see the README's "Scale out on Ray").
"""

from __future__ import annotations

import argparse
import datetime
import functools
import logging
import sys
from pathlib import Path
from typing import Any

# A script (python samples/main_job.py, or run by runpy): the repository's root makes
# its sibling modules importable as the samples package's.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

import programlogic
from managers import (
    BestModelReleaseManager,
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    LoggingReleaseManager,
    ModelFileReleaseManager,
    ReleaseManager,
    TensorBoardReleaseManager,
)
from programlogic import EvaluationManager, LocalContext, Sampling, final_model_key, train_model
from samples._job_algorithms import (
    AGGREGATORS,
    ALGORITHMS,
    build_process,
    resolve_algorithm_flags,
)
from samples._job_config import (
    DamagedConfigError,
    OtherRunError,
    check_config,
    record_config,
    run_config,
)
from samples._job_privacy import (
    add_privacy_flags,
    dp_delta,
    mechanism,
    privacy_stopping,
    resolve_privacy_flags,
)
from samples._job_startup import KERAS_INTEGRATIONS, import_tensorflow

logger = logging.getLogger("main_job")

DATASETS = ("digits", "fashion_mnist", "emnist")
CLIENT_LEARNING_RATES = {"softmax": 0.02, "mlp": 0.05, "cnn": 0.1}
"""The default client learning rate of each model: the tutorial's for its softmax regression."""
ACCURACY = "sparse_categorical_accuracy"
"""The accuracy metric's name, as the processes report it."""
HELD_OUT_ACCURACY = f"client_work/eval/total_rounds_metrics/{ACCURACY}"
"""The metric the best model is chosen by."""


class ProgressBar(ReleaseManager):
    """A progress bar fed by training and evaluation metrics: round, loss, accuracy, rounds/s,
    and epsilon when the round reports ``privacy/epsilon``."""

    def __init__(self, total_rounds: int, first_round: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total_rounds, initial=first_round, unit="round", dynamic_ncols=True)
        self._postfix: dict[str, str] = {}

    async def release(self, value: Any, key: int | str) -> None:
        if not isinstance(key, int):
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
        self._bar.close()


def load_data(arguments: argparse.Namespace) -> Any:
    """The federated data set the flags name."""
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


async def run(arguments: argparse.Namespace) -> None:
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
    process = build_process(arguments, model_fn, num_clients=num_train)
    stopping = privacy_stopping(arguments, num_train)
    evaluation = build_fed_eval(model_fn)
    state_managers: dict[str, FileProgramStateManager] = {}

    def evaluation_state(name: str) -> FileProgramStateManager:
        if name not in state_managers:
            state_managers[name] = FileProgramStateManager(root / "evaluation" / name, keep_total=1)
        return state_managers[name]

    tensorboard = TensorBoardReleaseManager(root / "tensorboard")
    if arguments.context == "ray":
        from programlogic.contexts.ray import RayContext

        context: programlogic.FederatedContext = RayContext(
            arguments.ray_address, max_workers=arguments.workers
        )
    else:
        context = LocalContext(max_workers=arguments.workers)
    async with (
        context,
        FileProgramStateManager(root / "state", keep_total=3, keep_first=True) as state,
        FileProgramStateManager(root / "best_model_state", keep_total=1) as best_so_far,
    ):
        versions = await state.get_versions()
        done = max(versions, default=0)
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
        progress = ProgressBar(arguments.rounds, done)
        async with (
            progress,
            GroupingReleaseManager(
                [CSVFileReleaseManager(root / "metrics.csv"), tensorboard, progress]
            ) as train_metrics,
            GroupingReleaseManager(
                [CSVFileReleaseManager(root / "evaluation.csv"), tensorboard, progress]
            ) as eval_metrics,
        ):
            evaluations = EvaluationManager(
                data_source=data.test,
                aggregated_metrics_manager=eval_metrics,
                create_state_manager_fn=evaluation_state,
                create_process_fn=lambda name: (
                    evaluation,
                    LoggingReleaseManager(logger, level=logging.DEBUG),
                ),
                cohort_size=len(data.test.client_ids),
                duration=datetime.timedelta(0),
                seed=arguments.seed,
                evaluated_model_manager=BestModelReleaseManager(
                    KerasModelReleaseManager(root, model_fn, name="best_model"),
                    HELD_OUT_ACCURACY,
                    state_manager=best_so_far,
                ),
            )
            shipped = KerasModelReleaseManager(root, model_fn)
            models = GroupingReleaseManager([ModelFileReleaseManager(root / "models"), shipped])
            result = await train_model(
                train_process=process,
                train_data_source=data.train,
                train_per_round_clients=arguments.clients_per_round,
                train_total_rounds=max(arguments.rounds, done),
                program_state_manager=state,
                model_output_manager=models,
                train_metrics_manager=train_metrics,
                evaluation_manager=evaluations,
                evaluation_periodicity=arguments.eval_every,
                seed=arguments.seed,
                stopping=stopping,
            )
        for manager in state_managers.values():
            await manager.aclose()
    held_out = await _final_evaluation(root / "evaluation.csv", result.round_num)
    logger.info(
        "%s at round %d%s; held-out accuracy %s; final model %s in %s",
        result.stop_reason,
        result.round_num,
        "" if result.resumed_from is None else f" (resumed after round {result.resumed_from})",
        held_out,
        final_model_key(result.round_num),
        root / "models",
    )
    if arguments.dp_noise_multiplier is not None:
        await _log_privacy(arguments, num_train, result)
    version = shipped.version_path(final_model_key(result.round_num))
    logger.info("load the Keras model: keras.saving.load_model(%r)", str(version / "model.keras"))
    logger.info(
        "load the SavedModel: tf.saved_model.load(%r).signatures['serving_default']", str(version)
    )
    logger.info("plot the curves with: python samples/plot_metrics.py %s", root)


async def _log_privacy(
    arguments: argparse.Namespace, num_train: int, result: programlogic.TrainingResult
) -> None:
    """Log the final model's epsilon, and whether the privacy budget stopped training."""
    from programlogic.privacy import PRIVACY_BUDGET_EXHAUSTED

    spent = mechanism(arguments, num_train)
    delta = dp_delta(arguments, num_train)
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


async def _final_evaluation(path: Path, round_num: int) -> str:
    import csv

    text = await anyio.Path(path).read_text()
    for row in csv.DictReader(text.splitlines()):
        if row["key"] == str(round_num):
            return f"{float(row[f'client_work/eval/current_round_metrics/{ACCURACY}']):.4f}"
    return "n/a"


def _whole(minimum: int) -> Any:
    """An argparse type: a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a bad value exits with a one-line error."""
    parser = argparse.ArgumentParser(
        description="Federated averaging on real data, resumable (rerun to resume).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rounds", type=_whole(1), default=50, help="train up to this round")
    parser.add_argument(
        "--clients-per-round", type=_whole(1), default=10, help="clients sampled each round"
    )
    parser.add_argument(
        "--sampling",
        choices=[str(mode) for mode in Sampling],
        help="how each round picks its clients (default: uniform; poisson with DP)",
    )
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default="digits",
        help="digits: scikit-learn's, by writer; fashion_mnist: Debian's "
        "dataset-fashion-mnist, Dirichlet label skew; emnist: HDF5 files",
    )
    parser.add_argument(
        "--fashion-clients", type=_whole(1), default=100, help="clients to split Fashion-MNIST into"
    )
    parser.add_argument("--emnist-train", type=Path, help="federated EMNIST train .h5 file")
    parser.add_argument("--emnist-test", type=Path, help="federated EMNIST test .h5 file")
    parser.add_argument(
        "--model",
        choices=list(CLIENT_LEARNING_RATES),
        default="softmax",
        help="softmax: the tutorial's; mlp: one hidden layer; cnn: two convolutions",
    )
    parser.add_argument("--epochs", type=_whole(1), default=5, help="local epochs per round")
    parser.add_argument("--batch-size", type=_whole(1), default=5, help="client batch size")
    parser.add_argument(
        "--client-lr",
        type=_rate,
        help="client SGD learning rate (default: 0.02 for softmax, 0.05 for mlp, 0.1 for cnn)",
    )
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="fedavg",
        help="fedprox: proximal client term; fedavgm: server momentum 0.9; fedadam, fedyogi: "
        "adaptive server (see samples/_job_algorithms.py)",
    )
    parser.add_argument(
        "--server-lr",
        type=_rate,
        help="server learning rate (default: 1.0 for fedavg and fedprox, 0.2 for fedavgm, "
        "0.1 for fedadam and fedyogi)",
    )
    parser.add_argument(
        "--proximal-strength", type=_rate, help="with --algorithm fedprox: mu (default: 0.01)"
    )
    parser.add_argument(
        "--aggregator",
        choices=AGGREGATORS,
        help="how client updates combine: mean (by examples, the default), or the robust "
        "median and trimmed_mean (beta 0.2)",
    )
    parser.add_argument(
        "--clip-norm",
        type=_rate,
        help="clip each client's update to this L2 norm before --aggregator (default: none)",
    )
    add_privacy_flags(parser)
    parser.add_argument(
        "--eval-every",
        type=_whole(1),
        default=5,
        help="evaluate on the held-out clients every this many rounds",
    )
    parser.add_argument("--seed", type=_whole(0), default=0, help="seeds sampling and shuffles")
    parser.add_argument(
        "--workers",
        type=_whole(1),
        help="threads (--context local) or Ray actors (--context ray) that run client work "
        "(default: this machine's CPUs, or the Ray cluster's)",
    )
    parser.add_argument(
        "--context",
        choices=("local", "ray"),
        default="local",
        help="local: threads of this process; ray: actors on a Ray cluster "
        "(pip install 'programlogic[ray]')",
    )
    parser.add_argument(
        "--ray-address",
        help="with --context ray: the cluster to connect to (HOST:PORT of `ray start --head`, "
        "or auto); default: start a local Ray cluster",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("runs/main_job"),
        help="directory of the run's state, metrics and models",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's start-up lines and DEBUG logs (each release, among others)",
    )
    arguments = parser.parse_args(argv)
    if arguments.client_lr is None:
        arguments.client_lr = CLIENT_LEARNING_RATES[arguments.model]
    resolve_algorithm_flags(arguments, parser.error)
    resolve_privacy_flags(arguments, parser.error)
    if arguments.dataset == "emnist" and arguments.emnist_train is None:
        parser.error("--dataset emnist needs --emnist-train FILE.h5")
    if arguments.ray_address is not None and arguments.context != "ray":
        parser.error("--ray-address goes with --context ray")
    if arguments.ray_address is not None and not arguments.ray_address.strip():
        parser.error("--ray-address must not be empty")
    if arguments.dataset != "emnist" and (arguments.emnist_train or arguments.emnist_test):
        parser.error("--emnist-train and --emnist-test go with --dataset emnist")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    try:
        check_config(arguments.root, run_config(arguments))
    except DamagedConfigError as error:
        sys.stderr.write(f"main_job: {error}\n")
        sys.exit(2)
    except OtherRunError as error:
        sys.exit(f"main_job: {error}")
    verbose = arguments.verbose
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
    )
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # not each SavedModel's assets
    logging.getLogger("absl").setLevel(logging.ERROR)  # not dp-accounting's skipped RDP orders
    from tqdm.contrib.logging import logging_redirect_tqdm

    try:
        import_tensorflow(verbose=verbose, without=KERAS_INTEGRATIONS)
        with logging_redirect_tqdm():
            programlogic.run(run(arguments))
    except KeyboardInterrupt:
        sys.exit("main_job: interrupted; rerun the same command to resume")
    except (FileNotFoundError, ImportError, programlogic.ClusterConnectionError) as error:
        sys.exit(f"main_job: {error}")


if __name__ == "__main__":
    main()
