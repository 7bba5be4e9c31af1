"""One run of ``bench/tuning.py``, in a process of its own: ``tune`` or the same by hand.

``bench/tuning.py`` starts this module's :func:`worker` in a fresh Python for each
configuration and reads the JSON line it prints: the run's wall time, cores used,
memory, and its trials' parameters and final held-out accuracies.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psutil

from programlogic import FileRun, FileRunEvaluation, LocalContext, train_model
from programlogic.stopping import StoppingPolicy

METRIC = "client_work/eval/total_rounds_metrics/sparse_categorical_accuracy"
"""The objective: the held-out writers' accuracy."""
CLIENTS_PER_ROUND = 10
LOW_LR, HIGH_LR = 0.005, 0.5


def search_space(trial: Any) -> float:
    """The client learning rate, log-uniform."""
    return trial.suggest_float("client_lr", LOW_LR, HIGH_LR, log=True)


class Workload:
    """The digits writers, loaded once per process, and a trial's program for a rate."""

    def __init__(self, rounds: int) -> None:
        import programlogic.learning  # noqa: F401  (TensorFlow: imported untimed)
        from programlogic.datasets import load_digits_writers

        self.data = load_digits_writers()
        self.rounds = rounds

    def program(self, client_lr: float) -> Any:
        """A ``TrialProgram`` with new processes: FedAvg at ``client_lr``, its evaluation."""
        from programlogic.datasets import Preprocessing
        from programlogic.learning import (
            build_fed_eval,
            build_weighted_fed_avg,
            sgd,
            softmax_regression,
        )
        from programlogic.tuning import TrialProgram

        data = self.data
        model_fn = functools.partial(softmax_regression, data.feature_shape, data.num_classes)
        preprocess = Preprocessing(epochs=5, batch_size=5, shuffle_buffer=100)
        return TrialProgram(
            train_process=build_weighted_fed_avg(
                model_fn, sgd(client_lr), sgd(1.0), preprocess=preprocess, seed=0
            ),
            train_data_source=data.train,
            train_per_round_clients=CLIENTS_PER_ROUND,
            train_total_rounds=self.rounds,
            evaluation_process=build_fed_eval(model_fn),
            evaluation_data_source=data.test,
            evaluation_per_round_clients=len(data.test.client_ids),
        )

    async def warm_up(self, directory: Path) -> None:
        """One round of a trial by hand, untimed: the process-wide first-use costs."""
        program = await anyio.to_thread.run_sync(self.program, 0.02)
        await hand_trial(dataclasses.replace(program, train_total_rounds=1), directory)


async def hand_trial(program: Any, directory: Path) -> None:
    """One trial's ``train_model`` call with a trial's managers, no tuner."""
    evaluation = FileRunEvaluation(
        process=program.evaluation_process,
        data_source=program.evaluation_data_source,
        cohort_size=program.evaluation_per_round_clients,
        seed=program.seed,
        state_keep_total=5,
    )
    async with FileRun(directory, state_keep_total=5, evaluation=evaluation) as run:
        await train_model(
            train_process=program.train_process,
            train_data_source=program.train_data_source,
            train_per_round_clients=program.train_per_round_clients,
            train_total_rounds=program.train_total_rounds,
            evaluation_periodicity=program.evaluation_periodicity,
            seed=program.seed,
            stopping=StoppingPolicy(),
            stopping_waits_for_evaluations=True,
            **run.train_model_arguments(),
        )


async def by_hand(workload: Workload, rates: list[float], root: Path, concurrency: int) -> None:
    """The trials by hand, ``concurrency`` slots each taking the next trial."""
    numbers = iter(range(len(rates)))

    async def slot() -> None:
        for number in numbers:
            program = await anyio.to_thread.run_sync(workload.program, rates[number])
            await hand_trial(program, root / "trials" / str(number))

    async with anyio.create_task_group() as slots:
        for _ in range(concurrency):
            slots.start_soon(slot)


async def with_tuner(workload: Workload, trials: int, root: Path, concurrency: int) -> Any:
    """The study through ``tune``: its ``TuningResult``."""
    import optuna

    from programlogic.tuning import tune

    result = await tune(
        search_space=search_space,
        build_trial=lambda spec: workload.program(spec.params["client_lr"]),
        metric=METRIC,
        direction="maximize",
        num_trials=trials,
        root=root,
        concurrency=concurrency,
        # Suggestions that depend on (seed, trial, parameter) only: every configuration
        # trains the same trials, whichever ends first.
        sampler=lambda seed: optuna.samplers.RandomSampler(seed=seed),
        pruner=optuna.pruners.NopPruner(),
        fail_fast=True,
    )
    return result


def final_accuracies(root: Path, trials: int) -> list[float]:
    """Each trial's held-out accuracy after its last round, from its ``evaluation.csv``."""
    accuracies = []
    for number in range(trials):
        lines = (root / "trials" / str(number) / "evaluation.csv").read_text().splitlines()
        header, last = lines[0].split(","), lines[-1].split(",")
        accuracies.append(float(last[header.index(METRIC)]))
    return accuracies


class PeakRSS:
    """The highest resident memory of this process, sampled every 10 ms on a thread."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._stop = threading.Event()
        self.start = self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


async def worker(arguments: argparse.Namespace) -> dict[str, Any]:
    """One run, timed from inside the federated context: the figures of one table row."""
    workload = await anyio.to_thread.run_sync(Workload, arguments.rounds)
    process = psutil.Process()
    rates = json.loads(arguments.rates) if arguments.rates else []
    tuned = None
    if arguments.worker == "tuner":  # Optuna and SQLAlchemy imported untimed
        import optuna  # noqa: F401

        import programlogic.tuning  # noqa: F401
    load = os.getloadavg()[0]
    async with LocalContext():
        await workload.warm_up(arguments.root / "warm_up")
        cpu_start, start = sum(process.cpu_times()[:2]), time.perf_counter()
        with PeakRSS() as memory:
            if arguments.worker == "tuner":
                root = arguments.root / "study"
                tuned = await with_tuner(workload, arguments.trials, root, arguments.run)
                rates = [trial.params["client_lr"] for trial in tuned.trials]
            else:
                root = arguments.root / "hand"
                await by_hand(workload, rates, root, arguments.run)
            wall = time.perf_counter() - start
            cpu = sum(process.cpu_times()[:2]) - cpu_start
    return {
        "run": arguments.worker,
        "concurrency": arguments.run,
        "wall_s": round(wall, 3),
        "cores_used": round(cpu / wall, 2),
        "rss_before_mib": round(memory.start / 2**20, 1),
        "peak_rss_mib": round(memory.peak / 2**20, 1),
        "added_rss_mib": round((memory.peak - memory.start) / 2**20, 1),
        # The seconds tune awaited its study's storage and locks (TuningResult's count):
        # the direct part of its overhead, as whole runs' wall times are too noisy to show it.
        "storage_s": None if tuned is None else round(tuned.storage_seconds, 3),
        "storage_calls": None if tuned is None else tuned.storage_calls,
        "load_average": round(load, 2),
        "client_lrs": rates,
        "accuracies": final_accuracies(root, len(rates)),
    }
