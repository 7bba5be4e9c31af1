"""Tuning the main job: FedAvg's learning rates and local epochs on the digits writers.

An Optuna study of ``--trials`` trials (default 20), ``--concurrency`` at a time (4),
each a FedAvg run of ``samples/main_job.py``'s defaults (the tutorial's softmax
regression, the 10 training writers every round, batches of 5) for ``--rounds`` rounds,
with its own client learning rate (log scale, 0.001 to 1), server learning rate (log
scale, 0.1 to 3) and local epochs (1 to 5), suggested by Optuna's TPE sampler. Every
``--eval-every`` rounds a trial's model is evaluated on the 4 held-out writers; the
objective is that held-out accuracy at the last round, maximized, and a median pruner
stops a trial whose accuracy falls below the median of the complete trials' at the same
round (once 4 trials are complete, from round 6 on). A progress bar counts the ended
trials and shows the running, pruned, complete and failed ones and the best accuracy so
far. At the end it prints the best parameters and where the best trial's final model
is, and saves Optuna's ``optimization_history.png`` and ``param_importances.png``.

Under ``--root`` (default ``runs/tune``): ``study.db`` (the study, in SQLite unless
``--storage`` names another database), ``config.json`` (the flags a rerun must repeat),
and ``trials/<number>/`` per trial: ``state/`` (its checkpoints), ``metrics.csv``,
``evaluation.csv``, and ``models/final_training_checkpoint_round_<round>.model``,
its final weights (``managers.ModelFileReleaseManager(<trial>/models).load(key)``).

Crash-safe by construction: stop it at any moment (Ctrl-C, or kill -9) and run the same
command again. Ended trials stay as they are, the trials that were running resume from
their last checkpoint with their parameters, and the study goes on to ``--trials``
trials. The trials suggested after the interruption may differ from an uninterrupted
study's: TPE suggests from the trials ended by then, and with trials running at once
that depends on when each ended. A larger ``--trials`` extends a finished study; several
machines sharing ``--storage`` (e.g. ``postgresql+psycopg://...``) and ``--root`` (a
shared file system) split the trials.

    python samples/tune.py [--trials 20] [--concurrency 4] [--rounds 30] [--root runs/tune]

Needs the ``examples`` extra (``pip install 'programlogic[examples]'``).
"""

from __future__ import annotations

import argparse
import functools
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio

import programlogic
from main_job import HELD_OUT_ACCURACY, build_process, import_tensorflow
from main_job_flags import (
    DamagedConfigError,
    OtherRunError,
    WrittenDefaults,
    check_config,
    record_config,
    whole_number,
)
from managers import ModelFileReleaseManager
from programlogic import LocalContext

CLIENT_LEARNING_RATES = (1e-3, 1.0)
SERVER_LEARNING_RATES = (0.1, 3.0)
LOCAL_EPOCHS = (1, 5)
STARTUP_TRIALS = 4
"""Complete trials before the pruner prunes: the median of fewer says little."""
WARMUP_ROUNDS = 6
"""The first round a trial may be pruned at: a slow start is not yet a bad trial."""
TARGET = "held-out accuracy"
"""The objective's name in the plots."""
STUDY_DEFINING = ("rounds", "eval_every", "seed")
"""The flags a rerun must repeat (its trials would otherwise train other programs)."""


def search_space(trial: Any) -> None:
    """The parameters of a trial, suggested on ``trial`` (an ``optuna.Trial``)."""
    trial.suggest_float("client_lr", *CLIENT_LEARNING_RATES, log=True)
    trial.suggest_float("server_lr", *SERVER_LEARNING_RATES, log=True)
    trial.suggest_int("epochs", *LOCAL_EPOCHS)


def trial_builder(arguments: argparse.Namespace, data: Any) -> Any:
    """A ``build_trial`` for ``tune``: the main job's FedAvg with a trial's parameters."""
    from programlogic.learning import build_fed_eval, build_model
    from programlogic.tuning import TrialProgram, TrialSpec

    model_fn = functools.partial(build_model, "softmax", data.feature_shape, data.num_classes)

    def build(spec: TrialSpec) -> TrialProgram:
        flags = argparse.Namespace(
            algorithm="fedavg",
            aggregator="mean",
            clip_norm=None,
            dp_noise_multiplier=None,
            batch_size=5,
            seed=arguments.seed,
            **spec.params,
        )
        process = build_process(flags, model_fn)
        return TrialProgram(
            train_process=process,
            train_data_source=data.train,
            train_per_round_clients=len(data.train.client_ids),
            train_total_rounds=arguments.rounds,
            evaluation_process=build_fed_eval(model_fn),
            evaluation_data_source=data.test,
            evaluation_per_round_clients=len(data.test.client_ids),
            evaluation_periodicity=arguments.eval_every,
            seed=arguments.seed,
        )

    return build


class TrialsBar:
    """A progress bar of ended trials, fed by ``tune``'s ``on_progress``."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit="trial", dynamic_ncols=True)

    def __call__(self, progress: Any) -> None:
        newly_ended = progress.complete + progress.pruned + progress.failed - self._bar.n
        best = "-" if progress.best is None else f"{progress.best.value:.4f}"
        # A trial that started redraws the bar; one that ended moves it, which redraws it.
        self._bar.set_postfix_str(
            f"running {progress.running}, pruned {progress.pruned}, complete "
            f"{progress.complete}, failed {progress.failed}, best accuracy {best}",
            refresh=not newly_ended,
        )
        if newly_ended:
            self._bar.update(newly_ended)
        trial = progress.trial
        if trial is not None and trial.state != "running":
            value = "" if trial.value is None else f", accuracy {trial.value:.4f}"
            self._bar.write(
                f"trial {trial.number} {trial.state} at round {trial.final_round}{value}",
                file=sys.stderr,  # beside the bar; stdout keeps the study's outcome
            )

    def close(self) -> None:
        self._bar.close()


async def run(arguments: argparse.Namespace) -> Any:
    """Run (or resume) the study, print its outcome, save its plots; return the result."""
    import optuna

    from programlogic.datasets import load_digits_writers
    from programlogic.tuning import tune

    await anyio.to_thread.run_sync(check_study_flags, arguments)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = await anyio.to_thread.run_sync(load_digits_writers)
    bar = TrialsBar(arguments.trials)
    try:
        async with LocalContext(max_workers=arguments.workers):
            result = await tune(
                search_space=search_space,
                build_trial=trial_builder(arguments, data),
                metric=HELD_OUT_ACCURACY,
                direction="maximize",
                num_trials=arguments.trials,
                root=arguments.root,
                concurrency=arguments.concurrency,
                storage=arguments.storage,
                seed=arguments.seed,
                pruner=optuna.pruners.MedianPruner(
                    n_startup_trials=STARTUP_TRIALS, n_warmup_steps=WARMUP_ROUNDS
                ),
                on_progress=bar,
            )
    finally:
        bar.close()
    await report(result, arguments.root)
    return result


async def report(result: Any, root: Path) -> None:
    """Print the study's outcome and the best trial's model; save Optuna's plots."""
    states = [trial.state for trial in result.trials]
    print(
        f"{len(states)} trials: {states.count('complete')} complete, "
        f"{states.count('pruned')} pruned, {states.count('failed')} failed"
    )
    for trial in result.trials:
        if trial.state == "failed":
            print(f"trial {trial.number} failed: {trial.error}")
    best = result.best
    if best is None:
        print("no trial completed: no best parameters")
    else:
        print(f"best trial {best.number}: held-out accuracy {best.value:.4f}")
        for name, value in best.params.items():
            print(f"  {name} = {value:.4g}")
        models = ModelFileReleaseManager(best.directory / "models")
        weights = await models.load(best.model_key)
        (path,) = [
            path for path in (best.directory / "models").iterdir() if path.stem == best.model_key
        ]
        print(f"best model: {path} ({len(weights['trainable'])} weight arrays)")
    for name in await anyio.to_thread.run_sync(save_plots, result.study, root):
        print(f"saved {root / name}")


def save_plots(study: Any, root: Path) -> list[str]:
    """Save Optuna's optimization history and parameter importances as PNGs under ``root``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as plots

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    saved = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        figures = {
            "optimization_history.png": lambda: plots.plot_optimization_history(
                study, target_name=TARGET
            )
        }
        if len(complete) >= 2:
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            figures["param_importances.png"] = lambda: plots.plot_param_importances(
                study, evaluator=evaluator, target_name=TARGET
            )
        else:
            print(f"parameter importances need 2 complete trials, the study has {len(complete)}")
        for name, plot in figures.items():
            axes = plot()
            axes.figure.tight_layout()
            axes.figure.savefig(root / name, dpi=120)
            plt.close(axes.figure)
            saved.append(name)
    return saved


def check_study_flags(arguments: argparse.Namespace) -> None:
    """Record the study-defining flags in ``<root>/config.json``, or exit if they differ."""
    flags = {name: getattr(arguments, name) for name in STUDY_DEFINING}
    try:
        check_config(arguments.root, flags, what="a study run")
    except (DamagedConfigError, OtherRunError) as error:
        sys.exit(f"tune: {error}")
    record_config(arguments.root, flags)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a bad value exits with a one-line error."""
    parser = argparse.ArgumentParser(
        description="Tune FedAvg's learning rates and local epochs (rerun to resume).",
        formatter_class=WrittenDefaults,
    )
    parser.add_argument("--trials", type=whole_number(1), default=20, help="trials in the study")
    parser.add_argument(
        "--concurrency", type=whole_number(1), default=4, help="trials that train at once"
    )
    parser.add_argument("--rounds", type=whole_number(1), default=30, help="rounds of each trial")
    parser.add_argument(
        "--eval-every",
        type=whole_number(1),
        default=2,
        help="evaluate on the held-out writers (and maybe prune) every this many rounds",
    )
    parser.add_argument(
        "--seed", type=whole_number(0), default=0, help="seeds the sampler and shuffles"
    )
    parser.add_argument(
        "--workers", type=whole_number(1), help="threads that run client work (default: CPUs)"
    )
    parser.add_argument(
        "--storage",
        help="SQLAlchemy URL of the study's database, e.g. to share it between machines "
        "(default: sqlite:///<root>/study.db)",
    )
    parser.add_argument(
        "--root", type=Path, default=Path("runs/tune"), help="directory of the study's trials"
    )
    parser.add_argument("--verbose", action="store_true", help="show TensorFlow's start-up lines")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    try:
        import_tensorflow(verbose=arguments.verbose)  # Optuna's plots need Matplotlib
        programlogic.run(run(arguments))
    except KeyboardInterrupt:
        sys.exit("tune: interrupted; rerun the same command to resume")
    except ImportError as error:
        sys.exit(f"tune: {error}")


if __name__ == "__main__":
    main()
