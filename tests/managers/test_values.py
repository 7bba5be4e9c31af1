"""managers.values: value references and their concurrent materialization."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any, NamedTuple

import anyio
import numpy as np
import pytest

from managers import ValueReference, materialize
from managers.structure import leaves
from managers.testing import FakeValueReference
from managers.values import is_value_reference

pytestmark = pytest.mark.anyio


class Point(NamedTuple):
    x: Any
    y: Any


@dataclasses.dataclass
class Metrics:
    loss: Any
    accuracy: Any


async def test_value_reference_protocol_isinstance():
    assert isinstance(FakeValueReference(1), ValueReference)
    assert not isinstance(1, ValueReference)
    assert not isinstance({"get_value": 1}, ValueReference)


async def test_is_value_reference():
    assert is_value_reference(FakeValueReference(1))
    assert not is_value_reference(0.5)

    class NotCallable:
        get_value = 3

    assert not is_value_reference(NotCallable())


async def test_materialize_without_references_returns_same_object():
    structure = {"loss": 0.5, "weights": [np.ones(2), (1, 2)], "m": Metrics(0.1, 0.9)}
    assert await materialize(structure) is structure


async def test_materialize_leaf_without_reference_returns_it():
    array = np.zeros(3)
    assert await materialize(array) is array


async def test_materialize_root_reference():
    assert await materialize(FakeValueReference(42)) == 42


async def test_materialize_resolves_every_reference():
    references = [FakeValueReference(i) for i in range(5)]
    structure = {"round": 3, "values": references, "nested": {"loss": FakeValueReference(0.25)}}
    result = await materialize(structure)
    assert result == {"round": 3, "values": [0, 1, 2, 3, 4], "nested": {"loss": 0.25}}
    assert all(reference.calls == 1 for reference in references)
    # The input is not modified in place.
    assert structure["values"] is references
    assert structure["nested"]["loss"].value == 0.25


async def test_materialize_preserves_container_types_and_order():
    structure = {
        "b": Point(FakeValueReference(1), 2),
        "a": Metrics(loss=FakeValueReference(0.5), accuracy=0.75),
        "t": (FakeValueReference("x"), [FakeValueReference("y")]),
    }
    result = await materialize(structure)
    assert list(result) == ["b", "a", "t"]
    assert type(result["b"]) is Point
    assert result["b"] == Point(1, 2)
    assert type(result["a"]) is Metrics
    assert result["a"] == Metrics(loss=0.5, accuracy=0.75)
    assert type(result["t"]) is tuple
    assert result["t"] == ("x", ["y"])


@pytest.mark.parametrize(
    "structure",
    [
        Point(FakeValueReference(1), 2),
        Metrics(loss=FakeValueReference(0.5), accuracy=0.75),
        {"nested": [(Metrics(loss=0.1, accuracy=FakeValueReference(0.2)),)]},
        OrderedDict([("x", FakeValueReference("value"))]),
        {"p": Point(1, Point(2, FakeValueReference(3)))},
    ],
    ids=["namedtuple", "dataclass", "nested-dataclass", "ordered-dict", "nested-namedtuple"],
)
async def test_materialize_finds_references_only_inside_typed_containers(structure):
    result = await materialize(structure)
    assert result is not structure
    assert type(result) is type(structure)
    assert not any(isinstance(leaf, FakeValueReference) for leaf in leaves(result))


async def test_materialize_typed_containers_values():
    assert await materialize(Point(FakeValueReference(1), 2)) == Point(1, 2)
    assert await materialize(OrderedDict([("x", FakeValueReference("v"))])) == OrderedDict(
        [("x", "v")]
    )
    assert await materialize({"p": Point(1, Point(2, FakeValueReference(3)))}) == {
        "p": Point(1, Point(2, 3))
    }


async def test_materialize_reference_to_numpy_array():
    array = np.arange(4)
    result = await materialize({"w": FakeValueReference(array), "n": 1})
    assert result["w"] is array
    assert result["n"] == 1


async def test_materialize_awaits_references_concurrently():
    first_ran = anyio.Event()
    second_ran = anyio.Event()

    class WaitsForOther:
        def __init__(self, mine: anyio.Event, other: anyio.Event, value: str) -> None:
            self.mine = mine
            self.other = other
            self.value = value

        async def get_value(self) -> str:
            self.mine.set()
            await self.other.wait()
            return self.value

    structure = [
        WaitsForOther(first_ran, second_ran, "a"),
        WaitsForOther(second_ran, first_ran, "b"),
    ]
    with anyio.fail_after(5):  # a hang guard: a sequential materialize would wait forever
        assert await materialize(structure) == ["a", "b"]


async def test_single_failing_reference_raises_its_exception():
    with pytest.raises(KeyError, match="missing"):
        await materialize({"a": FakeValueReference(error=KeyError("missing")), "b": 1})


async def test_one_of_several_failing_references_raises_unwrapped():
    blocked = FakeValueReference(None)
    forever = FakeValueReference(gate=anyio.Event())  # its gate is never set
    error = ValueError("boom")
    # fail_after is a hang guard: the failure must cancel forever, else this would hang.
    with anyio.fail_after(5), pytest.raises(ValueError, match="boom") as info:
        await materialize({"ok": blocked, "bad": FakeValueReference(error=error), "slow": forever})
    assert info.value is error
    assert not isinstance(info.value, BaseExceptionGroup)


async def test_two_failing_references_raise_exception_group():
    arrived = 0
    gate = anyio.Event()

    class FailsTogether:
        def __init__(self, error: Exception) -> None:
            self.error = error

        async def get_value(self) -> Any:
            nonlocal arrived
            arrived += 1
            if arrived == 2:
                gate.set()
            # Shielded so that the first failure cannot cancel the second one; the
            # shield has its own timeout so that a sequential materialize cannot hang.
            with anyio.move_on_after(5, shield=True):
                await gate.wait()
            raise self.error

    first = ValueError("first")
    second = KeyError("second")
    with anyio.fail_after(5), pytest.raises(ExceptionGroup) as info:  # a hang guard
        await materialize([FailsTogether(first), FailsTogether(second)])
    assert {id(error) for error in info.value.exceptions} == {id(first), id(second)}
    assert len(info.value.exceptions) == 2
