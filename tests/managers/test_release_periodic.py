"""PeriodicReleaseManager beyond the shared contract: which releases pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from managers.clock import SystemClock
from managers.release.periodic import PeriodicReleaseManager
from managers.testing import FakeValueReference

pytestmark = pytest.mark.anyio

START = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.time = START

    def now(self) -> datetime:
        return self.time

    def advance(self, **delta: float) -> None:
        self.time += timedelta(**delta)


async def test_int_periodicity_passes_every_nth_key():
    memory = MemoryReleaseManager()
    manager = PeriodicReleaseManager(memory, 3)
    for key in range(11):
        await manager.release(f"v{key}", key)
    assert memory.values() == {0: "v0", 3: "v3", 6: "v6", 9: "v9"}


async def test_int_cadence_survives_a_restart_and_keys_out_of_order():
    memory = MemoryReleaseManager()
    await PeriodicReleaseManager(memory, 5).release("first run", 5)
    restarted = PeriodicReleaseManager(memory, 5)
    for key in (7, 10, 5, 3, 15, 10):
        await restarted.release(f"after restart {key}", key)
    assert memory.values() == {5: "after restart 5", 10: "after restart 10", 15: "after restart 15"}


async def test_str_keys_always_pass():
    memory = MemoryReleaseManager()
    manager = PeriodicReleaseManager(memory, 100)
    await manager.release("model", "final_training_checkpoint_round_7")
    assert memory.values() == {"final_training_checkpoint_round_7": "model"}


async def test_dropped_release_is_not_materialized():
    memory = MemoryReleaseManager()
    reference = FakeValueReference(0.5)
    await PeriodicReleaseManager(memory, 2).release({"loss": reference}, 1)
    assert memory.values() == {}
    assert reference.calls == 0


async def test_timedelta_periodicity_follows_the_clock():
    memory, clock = MemoryReleaseManager(), FakeClock()
    manager = PeriodicReleaseManager(memory, timedelta(minutes=5), clock=clock)
    await manager.release("r1", 1)  # the first always passes
    clock.advance(minutes=2)
    await manager.release("r2", 2)
    clock.advance(minutes=2, seconds=59)
    await manager.release("r3", 3)  # 4:59 after round 1
    clock.advance(seconds=1)
    await manager.release("r4", 4)  # 5:00 after round 1
    clock.advance(minutes=4)
    await manager.release("r5", 5)
    clock.advance(minutes=10)
    await manager.release("r6", 6)
    assert memory.values() == {1: "r1", 4: "r4", 6: "r6"}


async def test_timedelta_re_release_of_the_last_key_passed_replaces_it():
    memory, clock = MemoryReleaseManager(), FakeClock()
    manager = PeriodicReleaseManager(memory, timedelta(minutes=5), clock=clock)
    await manager.release("first", 1)
    clock.advance(minutes=1)
    await manager.release("again", 1)
    await manager.release("dropped", 2)
    clock.advance(minutes=4)
    await manager.release("passes", 3)  # the re-release did not restart the interval
    assert memory.values() == {1: "again", 3: "passes"}


async def test_timedelta_str_keys_pass_and_leave_the_interval_alone():
    memory, clock = MemoryReleaseManager(), FakeClock()
    manager = PeriodicReleaseManager(memory, timedelta(minutes=5), clock=clock)
    await manager.release("r1", 1)
    clock.advance(minutes=4)
    await manager.release("model", "final")
    clock.advance(minutes=1)
    await manager.release("r2", 2)
    assert memory.values() == {1: "r1", "final": "model", 2: "r2"}


async def test_timedelta_clock_that_went_backwards_lets_a_release_pass():
    memory, clock = MemoryReleaseManager(), FakeClock()
    manager = PeriodicReleaseManager(memory, timedelta(minutes=5), clock=clock)
    await manager.release("r1", 1)
    clock.advance(hours=-1)
    await manager.release("r2", 2)
    clock.advance(minutes=1)
    await manager.release("r3", 3)  # the interval restarted at round 2
    assert memory.values() == {1: "r1", 2: "r2"}


async def test_default_clock_is_the_utc_wall_clock():
    before = datetime.now(UTC)
    now = SystemClock().now()
    assert now.tzinfo is UTC
    assert before <= now <= datetime.now(UTC)
    memory = MemoryReleaseManager()
    manager = PeriodicReleaseManager(memory, timedelta(hours=1))
    await manager.release("r1", 1)
    await manager.release("r2", 2)
    assert memory.values() == {1: "r1"}


async def test_invalid_key_raises_even_when_it_would_be_dropped():
    manager = PeriodicReleaseManager(MemoryReleaseManager(), 2)
    with pytest.raises(TypeError, match="release key must be an int or a str, got bool"):
        await manager.release(1, True)


@pytest.mark.parametrize(
    ("periodicity", "error", "found"),
    [
        (0, ValueError, r"0"),
        (-3, ValueError, r"-3"),
        (timedelta(0), ValueError, r"datetime.timedelta\(0\)"),
        (timedelta(seconds=-1), ValueError, r"datetime.timedelta\(days=-1, seconds=86399\)"),
        (True, TypeError, r"bool True"),
        (1.5, TypeError, r"float 1.5"),
        ("5", TypeError, r"str '5'"),
    ],
)
async def test_invalid_periodicity(periodicity, error, found):
    expected = rf"^periodicity must be a positive int or a positive timedelta, got {found}$"
    with pytest.raises(error, match=expected):
        PeriodicReleaseManager(MemoryReleaseManager(), periodicity)


async def test_invalid_manager_and_clock():
    with pytest.raises(TypeError, match=r"manager must be a ReleaseManager, got NoneType None"):
        PeriodicReleaseManager(None, 1)
    message = r"clock must be a Clock \(with now\(\)\) or None, got function"
    with pytest.raises(TypeError, match=message):
        PeriodicReleaseManager(MemoryReleaseManager(), timedelta(1), clock=lambda: START)


async def test_aclose_closes_the_inner_manager():
    class Closing(MemoryReleaseManager):
        closed = False

        async def aclose(self) -> None:
            self.closed = True

    inner = Closing()
    async with PeriodicReleaseManager(inner, 1) as manager:
        assert manager.manager is inner
    assert inner.closed


async def test_timedelta_cadence_survives_a_restart_with_a_state_manager(tmp_path):
    clock, memory = FakeClock(), MemoryReleaseManager()
    async with FileProgramStateManager(tmp_path, keep_total=1) as state:
        first = PeriodicReleaseManager(
            memory, timedelta(minutes=10), clock=clock, state_manager=state
        )
        await first.release("r1", 1)
        clock.advance(minutes=4)
        await first.release("r2", 2)
    clock.advance(minutes=4)  # the program restarts 8 minutes after round 1 passed
    async with FileProgramStateManager(tmp_path, keep_total=1) as state:
        restarted = PeriodicReleaseManager(
            memory, timedelta(minutes=10), clock=clock, state_manager=state
        )
        await restarted.release("r1 again", 1)  # the resumed round that passed last
        await restarted.release("r3", 3)
        clock.advance(minutes=2)
        await restarted.release("r4", 4)
        clock.advance(minutes=1)
        await restarted.release("r5", 5)
    assert memory.values() == {1: "r1 again", 4: "r4"}


async def test_timedelta_cadence_without_a_state_manager_starts_afresh():
    clock, memory = FakeClock(), MemoryReleaseManager()
    await PeriodicReleaseManager(memory, timedelta(minutes=10), clock=clock).release("r1", 1)
    clock.advance(minutes=1)
    restarted = PeriodicReleaseManager(memory, timedelta(minutes=10), clock=clock)
    await restarted.release("r2", 2)
    assert memory.values() == {1: "r1", 2: "r2"}


async def test_a_state_manager_needs_a_timedelta_periodicity():
    state = MemoryProgramStateManager()
    with pytest.raises(ValueError, match=r"applies to a timedelta .* got periodicity 5$"):
        PeriodicReleaseManager(MemoryReleaseManager(), 5, state_manager=state)
    with pytest.raises(TypeError, match=r"state_manager must be a ProgramStateManager or None"):
        PeriodicReleaseManager(MemoryReleaseManager(), timedelta(1), state_manager="state")


async def test_a_release_that_failed_after_its_time_was_saved_passes_again_after_a_restart():
    class Failing(MemoryReleaseManager):
        async def release(self, value: Any, key: Any) -> None:
            raise OSError("disk full")

    clock, state = FakeClock(), MemoryProgramStateManager()
    first = PeriodicReleaseManager(
        Failing(), timedelta(minutes=10), clock=clock, state_manager=state
    )
    with pytest.raises(OSError, match="disk full"):
        await first.release("r1", 1)
    clock.advance(minutes=1)
    memory = MemoryReleaseManager()
    restarted = PeriodicReleaseManager(
        memory, timedelta(minutes=10), clock=clock, state_manager=state
    )
    await restarted.release("r1 replayed", 1)
    await restarted.release("r2", 2)
    assert memory.values() == {1: "r1 replayed"}
