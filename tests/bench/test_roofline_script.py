"""bench/roofline.py: its FLOP count on cases worked by hand, every formulation computing
the same round, and the script's table and JSON at tiny shapes.

The script runs once per module in a subprocess (it imports TensorFlow, which takes
seconds); nothing here asserts on a time.
"""

from __future__ import annotations

import importlib
import json
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.bench.bench_scripts import BENCH, run_bench

pytestmark = pytest.mark.anyio

FORMULATIONS = ("numpy", "xla_matmul", "xla_bmr", "xla_unrolled", "keras_vmap", "keras_map")
TINY = ("--clients", "3", "--features", "16", "--examples", "10", "--epochs", "2")
TINY_REST = ("--repeats", "1", "--matmul-size", "64", "--formulations", *FORMULATIONS)


def roofline_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # as when the script runs from bench/
    return importlib.import_module("roofline")


@pytest.fixture(scope="module")
def script_output() -> str:
    return run_bench("roofline.py", *TINY, *TINY_REST)


async def test_the_tutorial_round_counts_its_two_products_and_the_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    roofline = roofline_module(monkeypatch)
    workload = roofline.Workload(clients=10)
    assert workload.steps == 100  # 5 epochs of 100 examples in batches of 5
    # Forward x @ W and gradient x^T @ g: 2 * 2 * 5 * 784 * 10; update: 2 * (7840 + 10).
    assert roofline.flops_per_step(workload) == 156_800 + 15_700
    assert roofline.flops_per_round(workload) == 172_500_000
    assert roofline.flops_per_round(roofline.Workload(clients=100)) == 1_725_000_000


async def test_the_cnn_counts_each_layer_and_the_input_gradients_past_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    roofline = roofline_module(monkeypatch)
    workload = roofline.Workload(1, "cnn", features=16, classes=2, batch=1, filters=1)
    # 4x4 image: conv 3x3 1->1 (144 multiply-adds, 10 parameters), conv 3x3 stride 2
    # 1->2 (72, 20), dense 8->2 (16, 18); the first layer has no input gradient.
    assert roofline.layers(workload) == [(144, 10), (72, 20), (16, 18)]
    expected = 2 * 144 * 2 + 2 * 72 * 3 + 2 * 16 * 3 + 2 * (10 + 20 + 18)
    assert roofline.flops_per_step(workload) == expected == 1200


@pytest.mark.parametrize("model", ["softmax", "mlp", "cnn"])
async def test_the_layers_hold_the_models_parameters(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    roofline = roofline_module(monkeypatch)
    from programlogic.learning import models

    workload = roofline.Workload(1, model, features=64, hidden=8, filters=4)
    built = {
        "softmax": lambda: models.softmax_regression((64,)),
        "mlp": lambda: models.mlp((64,), hidden=8),
        "cnn": lambda: models.cnn((64,), filters=4),
    }[model]()
    assert sum(parameters for _, parameters in roofline.layers(workload)) == built.count_params()


async def test_every_softmax_formulation_computes_the_same_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    roofline = roofline_module(monkeypatch)
    workload = roofline.Workload(3, features=16, examples=10, epochs=2)
    formulations = importlib.import_module("_roofline_formulations")
    data = formulations.softmax_data(3, 10, 16, 10)
    expected = roofline.build(workload, "numpy", data)(slice(None))
    assert np.abs(expected[0]).max() > 0  # it trained
    for name in FORMULATIONS[1:]:
        got = roofline.build(workload, name, data)(slice(None))
        for ours, theirs in zip(got, expected, strict=True):
            np.testing.assert_allclose(np.reshape(ours, theirs.shape), theirs, atol=1e-6)


async def test_the_script_prints_a_table_and_its_json(script_output: str) -> None:
    lines = script_output.splitlines()
    result = json.loads(lines[-1])
    assert result["benchmark"] == "roofline"
    (roof,) = result["results"]
    assert roof["workload"]["steps"] == 4
    assert roof["flops_per_round"] == 3 * 4 * (4 * 5 * 16 * 10 + 2 * (160 + 10))
    rows: list[dict[str, Any]] = roof["rows"]
    assert [(row["formulation"], row["split"]) for row in rows] == [
        (name, split) for name in FORMULATIONS for split in (1, 2)
    ]
    fastest = min(rows, key=lambda row: row["round_ms"])
    assert roof["ceiling_ms"] == fastest["round_ms"] > 0
    assert roof["ceiling"] == f"{fastest['formulation']} split {fastest['split']}"
    for row in rows:
        assert row["step_us"] == pytest.approx(row["round_ms"] * 1e3 / 4)
        assert row["floor_fraction"] == pytest.approx(roof["floor_ms"] / row["round_ms"])
    assert any(line.startswith("ceiling: ") for line in lines)
