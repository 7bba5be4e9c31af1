"""The privacy ledger: spent privacy survives losing the program state, one accounting for
the budget stop and the released epsilon, and what train_model refuses before round 1."""

from __future__ import annotations

import logging
import math
import shutil

import numpy as np
import orjson
import pytest

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
)
from programlogic import AnyOf, PrivacyLedgerError, PrivacySpentError
from programlogic.privacy import GaussianMechanism, PrivacyBudgetStopping, composed_epsilon
from programlogic.privacy_ledger import LedgerEntry, PrivacyLedger, ledger_path_beside
from programlogic.testing import CrashingStateManager, SimulatedCrash
from tests.programlogic.dp_helpers import (
    DELTA,
    MECHANISM,
    dp_process,
    released_epsilons,
    train,
    train_in,
)
from tests.programlogic.needs_learning import NEEDS_LEARNING

pytest.importorskip("dp_accounting")

pytestmark = [pytest.mark.anyio, NEEDS_LEARNING]

BUDGET = 2.0  # 12 rounds of MECHANISM


def ledger_lines(path) -> list[dict]:
    """The ledger's entries as a user reads the file: its lines after the header."""
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # every line ends with its newline
    assert orjson.loads(lines[0]) == {"programlogic_privacy_ledger": 1}
    return [orjson.loads(line) for line in lines[1:-1]]


# One accounting: the budget stop is the aggregator's.


async def test_a_budget_stop_of_another_mechanism_or_delta_is_refused_naming_both(
    tmp_path,
) -> None:
    metrics = MemoryReleaseManager()
    async with FileProgramStateManager(tmp_path / "state") as states:
        other_noise = PrivacyBudgetStopping(GaussianMechanism(1.0, 20, 4), epsilon=2.7, delta=DELTA)
        with pytest.raises(
            ValueError, match=r"noise_multiplier 1\.0 \(the aggregator's: 2\.0\).*budget_stopping"
        ):
            await train(dp_process(), states, rounds=5, metrics=metrics, stopping=other_noise)
        other_delta = PrivacyBudgetStopping(MECHANISM, epsilon=2.7, delta=1e-6)
        with pytest.raises(ValueError, match=r"delta 1e-06 \(the aggregator's: 1e-05\)"):
            await train(dp_process(), states, rounds=5, stopping=AnyOf(other_delta))
        assert await states.get_versions() == []
    assert metrics.values() == {}
    assert not ledger_path_beside(tmp_path / "state").exists()


async def test_a_budget_stop_is_refused_with_a_process_that_adds_no_noise() -> None:
    from programlogic.testing import FakeLearningProcess

    budget = PrivacyBudgetStopping(MECHANISM, epsilon=BUDGET, delta=DELTA)
    with pytest.raises(ValueError, match=r"accounts no privacy .*budget_stopping\(epsilon\)"):
        await train(FakeLearningProcess(), MemoryProgramStateManager(), rounds=3, stopping=budget)


async def test_the_aggregators_budget_stop_and_the_released_epsilon_are_one_accounting(
    tmp_path,
) -> None:
    process = dp_process()
    metrics = MemoryReleaseManager()
    stopping = process.model_aggregator.budget_stopping(BUDGET)
    result = await train_in(
        process,
        tmp_path / "state",
        rounds=40,
        metrics=metrics,
        stopping=stopping,
    )
    assert result.stop_reason == "privacy_budget_exhausted" and result.round_num == 12
    released = released_epsilons(metrics)
    assert released == {r: pytest.approx(MECHANISM.epsilon(r, DELTA)) for r in range(1, 13)}
    assert released[12] <= BUDGET < MECHANISM.epsilon(13, DELTA)
    entries = ledger_lines(tmp_path / "state.privacy_ledger.jsonl")
    assert [(entry["round"], entry["rounds"]) for entry in entries] == [
        (r, r) for r in range(1, 13)
    ]
    assert [entry["epsilon"] for entry in entries] == [released[r] for r in range(1, 13)]
    assert len({entry["secret"] for entry in entries}) == 1
    assert entries[0]["mechanism"] == {
        "noise_multiplier": 2.0,
        "num_clients": 20,
        "clients_per_round": 4,
        "sampling": "poisson",
        "accountant": "rdp",
    }
    assert process.privacy_accounting().budget_stopping(BUDGET).mechanism == MECHANISM


# Losing the program state does not give the budget back.


async def test_a_deleted_state_directory_is_refused_naming_the_epsilon_spent(tmp_path) -> None:
    state = tmp_path / "state"
    async with CSVFileReleaseManager(tmp_path / "metrics.csv") as metrics:
        await train_in(dp_process(), state, rounds=6, metrics=metrics)
    rows = (tmp_path / "metrics.csv").read_text()
    spent = MECHANISM.epsilon(6, DELTA)
    assert f"{spent!r}" in rows.splitlines()[-1]  # privacy/epsilon of round 6
    shutil.rmtree(state)
    async with CSVFileReleaseManager(tmp_path / "metrics.csv") as metrics:
        with pytest.raises(PrivacySpentError) as refused:
            await train_in(dp_process(), state, rounds=6, metrics=metrics)
    message = str(refused.value)
    assert f"records epsilon {spent:.6g} at delta 1e-05 spent over 6 DP rounds" in message
    assert f"pass privacy_spent_acknowledged={spent:.6g} to train_model" in message
    assert str(state) + ".privacy_ledger.jsonl" in message
    assert refused.value.epsilon == pytest.approx(spent) and refused.value.rounds == 6
    assert (tmp_path / "metrics.csv").read_text() == rows  # the rows that recorded it stay
    async with FileProgramStateManager(state) as states:
        assert await states.get_versions() == []  # refused before round 0 was saved
    assert len(ledger_lines(tmp_path / "state.privacy_ledger.jsonl")) == 6


async def test_an_acknowledgement_starts_over_and_the_budget_counts_the_total(tmp_path) -> None:
    state = tmp_path / "state"
    await train_in(dp_process(), state, rounds=6)
    shutil.rmtree(state)
    spent = MECHANISM.epsilon(6, DELTA)
    with pytest.raises(PrivacySpentError, match=r"privacy_spent_acknowledged=1\.2 does not match"):
        await train_in(dp_process(), state, rounds=40, privacy_spent_acknowledged=1.2)
    process = dp_process()
    metrics = MemoryReleaseManager()
    result = await train_in(
        process,
        state,
        rounds=40,
        metrics=metrics,
        stopping=process.model_aggregator.budget_stopping(BUDGET),
        privacy_spent_acknowledged=round(spent, 4),
    )
    # 6 rounds spent before, 6 more within the budget of 12: the budget counts the total.
    assert result.stop_reason == "privacy_budget_exhausted" and result.round_num == 6
    assert int(result.state["aggregator"]["rounds"]) == 6
    released = released_epsilons(metrics)
    assert released == {r: pytest.approx(MECHANISM.epsilon(6 + r, DELTA)) for r in range(1, 7)}
    entries = ledger_lines(tmp_path / "state.privacy_ledger.jsonl")
    first, second = entries[0]["secret"], entries[-1]["secret"]
    assert first != second  # a new secret adds to the total
    assert [(entry["secret"], entry["round"]) for entry in entries] == [
        *((first, r) for r in range(1, 7)),
        *((second, r) for r in range(1, 7)),
    ]
    assert entries[-1]["epsilon"] == released[6]
    # The acknowledged run resumes without being told again, still counting the total.
    again = await train_in(
        dp_process(),
        state,
        rounds=40,
        stopping=process.model_aggregator.budget_stopping(BUDGET),
    )
    assert again.round_num == 6 and again.resumed_from == 6


async def test_every_version_damaged_with_start_fresh_is_refused(tmp_path) -> None:
    state = tmp_path / "state"
    await train_in(dp_process(), state, rounds=3)
    for version in state.glob("program_state_*.plstate"):
        version.write_bytes(b"damaged")
    with pytest.raises(PrivacySpentError, match=r"holds no checkpoint to resume.*over 3 DP rounds"):
        await train_in(dp_process(), state, on_all_damaged="start_fresh", rounds=3)


@pytest.mark.parametrize("edited", [0, 2])
async def test_a_checkpoint_whose_aggregator_count_was_edited_is_refused(
    tmp_path, edited: int
) -> None:
    state = tmp_path / "state"
    await train_in(dp_process(), state, rounds=5)
    async with FileProgramStateManager(state) as states:
        saved, version = await states.load_latest()
        saved["train_state"]["aggregator"]["rounds"] = np.int64(edited)
        await states.remove(version)
        await states.save(saved, version)  # through the manager: its checksum is valid
    metrics = MemoryReleaseManager()
    with pytest.raises(PrivacySpentError) as refused:
        await train_in(dp_process(), state, rounds=19, metrics=metrics)
    assert (
        f"program state of round 5: its DP aggregator has counted {edited} rounds, but the "
        "privacy ledger"
    ) in str(refused.value)
    assert "records 5 rounds of this run's noise secret, up to round 5" in str(refused.value)
    assert f"epsilon {MECHANISM.epsilon(5, DELTA):.6g} at delta 1e-05" in str(refused.value)
    assert metrics.values() == {}


# Replays, new secrets, composition.


async def test_rounds_replayed_after_a_crash_are_counted_once(tmp_path) -> None:
    reference = MemoryReleaseManager()
    await train(
        dp_process(secret=7),
        MemoryProgramStateManager(),
        rounds=6,
        metrics=reference,
        privacy_ledger=tmp_path / "reference.jsonl",
    )
    state = tmp_path / "state"
    async with FileProgramStateManager(state) as states:
        with pytest.raises(SimulatedCrash):  # rounds 4 to 6 trained, the save of 6 lost
            await train(
                dp_process(secret=7), CrashingStateManager(states, 6), rounds=6, checkpoint_every=3
            )
    ledger = tmp_path / "state.privacy_ledger.jsonl"
    assert [entry["round"] for entry in ledger_lines(ledger)] == [1, 2, 3, 4, 5, 6]
    metrics = MemoryReleaseManager()
    result = await train_in(
        dp_process(secret=7),
        state,
        rounds=6,
        metrics=metrics,
        checkpoint_every=3,
    )
    assert result.resumed_from == 3 and int(result.state["aggregator"]["rounds"]) == 6
    assert [entry["round"] for entry in ledger_lines(ledger)] == [1, 2, 3, 4, 5, 6]
    assert released_epsilons(metrics) == {
        r: released_epsilons(reference)[r] for r in released_epsilons(metrics)
    }

    def accounted(path):
        return [(e.secret, e.round_num, e.rounds, e.epsilon) for e in PrivacyLedger.read(path)]

    assert accounted(ledger) == accounted(tmp_path / "reference.jsonl")


async def test_a_new_secret_adds_to_the_total_composed_with_its_own_mechanism(tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    await train(dp_process(secret=1), MemoryProgramStateManager(), rounds=3, privacy_ledger=path)
    noisier = GaussianMechanism(4.0, 20, 4)
    with pytest.raises(PrivacySpentError, match="over 3 DP rounds"):
        await train(
            dp_process(noisier, secret=2),
            MemoryProgramStateManager(),
            rounds=4,
            privacy_ledger=path,
        )
    metrics = MemoryReleaseManager()
    await train(
        dp_process(noisier, secret=2),
        MemoryProgramStateManager(),
        rounds=4,
        metrics=metrics,
        privacy_ledger=path,
        privacy_spent_acknowledged=MECHANISM.epsilon(3, DELTA),
    )
    expected = {r: composed_epsilon({MECHANISM: 3, noisier: r}, DELTA) for r in range(1, 5)}
    assert released_epsilons(metrics) == pytest.approx(expected)
    assert MECHANISM.epsilon(3, DELTA) < expected[1] < MECHANISM.epsilon(4, DELTA)
    entries = PrivacyLedger.read(path)
    assert [(entry.mechanism, entry.round_num) for entry in entries] == [
        *((MECHANISM, r) for r in range(1, 4)),
        *((noisier, r) for r in range(1, 5)),
    ]
    assert entries[-1].epsilon == pytest.approx(expected[4])


# The ledger file: where it lives, torn lines, damage.


async def test_a_dp_run_with_memory_state_and_no_path_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"MemoryProgramStateManager.*give train_model privacy_"):
        await train(dp_process(), MemoryProgramStateManager(), rounds=2)
    inside = tmp_path / "state" / "ledger.jsonl"
    with pytest.raises(ValueError, match=r"privacy_ledger=.* is inside the program state's"):
        await train_in(
            dp_process(),
            tmp_path / "state",
            rounds=2,
            privacy_ledger=inside,
        )
    from programlogic.testing import FakeLearningProcess

    with pytest.raises(ValueError, match=r"privacy_ledger=.* but train_process .* no privacy"):
        await train(
            FakeLearningProcess(),
            MemoryProgramStateManager(),
            rounds=2,
            privacy_ledger=tmp_path / "ledger.jsonl",
        )


async def test_a_torn_last_line_is_ignored_and_cut_off(tmp_path, caplog) -> None:
    state = tmp_path / "state"
    await train_in(dp_process(), state, rounds=3)
    ledger = tmp_path / "state.privacy_ledger.jsonl"
    with ledger.open("ab") as file:
        file.write(b'{"secret": "0123", "rou')  # a crash in the middle of an append
    assert [entry.round_num for entry in PrivacyLedger.read(ledger)] == [1, 2, 3]
    caplog.set_level(logging.WARNING)
    await train_in(dp_process(), state, rounds=5)
    assert [entry["round"] for entry in ledger_lines(ledger)] == [1, 2, 3, 4, 5]
    assert f"the privacy ledger {ledger} ends with a torn line" in caplog.text


async def test_other_damage_is_refused_naming_the_file_and_the_line(tmp_path) -> None:
    state = tmp_path / "state"
    await train_in(dp_process(), state, rounds=3)
    ledger = tmp_path / "state.privacy_ledger.jsonl"
    lines = ledger.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"round":1', b'"round":"one"')
    ledger.write_bytes(b"\n".join(lines))
    with pytest.raises(PrivacyLedgerError, match=rf"{ledger} is damaged at line 2: round must"):
        await train_in(dp_process(), state, rounds=5)
    ledger.write_bytes(b'{"something": "else"}\n')
    with pytest.raises(PrivacyLedgerError, match=r"line 1: not a privacy ledger's first line"):
        PrivacyLedger.read(ledger)


async def test_one_run_at_a_time_writes_a_ledger(tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    async with PrivacyLedger(path) as held:
        with pytest.raises(PrivacyLedgerError, match=r"ledger.jsonl is in use by another run"):
            await train(dp_process(), MemoryProgramStateManager(), rounds=2, privacy_ledger=path)
        assert held.entries == ()
    await train(dp_process(), MemoryProgramStateManager(), rounds=2, privacy_ledger=path)
    assert len(PrivacyLedger.read(path)) == 2


async def test_a_checkpoint_older_than_its_ledger_is_recorded_from_the_checkpoint(
    tmp_path, caplog
) -> None:
    state = tmp_path / "state"
    await train_in(dp_process(), state, rounds=3)
    ledger = tmp_path / "state.privacy_ledger.jsonl"
    ledger.unlink()  # as a run begun before ledgers existed
    caplog.set_level(logging.WARNING)
    await train_in(dp_process(), state, rounds=5)
    assert "lacked 3 of the 3 rounds the checkpoint of round 3 holds" in caplog.text
    entries = ledger_lines(ledger)
    assert [(entry["round"], entry["epsilon"] is None) for entry in entries] == [
        (1, True),
        (2, True),
        (3, True),
        (4, False),
        (5, False),
    ]


async def test_an_entry_is_appended_once_per_secret_and_round_and_fsynced_whole(tmp_path) -> None:
    path = tmp_path / "deep" / "ledger.jsonl"
    entry = LedgerEntry("ab" * 16, 1, 1, MECHANISM, DELTA, math.inf, 0)
    async with PrivacyLedger(path) as ledger:
        assert await ledger.record(entry, entry) == 1
        assert await ledger.record(LedgerEntry("cd" * 16, 1, 1, MECHANISM, DELTA, None)) == 1
        assert ledger.rounds_by_mechanism() == {MECHANISM: 2}
        assert ledger.rounds_by_mechanism(excluding_secret="ab" * 16) == {MECHANISM: 1}
    assert ledger_lines(path)[0]["epsilon"] == "inf"
    assert PrivacyLedger.read(path)[0] == entry
    with pytest.raises(RuntimeError, match="not open"):
        PrivacyLedger(path).append(entry)
