"""DelayedReleaseManager beyond the shared contract: which releases pass."""

from __future__ import annotations

import pytest

from managers import MemoryReleaseManager
from managers.release.delayed import DelayedReleaseManager
from managers.testing import FakeValueReference

pytestmark = pytest.mark.anyio


async def test_keys_from_the_delay_on_pass():
    memory = MemoryReleaseManager()
    manager = DelayedReleaseManager(memory, 3)
    for key in (0, 4, 1, 2, 3, 5, 2):
        await manager.release(f"v{key}", key)
    assert memory.values() == {4: "v4", 3: "v3", 5: "v5"}


async def test_zero_delay_passes_keys_from_zero():
    memory = MemoryReleaseManager()
    manager = DelayedReleaseManager(memory, 0)
    for key in (-1, 0, 1):
        await manager.release(f"v{key}", key)
    assert memory.values() == {0: "v0", 1: "v1"}


async def test_str_keys_always_pass():
    memory = MemoryReleaseManager()
    await DelayedReleaseManager(memory, 1000).release("model", "final")
    assert memory.values() == {"final": "model"}


async def test_dropped_release_is_not_materialized():
    memory = MemoryReleaseManager()
    reference = FakeValueReference(0.5)
    await DelayedReleaseManager(memory, 2).release({"loss": reference}, 1)
    assert memory.values() == {}
    assert reference.calls == 0


async def test_invalid_key_raises_even_when_it_would_be_dropped():
    manager = DelayedReleaseManager(MemoryReleaseManager(), 5)
    with pytest.raises(TypeError, match="release key must be an int or a str, got float"):
        await manager.release(1, 1.0)


@pytest.mark.parametrize(
    ("delay", "error", "message"),
    [
        (-1, ValueError, r"delay must be an int >= 0, got -1$"),
        (True, TypeError, r"delay must be an int >= 0, got bool True$"),
        (2.0, TypeError, r"delay must be an int >= 0, got float 2.0$"),
        (None, TypeError, r"delay must be an int >= 0, got NoneType None$"),
    ],
)
async def test_invalid_delay(delay, error, message):
    with pytest.raises(error, match=message):
        DelayedReleaseManager(MemoryReleaseManager(), delay)


async def test_invalid_manager():
    with pytest.raises(TypeError, match=r"manager must be a ReleaseManager, got list \[\]"):
        DelayedReleaseManager([], 1)


async def test_aclose_closes_the_inner_manager():
    class Closing(MemoryReleaseManager):
        closed = False

        async def aclose(self) -> None:
            self.closed = True

    inner = Closing()
    async with DelayedReleaseManager(inner, 1) as manager:
        assert manager.manager is inner
    assert inner.closed
