"""FakeValueReference: the value-reference fake that tests share."""

from __future__ import annotations

import anyio
import pytest

from managers import ValueReference, materialize
from managers.testing import FakeValueReference

pytestmark = pytest.mark.anyio


async def test_gives_its_value_and_counts_calls():
    reference = FakeValueReference({"loss": 0.5})
    assert isinstance(reference, ValueReference)
    assert await reference.get_value() == {"loss": 0.5}
    assert await materialize([reference, reference]) == [{"loss": 0.5}, {"loss": 0.5}]
    assert reference.calls == 3


async def test_raises_its_error():
    reference = FakeValueReference(error=OSError("no value"))
    with pytest.raises(OSError, match="no value"):
        await reference.get_value()
    assert reference.calls == 1


async def test_resolves_once_its_gate_is_set():
    reference = FakeValueReference("done", gate=anyio.Event())
    results: list[str] = []

    async def resolve() -> None:
        results.append(await reference.get_value())

    async with anyio.create_task_group() as group:
        group.start_soon(resolve)
        await anyio.wait_all_tasks_blocked()
        assert results == []
        reference.gate.set()
    assert results == ["done"]


async def test_a_shorter_delay_resolves_first():
    order: list[str] = []

    async def resolve(reference: FakeValueReference) -> None:
        order.append(await reference.get_value())

    async with anyio.create_task_group() as group:
        group.start_soon(resolve, FakeValueReference("slow", delay=5))
        group.start_soon(resolve, FakeValueReference("fast", delay=1))
    assert order == ["fast", "slow"]


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"delay": -1}, ValueError, r"^delay must be an int >= 0, got -1$"),
        ({"delay": 1.5}, TypeError, r"^delay must be an int >= 0, got float 1\.5$"),
        ({"error": "boom"}, TypeError, r"^error must be a BaseException or None, got str 'boom'$"),
        ({"gate": True}, TypeError, r"^gate must be an Event or None, got bool True$"),
    ],
)
async def test_invalid_arguments_raise_naming_them(arguments, error, message):
    with pytest.raises(error, match=message):
        FakeValueReference(1, **arguments)
