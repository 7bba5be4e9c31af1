"""Sampling.POISSON: each client joins a round on a coin of its own, a pure function of
the seed, the round and its id."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from managers import MemoryProgramStateManager, MemoryReleaseManager
from programlogic import (
    ClientHandle,
    InMemoryDataSource,
    LearningProcessOutput,
    LocalContext,
    Sampling,
    train_model,
)
from programlogic.datasets import load_digits_writers

pytestmark = pytest.mark.anyio


def poisson_source(count: int, *, first: int = 0) -> InMemoryDataSource:
    return InMemoryDataSource(
        {f"client_{i:03d}": [i] for i in range(first, first + count)}, sampling="poisson"
    )


def ids(handles: Sequence[ClientHandle]) -> list[str]:
    return [handle.client_id for handle in handles]


async def test_a_round_is_pinned_by_seed_round_and_ids() -> None:
    # Pinned: a change here changes every Poisson run already started.
    chosen = ids(poisson_source(20).iterator(7).select(5, 3))
    assert chosen == ["client_000", "client_008", "client_019"]


async def test_the_selection_is_the_same_in_another_process() -> None:
    code = (
        "import json; from programlogic import InMemoryDataSource;"
        "s = InMemoryDataSource({f'client_{i:03d}': [i] for i in range(50)}, sampling='poisson');"
        "print(json.dumps([[h.client_id for h in s.iterator(11).select(10, r)] "
        "for r in range(5)]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    here = poisson_source(50).iterator(11)
    assert json.loads(done.stdout) == [ids(here.select(10, r)) for r in range(5)]


async def test_rounds_differ_and_seeds_differ() -> None:
    iterator = poisson_source(100).iterator(0)
    rounds = [tuple(ids(iterator.select(10, r))) for r in range(20)]
    assert len(set(rounds)) == 20
    assert {len(chosen) for chosen in rounds} != {10}  # the size varies round to round
    other_seed = poisson_source(100).iterator(1)
    assert [tuple(ids(other_seed.select(10, r))) for r in range(20)] != rounds


async def test_clients_join_with_probability_k_over_n() -> None:
    count, k, rounds = 200, 20, 500  # q = 0.1
    iterator = poisson_source(count).iterator(2026)
    joins = collections.Counter(
        client for r in range(rounds) for client in ids(iterator.select(k, r))
    )
    total = sum(joins.values())
    expected, std = rounds * k, (rounds * count * 0.1 * 0.9) ** 0.5  # 10000, about 95
    assert abs(total - expected) < 5 * std, total
    per_client_std = (rounds * 0.1 * 0.9) ** 0.5  # about 6.7 around 50 joins each
    assert all(abs(joins[f"client_{i:03d}"] - 50) < 6 * per_client_std for i in range(count))


async def test_a_round_keeps_the_id_order_and_holds_distinct_clients() -> None:
    iterator = poisson_source(60).iterator(5)
    for r in range(30):
        chosen = ids(iterator.select(20, r))
        assert chosen == sorted(set(chosen))


async def test_a_clients_coin_does_not_depend_on_the_other_clients() -> None:
    small, large = poisson_source(30).iterator(9), poisson_source(60).iterator(9)
    for r in range(10):
        # q is k / N: the same q over 30 and over 60 clients.
        in_small = set(ids(small.select(5, r)))
        in_large = {c for c in ids(large.select(10, r)) if c < "client_030"}
        assert in_small == in_large


async def test_k_equal_to_n_takes_every_client_and_more_is_refused() -> None:
    source = poisson_source(8)
    assert ids(source.iterator(0).select(8, 4)) == sorted(source.client_ids)
    with pytest.raises(ValueError, match=r"\b9\b"):
        source.iterator(0).select(9, 4)
    with pytest.raises(ValueError, match=r"k.*0"):
        source.iterator(0).select(0, 4)


async def test_the_description_names_poisson_sampling() -> None:
    description = poisson_source(8).iterator(3).describe()
    assert description["sampling"] == "poisson" == Sampling.POISSON
    assert (
        description
        != InMemoryDataSource({f"client_{i:03d}": [i] for i in range(8)}).iterator(3).describe()
    )


async def test_the_digits_writers_sample_by_poisson_on_request() -> None:
    train = load_digits_writers(sampling="poisson").train
    iterator = train.iterator(0)
    sizes = {len(iterator.select(5, r)) for r in range(30)}
    assert len(sizes) > 1 and max(sizes) <= len(train.client_ids)


class Recording:
    """A learning process that counts rounds and records each round's clients."""

    def __init__(self) -> None:
        self.rounds: list[list[str]] = []

    async def initialize(self) -> dict[str, int]:
        return {"rounds": 0}

    async def next(self, state: Any, clients: Sequence[ClientHandle]) -> LearningProcessOutput:
        self.rounds.append(ids(clients))
        return LearningProcessOutput({"rounds": state["rounds"] + 1}, {"clients": len(clients)})

    async def get_model_weights(self, state: Any) -> int:
        return state["rounds"]

    async def set_model_weights(self, state: Any, weights: Any) -> Any:
        return {"rounds": int(weights)}


async def test_train_model_hands_an_empty_round_to_the_process_and_counts_it() -> None:
    source = poisson_source(10)  # k = 1: a round is empty with probability 0.9**10
    iterator = source.iterator(0)
    empty = [r for r in range(1, 21) if not iterator.select(1, r)]
    assert empty, "the seed gives an empty round among the first 20"
    process = Recording()
    async with LocalContext():
        result = await train_model(
            train_process=process,
            train_data_source=source,
            train_per_round_clients=1,
            train_total_rounds=20,
            program_state_manager=MemoryProgramStateManager(),
            model_output_manager=MemoryReleaseManager(),
        )
    assert result.state == {"rounds": 20}  # every round ran, the empty ones too
    assert [r for r, clients in enumerate(process.rounds, start=1) if not clients] == empty
    assert process.rounds == [ids(iterator.select(1, r)) for r in range(1, 21)]
