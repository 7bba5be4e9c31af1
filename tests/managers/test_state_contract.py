"""The contract every ProgramStateManager implementation fulfils.

To run the suite against another implementation, add one more ``pytest.param`` to
``STATE_MANAGER_FACTORIES``: a callable taking the test's ``tmp_path`` (a directory the
manager may write to) and returning a new, empty manager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from managers import (
    ManagerError,
    MemoryProgramStateManager,
    ProgramStateManager,
    VersionError,
    VersionExistsError,
    VersionNotFoundError,
)
from managers.state.file import FileProgramStateManager

pytestmark = pytest.mark.anyio

StateManagerFactory = Callable[[], ProgramStateManager]

STATE_MANAGER_FACTORIES = [
    pytest.param(lambda tmp_path: MemoryProgramStateManager(), id="memory"),
    pytest.param(lambda tmp_path: FileProgramStateManager(tmp_path / "state"), id="file"),
]


@pytest.fixture(params=STATE_MANAGER_FACTORIES)
def state_manager_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StateManagerFactory:
    """A zero-argument callable returning a new, empty manager of one implementation."""
    factory = request.param
    return lambda: factory(tmp_path)


@pytest.fixture
async def manager(state_manager_factory: StateManagerFactory) -> AsyncIterator[ProgramStateManager]:
    async with state_manager_factory() as created:
        yield created


class Weights(NamedTuple):
    kernel: object
    bias: object


@dataclasses.dataclass
class OptimizerState:
    lr: float
    step: int


def _state(round_number: int) -> dict:
    return {
        "round": round_number,
        "weights": [float(round_number), float(round_number) + 0.5],
        "optimizer": {"lr": 0.1, "step": round_number},
        "name": f"round-{round_number}",
    }


async def test_is_a_program_state_manager(manager):
    assert isinstance(manager, ProgramStateManager)


async def test_empty_manager(manager):
    assert await manager.get_versions() == []
    assert await manager.load_latest() == (None, 0)


async def test_empty_manager_load_latest_with_structure(manager):
    assert await manager.load_latest({"weights": [0.0, 0.0]}) == (None, 0)


async def test_save_load_round_trip(manager):
    await manager.save(_state(0), 0)
    assert await manager.load(0) == _state(0)


async def test_save_load_round_trip_numpy(manager):
    kernel = np.arange(6, dtype=np.float32).reshape(2, 3)
    await manager.save({"kernel": kernel, "bias": np.zeros(3)}, 1)
    loaded = await manager.load(1)
    assert list(loaded) == ["kernel", "bias"]
    np.testing.assert_array_equal(loaded["kernel"], kernel)
    assert loaded["kernel"].dtype == np.float32
    assert loaded["kernel"].shape == (2, 3)
    np.testing.assert_array_equal(loaded["bias"], np.zeros(3))


async def test_round_trip_keeps_dict_key_order(manager):
    await manager.save({"b": 1, "a": {"z": 2, "y": 3}}, 0)
    loaded = await manager.load(0)
    assert list(loaded) == ["b", "a"]
    assert list(loaded["a"]) == ["z", "y"]


async def test_load_latest_returns_newest(manager):
    for version in (1, 4, 9):
        await manager.save(_state(version), version)
    assert await manager.load_latest() == (_state(9), 9)


async def test_each_version_loads_its_own_state(manager):
    for version in (0, 1, 2):
        await manager.save(_state(version), version)
    for version in (0, 1, 2):
        assert await manager.load(version) == _state(version)


async def test_versions_are_listed_ascending(manager):
    for version in (0, 2, 3, 10, 11):
        await manager.save(_state(version), version)
    assert await manager.get_versions() == [0, 2, 3, 10, 11]


async def test_saving_existing_version_raises_version_exists_error(manager):
    await manager.save(_state(3), 3)
    with pytest.raises(VersionExistsError, match="3"):
        await manager.save(_state(99), 3)
    assert await manager.load(3) == _state(3)
    assert await manager.get_versions() == [3]


async def test_version_exists_error_is_a_version_error():
    assert issubclass(VersionExistsError, VersionError)
    assert issubclass(VersionError, ValueError)
    assert issubclass(VersionError, ManagerError)


async def test_saving_lower_than_newest_raises_version_error(manager):
    await manager.save(_state(5), 5)
    with pytest.raises(VersionError, match="lower than the newest") as info:
        await manager.save(_state(4), 4)
    assert not isinstance(info.value, VersionExistsError)
    assert await manager.get_versions() == [5]


async def test_saving_existing_older_version_raises_version_exists_error(manager):
    await manager.save(_state(1), 1)
    await manager.save(_state(2), 2)
    with pytest.raises(VersionExistsError):
        await manager.save(_state(1), 1)
    assert await manager.get_versions() == [1, 2]


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (True, "must be an int, got bool"),
        (False, "must be an int, got bool"),
        (-1, "must be >= 0"),
        (1.0, "must be an int, got float"),
        ("1", "must be an int, got str"),
        (None, "must be an int, got NoneType"),
        (np.int64(1), "must be an int"),
    ],
    ids=["true", "false", "negative", "float", "str", "none", "numpy-int"],
)
async def test_invalid_version_raises_version_error(manager, version, message):
    with pytest.raises(VersionError, match=message):
        await manager.save(_state(0), version)
    assert await manager.get_versions() == []
    assert await manager.load_latest() == (None, 0)


async def test_invalid_version_leaves_saved_versions_intact(manager):
    await manager.save(_state(0), 0)
    with pytest.raises(VersionError):
        await manager.save(_state(1), -5)
    assert await manager.get_versions() == [0]
    assert await manager.load(0) == _state(0)


async def test_load_missing_version_raises_version_not_found_error(manager):
    await manager.save(_state(1), 1)
    with pytest.raises(VersionNotFoundError, match="2"):
        await manager.load(2)


async def test_load_on_empty_manager_raises_version_not_found_error(manager):
    with pytest.raises(VersionNotFoundError):
        await manager.load(0)


async def test_version_not_found_error_is_a_lookup_error(manager):
    assert issubclass(VersionNotFoundError, ManagerError)
    with pytest.raises(LookupError):
        await manager.load(7)


async def test_remove_deletes_one_version(manager):
    for version in (1, 2, 3):
        await manager.save(_state(version), version)
    await manager.remove(2)
    assert await manager.get_versions() == [1, 3]
    with pytest.raises(VersionNotFoundError):
        await manager.load(2)
    assert await manager.load(1) == _state(1)
    assert await manager.load(3) == _state(3)


async def test_remove_missing_version_raises_version_not_found_error(manager):
    await manager.save(_state(1), 1)
    with pytest.raises(VersionNotFoundError, match="5"):
        await manager.remove(5)
    assert await manager.get_versions() == [1]


async def test_remove_on_empty_manager_raises_version_not_found_error(manager):
    with pytest.raises(VersionNotFoundError):
        await manager.remove(0)


async def test_remove_all(manager):
    for version in (0, 1, 2):
        await manager.save(_state(version), version)
    await manager.remove_all()
    assert await manager.get_versions() == []
    assert await manager.load_latest() == (None, 0)
    with pytest.raises(VersionNotFoundError):
        await manager.load(2)


async def test_remove_all_on_empty_manager(manager):
    await manager.remove_all()
    assert await manager.get_versions() == []


async def test_save_after_remove_all(manager):
    await manager.save(_state(4), 4)
    await manager.remove_all()
    await manager.save(_state(0), 0)
    assert await manager.load_latest() == (_state(0), 0)


async def test_removing_newest_version_allows_saving_it_again(manager):
    await manager.save(_state(1), 1)
    await manager.save(_state(2), 2)
    await manager.remove(2)
    assert await manager.load_latest() == (_state(1), 1)
    replacement = {**_state(2), "name": "replacement"}
    await manager.save(replacement, 2)
    assert await manager.get_versions() == [1, 2]
    assert await manager.load(2) == replacement
    assert await manager.load_latest() == (replacement, 2)


async def test_removing_older_version_still_rejects_lower_than_newest(manager):
    await manager.save(_state(1), 1)
    await manager.save(_state(3), 3)
    await manager.remove(1)
    with pytest.raises(VersionError, match="lower than the newest"):
        await manager.save(_state(2), 2)
    assert await manager.get_versions() == [3]


async def test_save_is_a_snapshot_of_the_state(manager):
    weights = np.array([1.0, 2.0, 3.0])
    state = {"weights": weights, "meta": {"round": 1}, "history": [0.5]}
    await manager.save(state, 1)
    weights[0] = 100.0
    state["meta"]["round"] = 99
    state["history"].append(0.25)
    state["extra"] = "added"
    loaded = await manager.load(1)
    assert list(loaded) == ["weights", "meta", "history"]
    np.testing.assert_array_equal(loaded["weights"], [1.0, 2.0, 3.0])
    assert loaded["meta"] == {"round": 1}
    assert loaded["history"] == [0.5]


async def test_mutating_loaded_state_does_not_change_stored_state(manager):
    await manager.save({"weights": np.array([1.0, 2.0]), "meta": {"round": 1}}, 1)
    loaded = await manager.load(1)
    loaded["weights"][0] = -1.0
    loaded["meta"]["round"] = 42
    loaded["new"] = True
    again, version = await manager.load_latest()
    assert version == 1
    assert list(again) == ["weights", "meta"]
    np.testing.assert_array_equal(again["weights"], [1.0, 2.0])
    assert again["meta"] == {"round": 1}


async def test_load_with_structure_uses_template_container_types(manager):
    await manager.save(
        {
            "weights": {"kernel": [1.0, 2.0], "bias": 0.5},
            "optimizer": {"lr": 0.01, "step": 7},
            "pair": [3, 4],
        },
        2,
    )
    template = {
        "weights": Weights(kernel=(0.0, 0.0), bias=0.0),
        "optimizer": OptimizerState(lr=0.0, step=0),
        "pair": (0, 0),
    }
    loaded = await manager.load(2, template)
    assert loaded == {
        "weights": Weights(kernel=(1.0, 2.0), bias=0.5),
        "optimizer": OptimizerState(lr=0.01, step=7),
        "pair": (3, 4),
    }
    assert type(loaded["weights"]) is Weights
    assert type(loaded["weights"].kernel) is tuple
    assert type(loaded["optimizer"]) is OptimizerState
    assert type(loaded["pair"]) is tuple
    # The template is not modified.
    assert template["optimizer"] == OptimizerState(lr=0.0, step=0)


async def test_load_with_namedtuple_template_at_root(manager):
    await manager.save([[1.0, 2.0], 3.0], 0)
    loaded = await manager.load(0, Weights(kernel=[0.0, 0.0], bias=0.0))
    assert loaded == Weights(kernel=[1.0, 2.0], bias=3.0)
    assert type(loaded) is Weights


async def test_load_with_dataclass_template_at_root(manager):
    await manager.save({"lr": 0.5, "step": 3}, 0)
    loaded = await manager.load(0, OptimizerState(lr=0.0, step=0))
    assert loaded == OptimizerState(lr=0.5, step=3)
    assert type(loaded) is OptimizerState


async def test_load_with_tuple_template_at_root(manager):
    await manager.save([1, [2, 3]], 0)
    loaded = await manager.load(0, (0, (0, 0)))
    assert loaded == (1, (2, 3))
    assert type(loaded) is tuple
    assert type(loaded[1]) is tuple


async def test_load_with_template_keeps_numpy_leaves(manager):
    await manager.save({"w": np.array([1.0, 2.0]), "b": np.float64(0.5)}, 0)
    loaded = await manager.load(0, Weights(kernel=np.zeros(2), bias=0.0))
    assert type(loaded) is Weights
    np.testing.assert_array_equal(loaded.kernel, [1.0, 2.0])
    assert loaded.bias == 0.5


async def test_none_subtree_in_dict_template_keeps_stored_subtree(manager):
    await manager.save({"model": [1.0, 2.0], "optimizer": {"lr": 0.1, "step": 4}}, 1)
    loaded = await manager.load(1, {"model": None, "optimizer": OptimizerState(0.0, 0)})
    assert loaded == {"model": [1.0, 2.0], "optimizer": OptimizerState(lr=0.1, step=4)}
    assert type(loaded["model"]) is list
    assert type(loaded["optimizer"]) is OptimizerState


async def test_load_latest_with_structure(manager):
    await manager.save({"kernel": [0.0], "bias": 0.0}, 0)
    await manager.save({"kernel": [1.0], "bias": 2.0}, 1)
    state, version = await manager.load_latest(Weights(kernel=(0.0,), bias=0.0))
    assert version == 1
    assert state == Weights(kernel=(1.0,), bias=2.0)
    assert type(state) is Weights


async def test_async_context_manager(state_manager_factory):
    created = state_manager_factory()
    async with created as entered:
        assert entered is created
        await entered.save(_state(0), 0)
        assert await entered.load_latest() == (_state(0), 0)


async def test_async_context_manager_propagates_errors(state_manager_factory):
    with pytest.raises(RuntimeError, match="inside"):
        async with state_manager_factory():
            raise RuntimeError("inside")


async def test_aclose(state_manager_factory):
    created = state_manager_factory()
    await created.save(_state(0), 0)
    assert await created.aclose() is None


@pytest.mark.parametrize("version", [True, 1.0, "1", [1]])
async def test_load_and_remove_take_only_int_versions(manager, version):
    await manager.save({"a": 1}, 1)
    with pytest.raises(VersionNotFoundError):
        await manager.load(version)
    with pytest.raises(VersionNotFoundError):
        await manager.remove(version)
    assert await manager.get_versions() == [1]


async def test_a_dict_subclass_template_gives_its_type(manager):
    from collections import OrderedDict

    await manager.save({"a": 1, "b": 2}, 0)
    loaded = await manager.load(0, OrderedDict(a=0, b=0))
    assert type(loaded) is OrderedDict and loaded == OrderedDict(a=1, b=2)
