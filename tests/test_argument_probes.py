"""Probes across the public API: a wrong type raises TypeError, a wrong value ValueError.

Each probe calls one public callable with valid arguments except one, and checks the
exception type and that the message names the argument and shows the value found.
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

import managers
import programlogic
from programlogic import privacy, testing

pytestmark = pytest.mark.anyio

MINUTE = datetime.timedelta(minutes=1)


class Probe(NamedTuple):
    target: str
    call: Callable[..., Any]
    valid: dict[str, Any]
    argument: str
    bad: Any
    error: type[Exception]


def learning() -> Any:
    return importlib.import_module("programlogic.learning")


def tuning() -> Any:
    return importlib.import_module("programlogic.tuning")


def ray_context(**arguments: Any) -> Any:
    return importlib.import_module("programlogic.contexts.ray").RayContext(**arguments)


def source() -> programlogic.InMemoryDataSource:
    return programlogic.InMemoryDataSource({"a": 1, "b": 2, "c": 3})


def select(*, k: int, round_num: int) -> Any:
    return source().iterator(0).select(k, round_num)


def iterator(*, seed: int) -> Any:
    return source().iterator(seed)


def evaluation_manager(**arguments: Any) -> programlogic.EvaluationManager:
    return programlogic.EvaluationManager(**arguments)


async def start_evaluation(*, train_round: int) -> None:
    manager = programlogic.EvaluationManager(
        source(),
        managers.MemoryReleaseManager(),
        lambda name: managers.MemoryProgramStateManager(),
        lambda name: (testing.FakeLearningProcess(), managers.MemoryReleaseManager()),
        cohort_size=1,
    )
    await manager.start_evaluation(train_round, 0, None)


async def program() -> int:
    return 1


def run(*, backend: Any) -> Any:
    return programlogic.run(program(), backend=backend)


def fake_clock_advance(*, delta: Any) -> None:
    testing.FakeClock().advance(delta)


def small_model() -> Any:
    return learning().softmax_regression((4,), 2)


def train_model_arguments() -> dict[str, Any]:
    return {
        "train_process": testing.FakeLearningProcess(),
        "train_data_source": testing.FakeDataSource(4),
        "train_per_round_clients": 2,
        "train_total_rounds": 2,
        "program_state_manager": managers.MemoryProgramStateManager(),
        "model_output_manager": managers.MemoryReleaseManager(),
    }


def evaluation_arguments() -> dict[str, Any]:
    return {
        "data_source": source(),
        "aggregated_metrics_manager": managers.MemoryReleaseManager(),
        "create_state_manager_fn": lambda name: managers.MemoryProgramStateManager(),
        "create_process_fn": lambda name: (None, None),
        "cohort_size": 1,
    }


def mechanism_arguments() -> dict[str, Any]:
    return {"noise_multiplier": 1.0, "num_clients": 10, "clients_per_round": 2}


def stopping_arguments() -> dict[str, Any]:
    return {"metric": "eval/loss", "state_manager": managers.MemoryProgramStateManager()}


def probes() -> list[Probe]:
    memory = managers.MemoryReleaseManager
    cases: list[tuple[str, Callable[..., Any], Callable[[], dict[str, Any]], list[tuple]]] = [
        (
            "MemoryReleaseManager",
            managers.MemoryReleaseManager,
            dict,
            [("max_entries", 0, ValueError), ("max_entries", True, TypeError)],
        ),
        (
            "MemoryProgramStateManager",
            managers.MemoryProgramStateManager,
            dict,
            [("keep_total", 0, ValueError), ("keep_total", 2.5, TypeError)],
        ),
        (
            "FileProgramStateManager",
            managers.FileProgramStateManager,
            lambda: {"root_dir": "never-opened"},
            [
                ("root_dir", 5, TypeError),
                ("root_dir", "", ValueError),
                ("prefix", 3, TypeError),
                ("prefix", "a/b", ValueError),
                ("keep_total", 0, ValueError),
                ("keep_total", True, TypeError),
                ("keep_first", 1, TypeError),
                ("keep_every", 0, ValueError),
                ("keep_every", "2", TypeError),
                ("on_all_damaged", "ignore", ValueError),
                ("on_all_damaged", False, TypeError),
            ],
        ),
        (
            "BestModelReleaseManager",
            managers.BestModelReleaseManager,
            lambda: {"manager": memory(), "metric": "eval/accuracy"},
            [
                ("manager", "memory", TypeError),
                ("metric", "", ValueError),
                ("metric", "eval//accuracy", ValueError),
                ("metric", 3, TypeError),
                ("mode", "best", ValueError),
                ("mode", 1, TypeError),
                ("state_manager", "state", TypeError),
            ],
        ),
        (
            "PeriodicReleaseManager",
            managers.PeriodicReleaseManager,
            lambda: {"manager": memory(), "periodicity": MINUTE},
            [
                ("manager", "memory", TypeError),
                ("periodicity", 0, ValueError),
                ("periodicity", -MINUTE, ValueError),
                ("periodicity", 1.5, TypeError),
                ("periodicity", True, TypeError),
                ("clock", "now", TypeError),
                ("state_manager", "state", TypeError),
            ],
        ),
        (
            "DelayedReleaseManager",
            managers.DelayedReleaseManager,
            lambda: {"manager": memory(), "delay": 1},
            [("delay", -1, ValueError), ("delay", 1.0, TypeError), ("manager", [], TypeError)],
        ),
        (
            "FilteringReleaseManager",
            managers.FilteringReleaseManager,
            lambda: {"manager": memory(), "filter_fn": bool},
            [("filter_fn", 3, TypeError), ("manager", None, TypeError)],
        ),
        (
            "GroupingReleaseManager",
            managers.GroupingReleaseManager,
            lambda: {"managers": [memory()]},
            [("managers", 5, TypeError)],
        ),
        (
            "LoggingReleaseManager",
            managers.LoggingReleaseManager,
            dict,
            [
                ("logger", "root", TypeError),
                ("level", "INFO", TypeError),
                ("level", -1, ValueError),
            ],
        ),
        (
            "CSVFileReleaseManager",
            managers.CSVFileReleaseManager,
            lambda: {"file_path": "m.csv"},
            [
                ("file_path", 3, TypeError),
                ("file_path", "", ValueError),
                ("key_fieldname", "", ValueError),
                ("key_fieldname", 3, TypeError),
            ],
        ),
        (
            "WriteQueue",
            managers.WriteQueue,
            dict,
            [("on_dropped", "forget", TypeError)],
        ),
        (
            "JSONLinesReleaseManager",
            managers.JSONLinesReleaseManager,
            lambda: {"file_path": "m.jsonl"},
            [("file_path", None, TypeError), ("file_path", "", ValueError)],
        ),
        (
            "ModelFileReleaseManager",
            managers.ModelFileReleaseManager,
            lambda: {"root_dir": "models"},
            [("root_dir", 7, TypeError)],
        ),
        (
            "TensorBoardReleaseManager",
            managers.TensorBoardReleaseManager,
            lambda: {"summary_dir": "runs"},
            [("summary_dir", 1.5, TypeError), ("summary_dir", "", ValueError)],
        ),
        (
            "check_key",
            managers.check_key,
            lambda: {"key": 1},
            [("key", 1.5, TypeError), ("key", True, TypeError), ("key", None, TypeError)],
        ),
        (
            "ClientHandle",
            programlogic.ClientHandle,
            lambda: {"client_id": "a", "loader": list},
            [("client_id", 3, TypeError), ("loader", "data", TypeError)],
        ),
        (
            "InMemoryDataSource",
            programlogic.InMemoryDataSource,
            lambda: {"clients": {"a": 1}},
            [
                ("clients", [("a", 1)], TypeError),
                ("clients", {}, ValueError),
                ("sampling", "often", ValueError),
                ("sampling", 3, TypeError),
            ],
        ),
        (
            "HandleDataSource",
            programlogic.HandleDataSource,
            lambda: {"handles": [programlogic.ClientHandle("a", list)]},
            [("handles", [], ValueError), ("sampling", "often", ValueError)],
        ),
        ("source.iterator", iterator, dict, [("seed", -1, ValueError), ("seed", "0", TypeError)]),
        (
            "iterator.select",
            select,
            lambda: {"k": 2, "round_num": 1},
            [
                ("k", 0, ValueError),
                ("k", 2.0, TypeError),
                ("k", True, TypeError),
                ("round_num", -1, ValueError),
                ("round_num", 1.5, TypeError),
            ],
        ),
        (
            "LocalContext",
            programlogic.LocalContext,
            dict,
            [("max_workers", 0, ValueError), ("max_workers", 2.5, TypeError)],
        ),
        (
            "RayContext",
            ray_context,
            dict,
            [
                ("address", "", ValueError),
                ("address", 3, TypeError),
                ("max_workers", 0, ValueError),
                ("max_workers", "2", TypeError),
                ("resources_per_worker", [1], TypeError),
                ("round_deadline", -1, ValueError),
                ("round_deadline", "5", TypeError),
                ("min_clients", 0, ValueError),
                ("max_retries", -1, ValueError),
                ("health_check_interval", 0, ValueError),
                ("init_options", [1], TypeError),
            ],
        ),
        (
            "EvaluationManager",
            evaluation_manager,
            evaluation_arguments,
            [
                ("data_source", {}, TypeError),
                ("aggregated_metrics_manager", None, TypeError),
                ("create_process_fn", 3, TypeError),
                ("cohort_size", 0, ValueError),
                ("cohort_size", 2.0, TypeError),
                ("duration", -MINUTE, ValueError),
                ("duration", 5, TypeError),
                ("clock", "now", TypeError),
                ("max_concurrent", 0, ValueError),
                ("seed", -1, ValueError),
                ("seed", "0", TypeError),
                ("evaluated_model_manager", "models", TypeError),
            ],
        ),
        (
            "EvaluationManager.start_evaluation",
            start_evaluation,
            dict,
            [("train_round", -1, ValueError), ("train_round", "3", TypeError)],
        ),
        (
            "evaluate_once",
            programlogic.evaluate_once,
            lambda: {"process": testing.FakeLearningProcess(), "model_weights": None},
            [("clients", 3, TypeError)],
        ),
        (
            "train_model",
            programlogic.train_model,
            train_model_arguments,
            [
                ("train_process", object(), TypeError),
                ("train_data_source", {"a": 1}, TypeError),
                ("train_per_round_clients", 0, ValueError),
                ("train_per_round_clients", 2.5, TypeError),
                ("train_total_rounds", 0, ValueError),
                ("train_total_rounds", "5", TypeError),
                ("seed", -1, ValueError),
                ("seed", True, TypeError),
                ("program_state_manager", "state", TypeError),
                ("model_output_manager", None, TypeError),
                ("evaluation_periodicity", 0, ValueError),
                ("evaluation_periodicity", -MINUTE, ValueError),
                ("evaluation_periodicity", 1.5, TypeError),
                ("stopping_waits_for_evaluations", 1, TypeError),
                ("resume_with_changed_configuration", 1, TypeError),
                ("clock", 3, TypeError),
                ("checkpoint_every", 0, ValueError),
                ("checkpoint_every", "3", TypeError),
                ("checkpoint_interval", 5, TypeError),
                ("checkpoint_interval", datetime.timedelta(0), ValueError),
                ("privacy_ledger", 3, TypeError),
                ("privacy_ledger", "", ValueError),
                ("privacy_spent_acknowledged", "1.5", TypeError),
                ("privacy_spent_acknowledged", -1.0, ValueError),
            ],
        ),
        ("run", run, dict, [("backend", "curio", ValueError), ("backend", 3, TypeError)]),
        (
            "SpeechTrainerStopping",
            programlogic.SpeechTrainerStopping,
            stopping_arguments,
            [
                ("metric", "", ValueError),
                ("metric", 3, TypeError),
                ("state_manager", 3, TypeError),
                ("window", 1, ValueError),
                ("window", 2.0, TypeError),
                ("mean_threshold", -1, ValueError),
                ("mean_threshold", math.nan, ValueError),
                ("std_threshold", "0", TypeError),
            ],
        ),
        (
            "GaussianMechanism",
            privacy.GaussianMechanism,
            mechanism_arguments,
            [
                ("noise_multiplier", -0.5, ValueError),
                ("noise_multiplier", math.inf, ValueError),
                ("noise_multiplier", "1", TypeError),
                ("num_clients", 0, ValueError),
                ("num_clients", 10.0, TypeError),
                ("clients_per_round", 0, ValueError),
                ("clients_per_round", 11, ValueError),
                ("clients_per_round", True, TypeError),
                ("sampling", "with_replacement", ValueError),
                ("sampling", "stratified", ValueError),
                ("sampling", 1, TypeError),
                ("accountant", "moments", ValueError),
                ("accountant", None, TypeError),
            ],
        ),
        (
            "GaussianMechanism(sampling='uniform')",
            lambda **arguments: privacy.GaussianMechanism(**{**arguments, "sampling": "uniform"}),
            mechanism_arguments,
            [("accountant", "pld", ValueError)],
        ),
        (
            "GaussianMechanism.epsilon",
            lambda **arguments: privacy.GaussianMechanism(1.0, 10, 2).epsilon(**arguments),
            lambda: {"rounds": 3, "delta": 1e-5},
            [
                ("rounds", -1, ValueError),
                ("rounds", 1.0, TypeError),
                ("delta", 0, ValueError),
                ("delta", 1.5, ValueError),
                ("delta", "1e-5", TypeError),
            ],
        ),
        (
            "PrivacyBudgetStopping",
            privacy.PrivacyBudgetStopping,
            lambda: {
                "mechanism": privacy.GaussianMechanism(1.0, 10, 2),
                "epsilon": 1.0,
                "delta": 1e-5,
            },
            [
                ("mechanism", {"noise_multiplier": 1.0}, TypeError),
                ("epsilon", 0, ValueError),
                ("epsilon", math.inf, ValueError),
                ("epsilon", "1", TypeError),
                ("delta", 1, ValueError),
                ("delta", None, TypeError),
            ],
        ),
        (
            "PrivacyBudgetStopping.before_round",
            lambda **arguments: privacy.PrivacyBudgetStopping(
                privacy.GaussianMechanism(1.0, 10, 2), epsilon=1.0, delta=1e-5
            ).before_round(**arguments),
            lambda: {"round_num": 1},
            [("round_num", -1, ValueError), ("round_num", 1.5, TypeError)],
        ),
        (
            "PatienceStopping",
            programlogic.PatienceStopping,
            stopping_arguments,
            [
                ("patience", 0, ValueError),
                ("patience", 1.5, TypeError),
                ("mode", "lowest", ValueError),
                ("mode", 1, TypeError),
                ("min_delta", -0.1, ValueError),
                ("min_delta", "0", TypeError),
            ],
        ),
        (
            "Preprocessing",
            lambda **arguments: importlib.import_module("programlogic.datasets").Preprocessing(
                **arguments
            ),
            dict,
            [
                ("epochs", 0, ValueError),
                ("epochs", 1.5, TypeError),
                ("batch_size", True, TypeError),
                ("shuffle_buffer", -1, ValueError),
                ("feature_shape", [784], TypeError),
                ("feature_shape", (0,), ValueError),
            ],
        ),
        (
            "dirichlet_partition",
            lambda **arguments: importlib.import_module(
                "programlogic.datasets"
            ).dirichlet_partition(**arguments),
            lambda: {"labels": np.arange(20) % 3, "num_clients": 4, "alpha": 0.5, "seed": 0},
            [
                ("num_clients", 0, ValueError),
                ("num_clients", "4", TypeError),
                ("alpha", 0.0, ValueError),
                ("alpha", math.inf, ValueError),
                ("alpha", "1", TypeError),
                ("seed", -1, ValueError),
                ("seed", 1.5, TypeError),
            ],
        ),
        (
            "load_fashion_mnist",
            lambda **arguments: importlib.import_module("programlogic.datasets").load_fashion_mnist(
                **arguments
            ),
            dict,
            [
                ("num_clients", 0, ValueError),
                ("num_clients", 2.5, TypeError),
                ("alpha", -1.0, ValueError),
                ("num_test_clients", 0, ValueError),
                ("seed", -1, ValueError),
                ("path", 3, TypeError),
                ("sampling", "often", ValueError),
            ],
        ),
        (
            "load_emnist_h5",
            lambda **arguments: importlib.import_module("programlogic.datasets").load_emnist_h5(
                **arguments
            ),
            lambda: {"train_path": "fed_emnist_train.h5"},
            [("only_digits", "yes", TypeError), ("train_path", 3, TypeError)],
        ),
        (
            "FakeDataSource",
            testing.FakeDataSource,
            dict,
            [("num_clients", 0, ValueError), ("dim", 1.5, TypeError), ("seed", -1, ValueError)],
        ),
        (
            "FakeLearningProcess",
            testing.FakeLearningProcess,
            dict,
            [("dim", 0, ValueError), ("learning_rate", "0.5", TypeError)],
        ),
        (
            "FakeContext",
            testing.FakeContext,
            dict,
            [
                ("faults", 3, TypeError),
                ("min_clients", 0, ValueError),
                ("min_clients", 1.5, TypeError),
                ("clock", "now", TypeError),
                ("max_workers", 0, ValueError),
            ],
        ),
        (
            "FailClient",
            testing.FailClient,
            lambda: {"client": "c1"},
            [
                ("client", "", ValueError),
                ("client", 3, TypeError),
                ("call", 0, ValueError),
                ("error", "boom", TypeError),
            ],
        ),
        (
            "DropClients",
            testing.DropClients,
            lambda: {"clients": ["c1"]},
            [("clients", "c1", TypeError), ("call", -1, ValueError), ("call", "2", TypeError)],
        ),
        ("LoseCluster", testing.LoseCluster, lambda: {"call": 3}, [("call", 0, ValueError)]),
        (
            "SlowCall",
            testing.SlowCall,
            lambda: {"takes": MINUTE},
            [("takes", -MINUTE, ValueError), ("takes", 60, TypeError), ("call", 0, ValueError)],
        ),
        ("FakeClock", testing.FakeClock, dict, [("start", "today", TypeError)]),
        ("FakeClock.advance", fake_clock_advance, dict, [("delta", -MINUTE, ValueError)]),
        (
            "CrashingStateManager",
            testing.CrashingStateManager,
            lambda: {"inner": managers.MemoryProgramStateManager(), "crash_on_version": 1},
            [
                ("inner", "state", TypeError),
                ("crash_on_version", -1, ValueError),
                ("after_save", "yes", TypeError),
            ],
        ),
        (
            "sgd",
            lambda **arguments: learning().sgd(**arguments),
            lambda: {"learning_rate": 0.1},
            [
                ("learning_rate", -0.1, ValueError),
                ("learning_rate", "0.1", TypeError),
                ("momentum", 1.0, ValueError),
            ],
        ),
        (
            "adam",
            lambda **arguments: learning().adam(**arguments),
            dict,
            [("beta_1", 1.0, ValueError), ("epsilon", True, TypeError)],
        ),
        (
            "adagrad",
            lambda **arguments: learning().adagrad(**arguments),
            lambda: {"learning_rate": 0.1},
            [
                ("learning_rate", -1.0, ValueError),
                ("initial_preconditioner_value", -0.1, ValueError),
                ("epsilon", "1e-7", TypeError),
            ],
        ),
        (
            "yogi",
            lambda **arguments: learning().yogi(**arguments),
            lambda: {"learning_rate": 0.1},
            [
                ("learning_rate", "0.1", TypeError),
                ("beta_1", 1.0, ValueError),
                ("beta_2", -0.5, ValueError),
                ("epsilon", -1.0, ValueError),
                ("initial_preconditioner_value", None, TypeError),
            ],
        ),
        (
            "rmsprop",
            lambda **arguments: learning().rmsprop(**arguments),
            lambda: {"learning_rate": 0.1},
            [
                ("learning_rate", -0.1, ValueError),
                ("decay", 1.0, ValueError),
                ("epsilon", [1e-7], TypeError),
            ],
        ),
        (
            "RMSprop",
            lambda **arguments: learning().RMSprop(**arguments),
            lambda: {"learning_rate": 0.1},
            [("epsilon_inside_sqrt", "yes", TypeError)],
        ),
        (
            "as_optimizer",
            lambda **arguments: learning().as_optimizer(**arguments, argument_name="value"),
            lambda: {"value": learning().sgd()},
            [("value", "adam", TypeError)],
        ),
        (
            "softmax_regression",
            lambda **arguments: learning().softmax_regression(**arguments),
            dict,
            [("input_shape", (0,), ValueError), ("input_shape", 784, TypeError)],
        ),
        (
            "FunctionalModel",
            lambda **arguments: importlib.import_module(
                "programlogic.learning.keras_model"
            ).FunctionalModel(**arguments),
            lambda: {"model_fn": small_model, "loss": None},
            [
                ("model_fn", "softmax", TypeError),
                ("loss", 3, TypeError),
                ("loss", "no_such_loss", ValueError),
            ],
        ),
        (
            "build_model",
            lambda **arguments: learning().build_model(**arguments),
            lambda: {"input_shape": (4,)},
            [("name", "rnn", ValueError), ("name", 3, TypeError)],
        ),
        (
            "build_weighted_fed_avg",
            lambda **arguments: learning().build_weighted_fed_avg(small_model, **arguments),
            dict,
            [
                ("client_optimizer", "sgd", TypeError),
                ("server_optimizer", 1.0, TypeError),
                ("preprocess", "batches", TypeError),
                ("seed", -1, ValueError),
                ("seed", "0", TypeError),
                ("clients_per_group", 0, ValueError),
                ("clients_per_group", 1.5, TypeError),
                ("loss", "no_such_loss", ValueError),
                ("metrics", "auc", TypeError),
                ("metrics", ["no_such_metric"], ValueError),
                ("metrics", ["auc", "auc"], ValueError),
                ("client_weighting", "examples", ValueError),
                ("model_aggregator", "median", TypeError),
            ],
        ),
        (
            "clipping",
            lambda **arguments: learning().clipping(**arguments),
            lambda: {"clip_norm": 1.0},
            [
                ("clip_norm", 0.0, ValueError),
                ("clip_norm", math.inf, ValueError),
                ("clip_norm", "1", TypeError),
                ("inner", "mean", TypeError),
            ],
        ),
        (
            "dp_mean",
            lambda **arguments: learning().dp_mean(**arguments),
            lambda: {
                "mechanism": importlib.import_module("programlogic.privacy").GaussianMechanism(
                    1.0, num_clients=100, clients_per_round=10
                ),
                "clip": 0.5,
                "delta": 1e-5,
            },
            [
                ("mechanism", 1.0, TypeError),
                ("clip", 0.0, ValueError),
                ("clip", "0.5", TypeError),
                ("delta", 1.0, ValueError),
                ("delta", 0.0, ValueError),
                ("secret", "s", TypeError),
            ],
        ),
        (
            "adaptive_clipping",
            lambda **arguments: learning().adaptive_clipping(**arguments),
            dict,
            [
                ("initial_clip", 0.0, ValueError),
                ("target_quantile", 1.5, ValueError),
                ("learning_rate", -0.1, ValueError),
                ("count_stddev", -1.0, ValueError),
                ("count_stddev", "1", TypeError),
            ],
        ),
        (
            "median",
            lambda **arguments: learning().median(**arguments),
            dict,
            [("max_clients", 0, ValueError), ("max_clients", 2.5, TypeError)],
        ),
        (
            "trimmed_mean",
            lambda **arguments: learning().trimmed_mean(**arguments),
            dict,
            [
                ("beta", 0.5, ValueError),
                ("beta", -0.1, ValueError),
                ("beta", "0.2", TypeError),
                ("max_clients", 0, ValueError),
            ],
        ),
        (
            "build_weighted_fed_prox",
            lambda **arguments: learning().build_weighted_fed_prox(small_model, **arguments),
            lambda: {"proximal_strength": 0.1},
            [
                ("proximal_strength", -1.0, ValueError),
                ("proximal_strength", "0.1", TypeError),
                ("client_weighting", "examples", ValueError),
                ("client_weighting", 1, TypeError),
                ("client_optimizer", "sgd", TypeError),
                ("seed", -1, ValueError),
                ("clients_per_group", 0, ValueError),
            ],
        ),
        (
            "build_unweighted_fed_prox",
            lambda **arguments: learning().build_unweighted_fed_prox(small_model, **arguments),
            lambda: {"proximal_strength": 0.1},
            [
                ("proximal_strength", float("nan"), ValueError),
                ("server_optimizer", 1.0, TypeError),
                ("preprocess", "batches", TypeError),
            ],
        ),
        (
            "build_unweighted_fed_avg",
            lambda **arguments: learning().build_unweighted_fed_avg(small_model, **arguments),
            dict,
            [
                ("client_optimizer", "sgd", TypeError),
                ("seed", "0", TypeError),
                ("clients_per_group", 1.5, TypeError),
            ],
        ),
        (
            "build_fed_sgd",
            lambda **arguments: learning().build_fed_sgd(small_model, **arguments),
            dict,
            [
                ("server_optimizer", "sgd", TypeError),
                ("preprocess", 3, TypeError),
                ("seed", -1, ValueError),
                ("clients_per_group", 0, ValueError),
                ("model_aggregator", 1, TypeError),
            ],
        ),
        (
            "build_fed_eval",
            lambda **arguments: learning().build_fed_eval(small_model, **arguments),
            dict,
            [
                ("preprocess", 3, TypeError),
                ("clients_per_group", 0, ValueError),
                ("train_process", "fedavg", TypeError),
                ("loss", 3, TypeError),
                ("metrics", "auc", TypeError),
                ("metrics", ["no_such_metric"], ValueError),
            ],
        ),
        (
            "KerasModelReleaseManager",
            lambda **arguments: learning().KerasModelReleaseManager(**arguments),
            lambda: {"root": "models", "model_fn": small_model},
            [
                ("root", 3, TypeError),
                ("root", "", ValueError),
                ("model_fn", "softmax", TypeError),
                ("formats", "keras", TypeError),
                ("formats", ("onnx",), ValueError),
                ("formats", (), ValueError),
                ("formats", ("keras", "keras"), ValueError),
                ("name", 3, TypeError),
                ("name", "a/b", ValueError),
                ("name", "", ValueError),
            ],
        ),
        (
            "tune",
            tuning().tune,
            lambda: {
                "search_space": lambda trial: None,
                "build_trial": lambda spec: None,
                "metric": "eval/loss",
                "direction": "minimize",
                "num_trials": 2,
                "root": "never-created",
            },
            [
                ("search_space", 3, TypeError),
                ("build_trial", "fedavg", TypeError),
                ("metric", "", ValueError),
                ("metric", 3, TypeError),
                ("direction", "down", ValueError),
                ("num_trials", 0, ValueError),
                ("root", 3, TypeError),
                ("concurrency", 0, ValueError),
                ("storage", 3, TypeError),
                ("study_name", "", ValueError),
                ("seed", -1, ValueError),
                ("sampler", "tpe", TypeError),
                ("pruner", "median", TypeError),
                ("fail_fast", 1, TypeError),
                ("poll_interval", 5, TypeError),
                ("on_progress", "print", TypeError),
            ],
        ),
        (
            "TrialProgram",
            lambda **arguments: tuning().TrialProgram(**arguments),
            lambda: {
                "train_process": testing.FakeLearningProcess(),
                "train_data_source": testing.FakeDataSource(4),
                "train_per_round_clients": 2,
                "train_total_rounds": 3,
                "evaluation_process": testing.FakeEvaluationProcess(),
                "evaluation_data_source": testing.FakeDataSource(4),
                "evaluation_per_round_clients": 2,
            },
            [
                ("train_process", "fedavg", TypeError),
                ("train_data_source", [1, 2], TypeError),
                ("train_per_round_clients", 0, ValueError),
                ("train_total_rounds", 0, ValueError),
                ("evaluation_process", None, TypeError),
                ("evaluation_per_round_clients", 1.5, TypeError),
                ("evaluation_periodicity", 0, ValueError),
                ("seed", -1, ValueError),
            ],
        ),
    ]
    return [
        Probe(target, call, valid(), argument, bad, error)
        for target, call, valid, bads in cases
        for argument, bad, error in bads
    ]


PROBES = probes()


@pytest.mark.parametrize(
    "probe",
    PROBES,
    ids=[f"{probe.target}-{probe.argument}={probe.bad!r}" for probe in PROBES],
)
async def test_a_wrong_argument_raises_naming_the_argument_and_the_value(probe: Probe) -> None:
    if probe.target == "RayContext":
        pytest.importorskip("ray")
    if probe.target == "TensorBoardReleaseManager":
        pytest.importorskip("tensorboardX")
    arguments = {**probe.valid, probe.argument: probe.bad}
    with pytest.raises(Exception) as raised:
        result = probe.call(**arguments)
        if inspect.isawaitable(result):
            await result
    error = raised.value
    assert type(error) is probe.error, f"{type(error).__name__}: {error}"
    message = str(error)
    assert probe.argument in message, message
    assert repr(probe.bad) in message, message
