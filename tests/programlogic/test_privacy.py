"""programlogic.privacy: epsilon equals dp-accounting's, and the budget stop in train_model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import StopReason, final_model_key
from programlogic.privacy import (
    PRIVACY_BUDGET_EXHAUSTED,
    GaussianMechanism,
    PrivacyBudgetStopping,
    composed_epsilon,
)
from programlogic.testing import CrashingStateManager, SimulatedCrash
from tests.programlogic.dp_helpers import dp_process, train
from tests.programlogic.needs_learning import NEEDS_LEARNING

dp_accounting = pytest.importorskip("dp_accounting")

pytestmark = pytest.mark.anyio

ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE


def direct_epsilon(mechanism: GaussianMechanism, rounds: int, delta: float) -> float:
    """Epsilon from dp-accounting called directly: a round's event composed ``rounds`` times."""
    gaussian = dp_accounting.GaussianDpEvent(mechanism.noise_multiplier)
    n, k = mechanism.num_clients, mechanism.clients_per_round
    if mechanism.sampling == "poisson":
        event, relation = dp_accounting.PoissonSampledDpEvent(k / n, gaussian), ADD_OR_REMOVE
    elif mechanism.sampling == "uniform":
        event = dp_accounting.SampledWithoutReplacementDpEvent(n, k, gaussian)
        relation = REPLACE_ONE
    else:
        event, relation = gaussian, ADD_OR_REMOVE
    if mechanism.accountant == "pld":
        accountant = dp_accounting.pld.PLDAccountant(neighboring_relation=relation)
    else:
        accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    accountant.compose(event, rounds)
    return accountant.get_epsilon(delta)


SETTINGS = [
    (GaussianMechanism(1.0, 3400, 100), 100, 3400**-1.1),
    (GaussianMechanism(1.0, 3400, 100), 1000, 3400**-1.1),
    (GaussianMechanism(0.8, 1000, 50), 500, 1e-5),
    (GaussianMechanism(1.0, 3400, 100, sampling="uniform"), 300, 3400**-1.1),
    (GaussianMechanism(0.7, 1000, 50, sampling="uniform"), 50, 1e-6),
    (GaussianMechanism(5.0, 100, 10, sampling="fixed"), 20, 1e-5),
    (GaussianMechanism(1.0, 3400, 100, accountant="pld"), 100, 3400**-1.1),
    (GaussianMechanism(8.0, 100, 10, sampling="fixed", accountant="pld"), 10, 1e-5),
]


@pytest.mark.parametrize(("mechanism", "rounds", "delta"), SETTINGS)
async def test_epsilon_is_what_dp_accounting_gives_directly(
    mechanism: GaussianMechanism, rounds: int, delta: float
) -> None:
    expected = direct_epsilon(mechanism, rounds, delta)
    assert 0 < expected < math.inf
    assert mechanism.epsilon(rounds, delta) == pytest.approx(expected, rel=1e-12, abs=0)


async def test_rdp_epsilon_equals_rounds_composed_one_at_a_time() -> None:
    mechanism = GaussianMechanism(1.1, 500, 20)
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(20 / 500, dp_accounting.GaussianDpEvent(1.1))
    for _ in range(40):
        accountant.compose(event)
    assert mechanism.epsilon(40, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)


async def test_the_event_names_the_sampling() -> None:
    poisson = GaussianMechanism(1.0, 10, 2).dp_event(3)
    assert poisson == dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(1.0)), 3
    )
    uniform = GaussianMechanism(1.0, 10, 2, sampling="uniform").dp_event(3)
    assert uniform.event == dp_accounting.SampledWithoutReplacementDpEvent(
        10, 2, dp_accounting.GaussianDpEvent(1.0)
    )
    fixed = GaussianMechanism(1.0, 10, 2, sampling="fixed").dp_event(3)
    assert fixed.event == dp_accounting.GaussianDpEvent(1.0)


async def test_epsilon_grows_with_rounds_and_falls_with_noise() -> None:
    delta = 1e-5
    by_rounds = [GaussianMechanism(1.0, 1000, 50).epsilon(r, delta) for r in (1, 10, 100, 1000)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 4
    by_noise = [GaussianMechanism(z, 1000, 50).epsilon(100, delta) for z in (0.6, 1.0, 2.0, 4.0)]
    assert by_noise == sorted(by_noise, reverse=True) and len(set(by_noise)) == 4


@pytest.mark.parametrize("sampling", ["poisson", "uniform", "fixed"])
async def test_no_rounds_spend_nothing_and_no_noise_spends_everything(sampling: str) -> None:
    assert GaussianMechanism(1.0, 100, 10, sampling=sampling).epsilon(0, 1e-5) == 0.0
    assert GaussianMechanism(0, 100, 10, sampling=sampling).epsilon(0, 1e-5) == 0.0
    assert GaussianMechanism(0, 100, 10, sampling=sampling).epsilon(1, 1e-5) == math.inf


async def test_amplification_by_sampling_and_the_guarantee_of_each_sampling() -> None:
    poisson, uniform, fixed = (
        GaussianMechanism(1.0, 1000, 50, sampling=sampling)
        for sampling in ("poisson", "uniform", "fixed")
    )
    assert poisson.epsilon(100, 1e-5) < fixed.epsilon(100, 1e-5)
    assert (poisson.sampling_probability, uniform.sampling_probability) == (0.05, 0.05)
    assert fixed.sampling_probability == 1.0
    assert [m.adjacency for m in (poisson, uniform, fixed)] == [
        "add_or_remove_one",
        "replace_one",
        "add_or_remove_one",
    ]
    assert [m.sensitivity_factor for m in (poisson, uniform, fixed)] == [1.0, 2.0, 1.0]


async def test_a_mechanism_describes_itself_as_json_and_is_hashable() -> None:
    mechanism = GaussianMechanism(1, 3400, 100)
    description = mechanism.describe()
    assert json.loads(json.dumps(description)) == description
    assert description == {
        "noise_multiplier": 1.0,
        "num_clients": 3400,
        "clients_per_round": 100,
        "sampling": "poisson",
        "accountant": "rdp",
        "adjacency": "add_or_remove_one",
    }
    assert hash(mechanism) == hash(GaussianMechanism(1.0, 3400, 100))


async def test_a_sampling_enum_member_is_accepted() -> None:
    from programlogic import Sampling

    mechanism = GaussianMechanism(1.0, 10, 2, sampling=Sampling.UNIFORM)
    assert mechanism.sampling == "uniform" and type(mechanism.sampling) is str


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"sampling": "with_replacement"}, ValueError, "with_replacement.*refused"),
        ({"sampling": "uniform", "accountant": "pld"}, ValueError, "PLD.*without replacement"),
        ({"clients_per_round": 11}, ValueError, "clients_per_round.*11"),
        ({"noise_multiplier": -1.0}, ValueError, "noise_multiplier.*-1.0"),
        ({"noise_multiplier": math.inf}, ValueError, "noise_multiplier.*inf"),
        ({"sampling": "stratified"}, ValueError, "sampling.*stratified"),
        ({"accountant": "moments"}, ValueError, "accountant.*moments"),
    ],
)
async def test_a_mechanism_refuses_what_it_cannot_account(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        GaussianMechanism(
            **{"noise_multiplier": 1.0, "num_clients": 10, "clients_per_round": 2, **arguments}
        )


async def test_epsilon_checks_its_arguments() -> None:
    mechanism = GaussianMechanism(1.0, 10, 2)
    with pytest.raises(ValueError, match=r"rounds.*-1"):
        mechanism.epsilon(-1, 1e-5)
    with pytest.raises(ValueError, match=r"delta.*0"):
        mechanism.epsilon(1, 0)
    with pytest.raises(TypeError, match=r"rounds.*1.5"):
        mechanism.epsilon(1.5, 1e-5)  # type: ignore[arg-type]


async def test_the_module_imports_neither_tensorflow_nor_the_learning_package() -> None:
    code = (
        "import sys, programlogic.privacy as p;"
        "p.GaussianMechanism(1.0, 10, 2).epsilon(3, 1e-5);"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')"
        " or m.startswith('programlogic.learning')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_a_missing_dp_accounting_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['dp_accounting'] = None;"
        "import programlogic.privacy as p;"
        "p.GaussianMechanism(1.0, 10, 2).epsilon(3, 1e-5)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "pip install 'programlogic[privacy]'" in done.stderr


# The budget stop.

MECHANISM = GaussianMechanism(2.0, 20, 4)
DELTA = 1e-5
BUDGET = 1.6


def rounds_within(mechanism: GaussianMechanism, budget: float) -> int:
    rounds = 0
    while direct_epsilon(mechanism, rounds + 1, DELTA) <= budget:
        rounds += 1
    return rounds


async def test_the_budget_allows_the_rounds_whose_epsilon_is_within_it() -> None:
    expected = rounds_within(MECHANISM, BUDGET)
    assert 2 <= expected <= 30  # the setting makes a short run
    policy = PrivacyBudgetStopping(MECHANISM, epsilon=BUDGET, delta=DELTA)
    assert policy.rounds_within_budget() == expected
    assert await policy.before_round(expected) is None
    assert await policy.before_round(expected + 1) is PRIVACY_BUDGET_EXHAUSTED
    assert await policy.before_round(expected + 1) is PRIVACY_BUDGET_EXHAUSTED  # no side effect
    assert await policy.before_round(0) is None
    no_noise = PrivacyBudgetStopping(GaussianMechanism(0, 20, 4), epsilon=BUDGET, delta=DELTA)
    assert no_noise.rounds_within_budget() == 0


async def test_the_budget_counts_the_rounds_spent_before_the_run() -> None:
    expected = rounds_within(MECHANISM, BUDGET)
    policy = PrivacyBudgetStopping(MECHANISM, epsilon=BUDGET, delta=DELTA)
    policy.count_spent_before({MECHANISM: 2})
    assert policy.rounds_within_budget() == expected - 2
    assert await policy.before_round(expected - 2) is None
    assert await policy.before_round(expected - 1) is PRIVACY_BUDGET_EXHAUSTED
    noisier = GaussianMechanism(4.0, 20, 4)
    policy.count_spent_before({noisier: 5})  # replaces what was counted
    assert policy.spent(3) == composed_epsilon({noisier: 5, MECHANISM: 3}, DELTA)
    assert MECHANISM.epsilon(3, DELTA) < policy.spent(3) < MECHANISM.epsilon(8, DELTA)
    policy.count_spent_before({})
    assert policy.rounds_within_budget() == expected


async def test_rounds_of_another_adjacency_do_not_compose() -> None:
    uniform = GaussianMechanism(2.0, 20, 4, sampling="uniform")
    with pytest.raises(ValueError, match="add_or_remove_one and replace_one adjacency cannot"):
        composed_epsilon({MECHANISM: 1, uniform: 1}, DELTA)
    assert composed_epsilon({}, DELTA) == 0.0
    assert composed_epsilon({MECHANISM: 0, GaussianMechanism(0, 20, 4): 1}, DELTA) == math.inf


async def run(root: Any, models: MemoryReleaseManager, *, crash_on: int | None = None) -> Any:
    """Train a DP process up to 40 rounds under the aggregator's budget stop, the state in
    files under ``root`` (the privacy ledger beside it)."""
    process = dp_process(MECHANISM, delta=DELTA)
    async with FileProgramStateManager(root) as states:
        return await train(
            process,
            states if crash_on is None else CrashingStateManager(states, crash_on),
            rounds=40,
            models=models,
            stopping=process.model_aggregator.budget_stopping(BUDGET),
        )


@NEEDS_LEARNING
async def test_train_model_stops_before_the_round_that_would_exceed_the_budget(tmp_path) -> None:
    last = rounds_within(MECHANISM, BUDGET)
    models = MemoryReleaseManager()
    result = await run(tmp_path / "state", models)
    assert result.stop_reason == "privacy_budget_exhausted"
    assert result.stop_reason is PRIVACY_BUDGET_EXHAUSTED is StopReason("privacy_budget_exhausted")
    assert result.round_num == last and result.state["aggregator"]["rounds"] == last
    async with FileProgramStateManager(tmp_path / "state") as states:
        assert (await states.get_versions())[-1] == last
        assert (await states.load(last))["stop_reason"] == "privacy_budget_exhausted"
    assert list(models.values()) == [final_model_key(last)]
    assert direct_epsilon(MECHANISM, last, DELTA) <= BUDGET
    assert direct_epsilon(MECHANISM, last + 1, DELTA) > BUDGET


@NEEDS_LEARNING
@pytest.mark.parametrize("crash_on", [1, 3])
async def test_a_resumed_run_stops_at_the_same_round(tmp_path, crash_on: int) -> None:
    last = rounds_within(MECHANISM, BUDGET)
    assert crash_on < last
    with pytest.raises(SimulatedCrash):
        await run(tmp_path / "state", MemoryReleaseManager(), crash_on=crash_on)
    models = MemoryReleaseManager()
    result = await run(tmp_path / "state", models)
    assert result.resumed_from == crash_on - 1
    assert result.stop_reason is PRIVACY_BUDGET_EXHAUSTED and result.round_num == last
    assert result.state["aggregator"]["rounds"] == last  # each round ran once in the state
    assert list(models.values()) == [final_model_key(last)]
    again = await run(tmp_path / "state", MemoryReleaseManager())
    assert again.stop_reason is PRIVACY_BUDGET_EXHAUSTED and again.round_num == last


@NEEDS_LEARNING
async def test_a_budget_too_small_for_one_round_releases_the_initial_model(tmp_path) -> None:
    models = MemoryReleaseManager()
    process = dp_process(MECHANISM, delta=DELTA)
    result = await train(
        process,
        MemoryProgramStateManager(),
        rounds=5,
        models=models,
        stopping=process.model_aggregator.budget_stopping(0.5),
        privacy_ledger=tmp_path / "privacy_ledger.jsonl",
    )
    assert result.stop_reason is PRIVACY_BUDGET_EXHAUSTED and result.round_num == 0
    assert list(models.values()) == [final_model_key(0)]


async def test_the_policy_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="mechanism"):
        PrivacyBudgetStopping("rdp", epsilon=1.0, delta=1e-5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"epsilon.*0"):
        PrivacyBudgetStopping(MECHANISM, epsilon=0, delta=1e-5)
    with pytest.raises(ValueError, match=r"delta.*1"):
        PrivacyBudgetStopping(MECHANISM, epsilon=1.0, delta=1)
