"""FilteringReleaseManager beyond the shared contract: what it keeps and what it prunes."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, NamedTuple

import pytest

from managers import MemoryReleaseManager
from managers.release.filtering import FilteringReleaseManager
from managers.structure import flatten
from managers.testing import FakeValueReference

pytestmark = pytest.mark.anyio


class Metrics(NamedTuple):
    loss: Any
    accuracy: Any


@dataclasses.dataclass
class Summary:
    rounds: Any
    best: Any


METRICS = {
    "client_work": {"train": {"loss": 0.5, "accuracy": 0.75}},
    "aggregator": {"mean_value": 1.0},
    "finalizer": {},
}


async def filtered(value: Any, filter_fn: Any, key: Any = 1) -> dict[Any, Any]:
    memory = MemoryReleaseManager()
    await FilteringReleaseManager(memory, filter_fn).release(value, key)
    return memory.values()


async def test_keeps_the_leaves_the_filter_keeps():
    held = await filtered(METRICS, lambda path: path.startswith("client_work/train/"))
    assert held == {1: {"client_work": {"train": {"loss": 0.5, "accuracy": 0.75}}}}


async def test_drops_leaves_and_prunes_containers_left_empty():
    held = await filtered(METRICS, lambda path: path.endswith("loss"))
    assert held == {1: {"client_work": {"train": {"loss": 0.5}}}}


async def test_empty_containers_are_pruned_even_when_everything_is_kept():
    held = await filtered(METRICS, lambda path: True)
    assert held == {
        1: {
            "client_work": {"train": {"loss": 0.5, "accuracy": 0.75}},
            "aggregator": {"mean_value": 1.0},
        }
    }


async def test_filter_sees_every_leaf_path_once():
    seen = []
    value = {"a": {"b": 1, "c": [2, 3]}, "m": Metrics(4, 5), "s": Summary(6, 7)}
    await filtered(value, lambda path: seen.append(path) or True)
    assert seen == [path for path, _ in flatten(value)]  # the paths flatten gives
    assert seen == ["a/b", "a/c/0", "a/c/1", "m/loss", "m/accuracy", "s/rounds", "s/best"]


async def test_value_is_handed_on_as_it_is_when_nothing_is_dropped():
    memory = MemoryReleaseManager()
    value = {"loss": 0.5, "nested": {"metrics": Metrics(1, 2)}}
    await FilteringReleaseManager(memory, lambda path: True).release(value, 1)
    assert memory.values()[1] is value


async def test_fully_kept_containers_keep_their_types():
    value = {"metrics": Metrics(0.5, 0.75), "summary": Summary(3, 0.1), "other": 1}
    held = await filtered(value, lambda path: path != "other")
    assert held == {1: {"metrics": Metrics(0.5, 0.75), "summary": Summary(3, 0.1)}}
    assert type(held[1]["metrics"]) is Metrics


async def test_partly_kept_sequences_and_dataclasses_become_dicts_that_keep_paths():
    value = {"weights": [10, 11, 12], "metrics": Metrics(0.5, 0.75), "summary": Summary(3, 0.1)}
    kept = {"weights/1", "metrics/accuracy", "summary/best"}
    held = await filtered(value, lambda path: path in kept)
    assert held == {
        1: {"weights": {"1": 11}, "metrics": {"accuracy": 0.75}, "summary": {"best": 0.1}}
    }


async def test_partly_kept_dict_keeps_its_type():
    value = collections.OrderedDict([("loss", 0.5), ("accuracy", 0.75)])
    held = await filtered(value, lambda path: path == "accuracy")
    assert held == {1: collections.OrderedDict([("accuracy", 0.75)])}
    assert type(held[1]) is collections.OrderedDict


async def test_references_are_materialized_before_filtering():
    value = {
        "eval": FakeValueReference({"loss": 0.5, "accuracy": 0.75}),
        "train": FakeValueReference(0.1),
    }
    held = await filtered(value, lambda path: path == "eval/accuracy")
    assert held == {1: {"eval": {"accuracy": 0.75}}}


async def test_root_leaf_has_the_empty_path():
    assert await filtered(FakeValueReference("model"), lambda path: path == "", key="final") == {
        "final": "model"
    }
    assert await filtered("model", lambda path: path != "", key="final") == {}


async def test_nothing_is_released_when_nothing_is_left():
    memory = MemoryReleaseManager()
    manager = FilteringReleaseManager(memory, lambda path: path == "loss")
    await manager.release({"loss": 1.0}, 1)
    await manager.release({"accuracy": 0.5}, 2)
    await manager.release({"accuracy": 0.6}, 1)  # key 1 keeps what it held
    await manager.release({}, 3)
    assert memory.values() == {1: {"loss": 1.0}}


async def test_filter_errors_propagate():
    def broken(path: str) -> bool:
        raise KeyError(path)

    with pytest.raises(KeyError, match="loss"):
        await filtered({"loss": 1.0}, broken)


async def test_invalid_key_raises_before_filtering():
    with pytest.raises(TypeError, match="release key must be an int or a str, got NoneType"):
        await filtered({"loss": 1.0}, lambda path: True, key=None)


async def test_aclose_closes_the_inner_manager():
    class Closing(MemoryReleaseManager):
        closed = False

        async def aclose(self) -> None:
            self.closed = True

    inner = Closing()
    async with FilteringReleaseManager(inner, lambda path: True) as manager:
        assert manager.manager is inner
    assert inner.closed


async def test_invalid_arguments_raise_type_error():
    with pytest.raises(TypeError, match=r"manager must be a ReleaseManager, got dict \{\}"):
        FilteringReleaseManager({}, lambda path: True)
    with pytest.raises(TypeError, match=r"filter_fn must be callable, got str"):
        FilteringReleaseManager(MemoryReleaseManager(), "loss")
