"""bench/tuning.py in a tiny form: 2 trials of 1 round, ``tune`` at concurrency 1 and 2 once.

The script runs in a subprocess, as it is run by hand and in CI, once per module (a
module fixture, not once per backend: each of its runs imports TensorFlow in a fresh
Python, which takes seconds). Nothing here reads a time: only that the figures are there
and that every run trained the same trials to the same accuracies.
"""

import importlib
import json
import os
from typing import Any

import pytest

from tests.bench.bench_scripts import BENCH, run_bench

pytestmark = pytest.mark.anyio

TINY = (
    *("--trials", "2", "--rounds", "1", "--repeats", "1"),
    *("--concurrency", "1,2", "--hand-concurrency", "1"),
)
TABLE_HEADER = "| run | concurrency | wall s | speed-up | cores used | peak RSS MiB | added MiB |"


@pytest.fixture(scope="module")
def tiny_run() -> tuple[str, dict[str, Any]]:
    stdout = run_bench("tuning.py", *TINY)
    json_lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(json_lines) == 1, stdout
    return stdout, json.loads(json_lines[0])


async def test_tiny_run_prints_the_table_and_the_figures(
    tiny_run: tuple[str, dict[str, Any]],
) -> None:
    stdout, summary = tiny_run
    assert TABLE_HEADER in stdout
    assert "tuner overhead per trial (tune at 1 - by hand at 1):" in stdout
    assert (summary["trials"], summary["rounds"], summary["repeats"]) == (2, 1, 1)
    assert [(row["run"], row["concurrency"]) for row in summary["rows"]] == [
        ("tuner", 1),
        ("hand", 1),
        ("tuner", 2),
    ]
    for row in summary["rows"]:
        assert row["wall_s"] > 0
        assert row["cores_used"] >= 0
        assert row["peak_rss_mib"] >= row["rss_before_mib"] > 0
        assert len(row["wall_s_each"]) == 1
        assert (row["storage_s"] is None) == (row["run"] == "hand")
    assert [row["speed_up"] for row in summary["rows"][:2]] == [1.0, 1.0]
    assert isinstance(summary["tuner_overhead_per_trial_ms"], float)
    assert summary["tuner_storage_per_trial_ms"] > 0
    assert summary["cpus"] == os.cpu_count()


async def test_every_run_trains_the_same_trials_to_the_same_accuracies(
    tiny_run: tuple[str, dict[str, Any]],
) -> None:
    _, summary = tiny_run
    rates = summary["client_lrs"]
    assert len(rates) == 2 and len(set(rates)) == 2
    assert all(0.005 <= rate <= 0.5 for rate in rates)
    assert summary["same_parameters"] and summary["same_accuracies"]


async def test_short_is_ci_s_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # as when the script runs from bench/
    bench = importlib.import_module("tuning")
    arguments = bench.parse(["--short"])
    assert (arguments.trials, arguments.rounds, arguments.repeats) == (4, 2, 1)
    assert (arguments.concurrency, arguments.hand_concurrency) == ([1, 2], [2])
    assert [kind for kind in bench.configurations(arguments)] == [
        ("tuner", 1),
        ("hand", 1),
        ("tuner", 2),
        ("hand", 2),
    ]
