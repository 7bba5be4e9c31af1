"""bench/durable_cost.py: both tables and the JSON line, at a few rounds.

Nothing here asserts on a time: only that every configuration is measured and reported.
"""

from __future__ import annotations

import json

import pytest

from tests.bench.bench_scripts import run_bench

pytestmark = pytest.mark.anyio

CONFIGURATIONS = ["memory", "every round", "every 10"]


async def test_the_script_measures_every_configuration_alone_and_around_fedavg() -> None:
    output = run_bench(
        "durable_cost.py", "--rounds", "20", "--repeats", "1", "--fedavg-rounds", "8"
    )
    result = json.loads(output.splitlines()[-1])
    assert list(result["rows"]) == CONFIGURATIONS
    assert result["rows"]["memory"]["durable_cpu_ms_per_round"] == 0
    fedavg = result["fedavg"]
    assert (fedavg["clients"], fedavg["rounds"], fedavg["repeats"]) == (10, 8, 1)
    assert list(fedavg["rows"]) == CONFIGURATIONS
    assert all(row["round_ms"] > 0 for row in fedavg["rows"].values())
    assert fedavg["rows"]["memory"]["overhead_pct"] == 0
    assert "| FedAvg, 10 clients |" in output


async def test_the_fedavg_part_refuses_too_few_rounds_to_measure() -> None:
    with pytest.raises(AssertionError, match="fedavg-rounds must be 0 or more than"):
        run_bench("durable_cost.py", "--rounds", "5", "--repeats", "1", "--fedavg-rounds", "3")


async def test_the_script_compares_this_tree_with_a_revision_in_the_same_run() -> None:
    output = run_bench(
        "durable_cost.py",
        "--against",
        "HEAD",
        "--rounds",
        "10",
        "--repeats",
        "1",
        "--fedavg-rounds",
        "0",
    )
    result = json.loads(output.splitlines()[-1])
    assert (result["against"], result["pairs"]) == ("HEAD", 1)
    assert list(result["sides"]) == ["this tree", "HEAD"]
    for rows in result["sides"].values():
        assert list(rows) == CONFIGURATIONS
        assert rows["memory"]["durable_cpu_ms"]["median"] == 0
    assert "| every round | HEAD |" in output
