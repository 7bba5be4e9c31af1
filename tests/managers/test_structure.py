"""managers.structure: flatten with paths, unflatten, map over leaves."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import pytest

from managers.structure import (
    PATH_SEPARATOR,
    flatten,
    is_container,
    join_path,
    leaves,
    map_children,
    map_structure,
    map_with_paths,
    unflatten,
)

pytestmark = pytest.mark.anyio


class Point(NamedTuple):
    x: float
    y: float


@dataclasses.dataclass
class Optimizer:
    lr: float
    momentum: float


@dataclasses.dataclass(frozen=True)
class FrozenState:
    weights: list
    step: int


@dataclasses.dataclass
class WithDerived:
    a: int
    b: int
    total: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.total = self.a + self.b


@dataclasses.dataclass(frozen=True)
class FrozenWithDerived:
    a: int
    doubled: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "doubled", 2 * self.a)


class Pair(tuple):
    """A tuple subclass that is not a NamedTuple."""


async def test_path_separator_is_slash():
    assert PATH_SEPARATOR == "/"
    assert join_path("", "a") == "a"
    assert join_path("a/b", "c") == "a/b/c"


async def test_flatten_nested_dicts_and_lists():
    structure = {"train": {"loss": 0.5, "num_examples": 10}, "weights": [1, 2]}
    assert flatten(structure) == [
        ("train/loss", 0.5),
        ("train/num_examples", 10),
        ("weights/0", 1),
        ("weights/1", 2),
    ]


async def test_flatten_deeply_nested_mixed_containers():
    structure = {"a": [{"b": (1, [2, 3])}, 4], "c": {"d": {"e": 5}}}
    assert flatten(structure) == [
        ("a/0/b/0", 1),
        ("a/0/b/1/0", 2),
        ("a/0/b/1/1", 3),
        ("a/1", 4),
        ("c/d/e", 5),
    ]


async def test_flatten_tuple_uses_positions():
    assert flatten((10, (20, 30))) == [("0", 10), ("1/0", 20), ("1/1", 30)]


async def test_flatten_namedtuple_uses_field_names():
    assert flatten({"p": Point(1.0, 2.0)}) == [("p/x", 1.0), ("p/y", 2.0)]


async def test_flatten_dataclass_uses_field_names_in_declaration_order():
    assert flatten({"opt": Optimizer(lr=0.1, momentum=0.9)}) == [
        ("opt/lr", 0.1),
        ("opt/momentum", 0.9),
    ]


async def test_flatten_frozen_dataclass():
    assert flatten(FrozenState(weights=[1, 2], step=7)) == [
        ("weights/0", 1),
        ("weights/1", 2),
        ("step", 7),
    ]


async def test_flatten_dataclass_includes_init_false_field():
    assert flatten(WithDerived(a=1, b=2)) == [("a", 1), ("b", 2), ("total", 3)]


async def test_flatten_dataclass_class_itself_is_a_leaf():
    assert not is_container(Optimizer)
    assert flatten({"cls": Optimizer}) == [("cls", Optimizer)]


async def test_flatten_keeps_dict_insertion_order_never_sorted():
    structure = {"b": 1, "a": {"z": 2, "y": 3}, "c": 4}
    assert [path for path, _ in flatten(structure)] == ["b", "a/z", "a/y", "c"]
    assert leaves(structure) == [1, 2, 3, 4]


async def test_flatten_leaf_at_root_has_empty_path():
    assert flatten(5) == [("", 5)]
    assert flatten(None) == [("", None)]
    assert flatten("text") == [("", "text")]


@pytest.mark.parametrize("empty", [{}, [], ()], ids=["dict", "list", "tuple"])
async def test_flatten_empty_container_has_no_leaves(empty):
    assert flatten(empty) == []
    assert flatten({"x": empty, "y": 1}) == [("y", 1)]


async def test_flatten_str_and_bytes_are_leaves():
    assert flatten({"s": "abc", "b": b"xy"}) == [("s", "abc"), ("b", b"xy")]


async def test_flatten_non_str_key_at_root_raises_type_error():
    with pytest.raises(TypeError, match=r"found int key 1 at the root"):
        flatten({1: "a"})


async def test_flatten_non_str_key_names_the_path():
    with pytest.raises(TypeError, match=r"found int key 3 at 'outer/0/inner'"):
        flatten({"outer": [{"inner": {3: "x"}}]})


async def test_flatten_tuple_key_names_type():
    with pytest.raises(TypeError, match=r"must be str; found tuple key \(1, 2\)"):
        flatten({"a": {(1, 2): 0}})


async def test_numpy_arrays_are_leaves():
    array = np.arange(6).reshape(2, 3)
    flat = flatten({"w": array, "s": np.float32(1.5)})
    assert [path for path, _ in flat] == ["w", "s"]
    assert flat[0][1] is array
    assert not is_container(array)


async def test_is_container():
    assert is_container({})
    assert is_container([])
    assert is_container(())
    assert is_container(Point(1, 2))
    assert is_container(Optimizer(0.1, 0.9))
    assert not is_container(1)
    assert not is_container("abc")
    assert not is_container(None)


def _assert_same_types(expected, actual):
    """Recursively check that ``actual`` has exactly the container types of ``expected``."""
    assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            _assert_same_types(expected[key], actual[key])
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected)
        for left, right in zip(expected, actual, strict=True):
            _assert_same_types(left, right)
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            _assert_same_types(getattr(expected, field.name), getattr(actual, field.name))


async def test_unflatten_round_trip_restores_exact_container_types():
    template = {
        "b": [1, (2, 3)],
        "a": Point(4.0, 5.0),
        "opt": Optimizer(lr=0.1, momentum=0.9),
        "frozen": FrozenState(weights=[6, 7], step=8),
        "ordered": OrderedDict([("z", 9), ("y", 10)]),
        "pair": Pair((11, 12)),
        "empty": {"d": {}, "l": [], "t": ()},
    }
    rebuilt = unflatten(template, leaves(template))
    assert rebuilt == template
    assert rebuilt is not template
    _assert_same_types(template, rebuilt)


async def test_unflatten_places_new_leaves_in_flatten_order():
    template = {"b": [0, 0], "a": Point(0.0, 0.0), "opt": Optimizer(0.0, 0.0)}
    rebuilt = unflatten(template, range(6))
    assert rebuilt == {"b": [0, 1], "a": Point(2, 3), "opt": Optimizer(4, 5)}
    assert list(rebuilt) == ["b", "a", "opt"]
    assert type(rebuilt["a"]) is Point
    assert type(rebuilt["opt"]) is Optimizer


async def test_unflatten_frozen_dataclass():
    rebuilt = unflatten(FrozenState(weights=[0, 0], step=0), [1, 2, 3])
    assert rebuilt == FrozenState(weights=[1, 2], step=3)
    assert type(rebuilt) is FrozenState


async def test_unflatten_dataclass_init_false_field_takes_new_leaf():
    rebuilt = unflatten(WithDerived(a=1, b=2), [10, 20, 99])
    assert (rebuilt.a, rebuilt.b, rebuilt.total) == (10, 20, 99)


async def test_unflatten_frozen_dataclass_init_false_field_takes_new_leaf():
    rebuilt = unflatten(FrozenWithDerived(a=1), [5, 42])
    assert (rebuilt.a, rebuilt.doubled) == (5, 42)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rebuilt.a = 6  # type: ignore[misc]


async def test_unflatten_does_not_mutate_template():
    template = {"w": [1, 2], "opt": Optimizer(0.1, 0.9)}
    unflatten(template, [3, 4, 5, 6])
    assert template == {"w": [1, 2], "opt": Optimizer(0.1, 0.9)}


async def test_unflatten_leaf_template():
    assert unflatten(0, ["new"]) == "new"


async def test_unflatten_accepts_iterator():
    assert unflatten([0, 0, 0], iter("abc")) == ["a", "b", "c"]


async def test_unflatten_too_few_leaves_raises_value_error():
    with pytest.raises(ValueError, match=r"needs 3 leaves .* fewer were given"):
        unflatten({"a": 0, "b": [0, 0]}, [1, 2])


async def test_unflatten_too_many_leaves_raises_value_error():
    with pytest.raises(ValueError, match=r"needs 2 leaves .* more were given"):
        unflatten([0, 0], [1, 2, 3])


async def test_unflatten_empty_template_rejects_leaves():
    assert unflatten({}, []) == {}
    with pytest.raises(ValueError, match="more were given"):
        unflatten({}, [1])


async def test_map_structure_keeps_container_types_and_order():
    structure = {"b": [1, 2], "a": Point(3, 4), "opt": Optimizer(5, 6), "t": (7,)}
    mapped = map_structure(lambda leaf: leaf * 10, structure)
    assert mapped == {"b": [10, 20], "a": Point(30, 40), "opt": Optimizer(50, 60), "t": (70,)}
    _assert_same_types(structure, mapped)
    assert structure["b"] == [1, 2]


async def test_map_structure_on_leaf():
    assert map_structure(str, 3) == "3"


async def test_map_structure_over_numpy_arrays():
    structure = {"w": np.ones(3), "b": np.zeros(2)}
    mapped = map_structure(lambda array: array + 1, structure)
    np.testing.assert_array_equal(mapped["w"], np.full(3, 2.0))
    np.testing.assert_array_equal(mapped["b"], np.ones(2))


async def test_map_with_paths_passes_each_leaf_path():
    structure = {"b": {"x": 1}, "a": [2, Point(3, 4)], "opt": Optimizer(5, 6)}
    mapped = map_with_paths(lambda path, leaf: f"{path}={leaf}", structure)
    assert mapped == {
        "b": {"x": "b/x=1"},
        "a": ["a/0=2", Point("a/1/x=3", "a/1/y=4")],
        "opt": Optimizer("opt/lr=5", "opt/momentum=6"),
    }
    assert type(mapped["a"][1]) is Point


async def test_map_with_paths_root_leaf_path_is_empty():
    assert map_with_paths(lambda path, leaf: (path, leaf), 7) == ("", 7)


async def test_map_with_paths_non_str_key_raises_type_error():
    with pytest.raises(TypeError, match=r"at 'a'"):
        map_with_paths(lambda path, leaf: leaf, {"a": {None: 1}})


async def test_dict_subclasses_keep_their_type_and_settings():
    from collections import OrderedDict, defaultdict

    counts = defaultdict(int, a=1)
    mapped = map_structure(lambda x: x + 1, counts)
    assert type(mapped) is defaultdict and mapped == {"a": 2}
    assert mapped["missing"] == 0
    ordered = unflatten(OrderedDict(b=0, a=0), [1, 2])
    assert type(ordered) is OrderedDict and list(ordered.items()) == [("b", 1), ("a", 2)]


async def test_map_children_maps_one_level_and_keeps_container_types():
    inner = {"b": [1, 2]}
    mapped = map_children(lambda child: ("seen", child), OrderedDict(a=1, inner=inner))
    assert type(mapped) is OrderedDict
    assert mapped == OrderedDict(a=("seen", 1), inner=("seen", inner))
    assert mapped["inner"][1] is inner  # child containers are handed over as they are
    point = map_children(str, Point(1.0, 2.0))
    assert type(point) is Point and point == Point("1.0", "2.0")
    assert map_children(len, [[1], (2, 3), ()]) == [1, 2, 0]
    assert map_children(len, ([1], (2, 3))) == (1, 2)


async def test_map_children_rebuilds_dataclasses_init_false_fields_included():
    visited = []

    def shift(value):
        visited.append(value)
        return value + 100

    rebuilt = map_children(shift, WithDerived(1, 2))
    assert visited == [1, 2, 3]  # declaration order, the derived field too
    # The derived field takes fn's value (103), not the one __post_init__ computes (203).
    assert (rebuilt.a, rebuilt.b, rebuilt.total) == (101, 102, 103)
    frozen = map_children(shift, FrozenWithDerived(5))
    assert (frozen.a, frozen.doubled) == (105, 110)


async def test_map_children_of_a_leaf_is_a_type_error():
    with pytest.raises(TypeError, match="map_children needs a container, got int"):
        map_children(str, 3)
