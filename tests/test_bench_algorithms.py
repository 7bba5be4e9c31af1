"""``bench/algorithms_vs_tff.py`` builds our side of each comparison as
``bench/_algorithms.py`` describes it (TFF's side, in its own environment, builds from the
same descriptions): the optimizers' rules and hyperparameters, the unshuffled batches,
the weighting, FedProx's strength in TFF's sign and the clip norm. No round runs here
(CI runs the benchmark itself, against TFF).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.anyio

BENCH = Path(__file__).resolve().parent.parent / "bench"
RULE_CLASSES = {"sgd": "SGD", "adam": "Adam", "adagrad": "Adagrad", "yogi": "Yogi"}


def bench_modules(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    monkeypatch.syspath_prepend(str(BENCH))  # as when a bench script runs from bench/
    return importlib.import_module("_algorithms"), importlib.import_module("algorithms_vs_tff")


def assert_optimizer(described: dict[str, Any], spec: tuple[str, float, dict[str, Any]]) -> None:
    rule, learning_rate, keywords = spec
    assert described["class"] == RULE_CLASSES[rule]
    assert described["learning_rate"] == learning_rate
    for name, value in keywords.items():
        assert described[name] == value


async def test_each_algorithm_builds_ours_as_described(monkeypatch: pytest.MonkeyPatch) -> None:
    algorithms, bench = bench_modules(monkeypatch)
    assert set(algorithms.ALGORITHMS) == {
        "fedavg_sgdm",
        "fedavg_adam",
        "fedavg_adagrad",
        "fedavg_yogi",
        "unweighted_fedavg",
        "fedprox",
        "fedsgd",
        "fedavg_clipped",
        "dp_fixed",
    }
    for algorithm in algorithms.ALGORITHMS.values():
        configuration = bench.build_ours(algorithm, None, 10).describe_configuration()
        preprocess = configuration["preprocess"]
        assert (preprocess["epochs"], preprocess["batch_size"]) == (5, 5)
        assert preprocess["shuffle_buffer"] == 0, "both systems must see the same batches"
        assert_optimizer(configuration["server_optimizer"], algorithm.server)
        if algorithm.builder == "fed_sgd":
            assert configuration["algorithm"] == "fed_sgd"
            continue
        assert_optimizer(configuration["client_optimizer"], algorithm.client)
        expected = "uniform" if algorithm.builder == "unweighted_fed_avg" else "num_examples"
        assert configuration.get("client_weighting", "num_examples") == expected
        if algorithm.proximal_strength is not None:
            # TFF 0.87's sign: ours with the strength negated.
            assert configuration["proximal_strength"] == -algorithm.proximal_strength
        if algorithm.private:
            aggregator = configuration["model_aggregator"]
            assert (aggregator["aggregator"], aggregator["clip"]) == (
                "dp_mean",
                algorithm.clip_norm,
            )
            assert aggregator["mechanism"]["noise_multiplier"] == 0.0
            assert aggregator["mechanism"]["clients_per_round"] == 10
        elif algorithm.clip_norm is not None:
            aggregator = configuration["model_aggregator"]
            assert aggregator["aggregator"] == "clipping"
            assert aggregator["clip_norm"] == algorithm.clip_norm
            assert aggregator["inner"] == {"aggregator": "mean", "weighted": True}
