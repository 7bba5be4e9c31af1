import datetime

import numpy as np
import pytest

from managers import MemoryProgramStateManager, VersionNotFoundError
from programlogic import LocalContext
from programlogic.testing import (
    CrashingStateManager,
    FakeClock,
    FakeDataSource,
    FakeLearningProcess,
    SimulatedCrash,
)

pytestmark = pytest.mark.anyio


async def test_fake_process_is_deterministic_and_depends_on_its_clients() -> None:
    source = FakeDataSource(6)
    process = FakeLearningProcess()
    async with LocalContext():
        state = await process.initialize()
        first = await process.next(state, source.iterator(0).select(2, 1))
        again = await process.next(state, source.iterator(0).select(2, 1))
        other = await process.next(state, source.iterator(0).select(2, 2))
    np.testing.assert_array_equal(first.state["weights"], again.state["weights"])
    assert first.metrics == again.metrics
    assert first.metrics != other.metrics
    assert first.state["rounds"] == 1 and state["rounds"] == 0
    assert set(first.metrics["client_work"]["train"]) == {"loss", "num_examples"}


async def test_fake_process_weights_round_trip() -> None:
    process = FakeLearningProcess(dim=3)
    state = await process.initialize()
    updated = await process.set_model_weights(state, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(await process.get_model_weights(updated), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(await process.get_model_weights(state), np.zeros(3))


async def test_fake_process_rejects_data_of_another_shape() -> None:
    source = FakeDataSource(2, dim=3)
    async with LocalContext():
        with pytest.raises(Exception, match=r"needs client data of shape \(n >= 1, 2\)"):
            process = FakeLearningProcess(dim=2)
            await process.next(await process.initialize(), source.iterator(0).select(1, 1))


async def test_fake_process_advances_its_clock() -> None:
    clock = FakeClock()
    start = clock.now()
    process = FakeLearningProcess(clock=clock, round_duration=datetime.timedelta(seconds=30))
    async with LocalContext():
        await process.next(await process.initialize(), FakeDataSource(2).iterator(0).select(1, 1))
    assert clock.now() - start == datetime.timedelta(seconds=30)
    with pytest.raises(ValueError, match="given together"):
        FakeLearningProcess(clock=clock)


async def test_fake_clock_moves_only_forward() -> None:
    clock = FakeClock(datetime.datetime(2030, 5, 1, tzinfo=datetime.UTC))
    clock.advance(datetime.timedelta(hours=1))
    assert clock.now() == datetime.datetime(2030, 5, 1, 1, tzinfo=datetime.UTC)
    clock.set(datetime.datetime(2030, 5, 2, tzinfo=datetime.UTC))
    assert clock.now().day == 2
    with pytest.raises(ValueError, match="delta must be a timedelta >= 0, got"):
        clock.advance(datetime.timedelta(seconds=-1))
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set(datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))
    with pytest.raises(ValueError, match="timezone-aware"):
        FakeClock(datetime.datetime(2030, 1, 1))


@pytest.mark.parametrize("after_save", [False, True])
async def test_crashing_state_manager_fails_once_at_its_version(after_save: bool) -> None:
    inner = MemoryProgramStateManager()
    crashing = CrashingStateManager(inner, 2, after_save=after_save)
    await crashing.save("zero", 0)
    await crashing.save("one", 1)
    with pytest.raises(SimulatedCrash, match="version 2"):
        await crashing.save("two", 2)
    assert await inner.get_versions() == ([0, 1, 2] if after_save else [0, 1])
    await crashing.save("three", 3)
    assert await crashing.load(3) == "three"
    assert await crashing.load_latest() == ("three", 3)
    await crashing.remove(3)
    with pytest.raises(VersionNotFoundError):
        await crashing.load(3)
    await crashing.remove_all()
    assert await crashing.get_versions() == []


async def test_crashing_state_manager_raises_the_given_error() -> None:
    error = OSError(28, "No space left on device")
    crashing = CrashingStateManager(MemoryProgramStateManager(), 0, error=error)
    with pytest.raises(OSError) as caught:
        await crashing.save({}, 0)
    assert caught.value is error
