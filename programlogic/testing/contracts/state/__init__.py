"""The contract suite of program-state managers: versioning, round-trips, errors, closing.

Subclass :class:`ProgramStateManagerContract` in a test file of yours and override its
``state_manager_factory`` fixture::

    import pytest

    from programlogic.testing.contracts import ProgramStateManagerContract


    class TestMyStateManager(ProgramStateManagerContract):
        @pytest.fixture
        def state_manager_factory(self, tmp_path):
            return lambda: MyStateManager(tmp_path / "state")

Every test of the suite then runs against your manager under asyncio and trio.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from managers.exceptions import (
    ManagerError,
    VersionError,
    VersionExistsError,
    VersionNotFoundError,
)
from managers.state.base import ProgramStateManager
from programlogic.testing.contracts._base import Contract

__all__ = ["ProgramStateManagerContract"]

StateManagerFactory = Callable[[], ProgramStateManager]


class _Weights(NamedTuple):
    kernel: Any
    bias: Any


@dataclasses.dataclass
class _OptimizerState:
    lr: float
    step: int


def _state(round_number: int) -> dict[str, Any]:
    return {
        "round": round_number,
        "weights": [float(round_number), float(round_number) + 0.5],
        "optimizer": {"lr": 0.1, "step": round_number},
        "name": f"round-{round_number}",
    }


class ProgramStateManagerContract(Contract):
    """The promises every :class:`~managers.ProgramStateManager` keeps.

    Override :meth:`state_manager_factory` to return a zero-argument callable that makes
    a manager; the first one it makes in a test holds no version (for a manager on
    disk: make each on one directory under the test's ``tmp_path``). The suite closes
    each manager it makes before it makes the next. Set :attr:`persistent` when later
    managers see what earlier ones saved, as a restarted program's does. Tests are named
    after the promise they check; one that your manager cannot keep can be overridden
    in your subclass, marked ``pytest.mark.xfail(strict=True, reason=...)``.
    """

    persistent: bool = False
    """Whether a manager the factory makes sees the versions that earlier ones saved."""

    @pytest.fixture
    def state_manager_factory(self) -> StateManagerFactory:
        """A callable making a new, empty manager; override it in your subclass."""
        raise NotImplementedError(
            f"{type(self).__name__} must override the state_manager_factory fixture"
        )

    @pytest.fixture
    async def manager(
        self, state_manager_factory: StateManagerFactory
    ) -> AsyncIterator[ProgramStateManager]:
        """A new manager, open for the test and closed after it."""
        async with state_manager_factory() as created:
            yield created

    # A new manager

    async def test_is_a_program_state_manager(self, manager: ProgramStateManager) -> None:
        assert isinstance(manager, ProgramStateManager)

    async def test_a_new_manager_has_no_version(self, manager: ProgramStateManager) -> None:
        assert await manager.get_versions() == []
        assert await manager.load_latest() == (None, 0)
        assert await manager.load_latest({"weights": [0.0, 0.0]}) == (None, 0)

    # Round-trips

    async def test_a_saved_state_loads_back_equal(self, manager: ProgramStateManager) -> None:
        await manager.save(_state(0), 0)
        assert await manager.load(0) == _state(0)

    async def test_arrays_load_back_with_their_dtype_and_shape(
        self, manager: ProgramStateManager
    ) -> None:
        kernel = np.arange(6, dtype=np.float32).reshape(2, 3)
        await manager.save({"kernel": kernel, "bias": np.zeros(3), "step": np.int64(4)}, 1)
        loaded = await manager.load(1)
        assert list(loaded) == ["kernel", "bias", "step"]
        np.testing.assert_array_equal(loaded["kernel"], kernel)
        assert loaded["kernel"].dtype == np.float32
        assert loaded["kernel"].shape == (2, 3)
        np.testing.assert_array_equal(loaded["bias"], np.zeros(3))
        assert loaded["step"] == 4 and loaded["step"].dtype == np.int64

    async def test_leaves_load_back_with_their_type(self, manager: ProgramStateManager) -> None:
        state = {"int": 2**70, "str": "text", "bytes": b"\x00\xff", "float": -0.0, "none": None}
        await manager.save(state, 0)
        loaded = await manager.load(0)
        assert loaded == state
        assert [type(leaf) for leaf in loaded.values()] == [type(leaf) for leaf in state.values()]

    async def test_dict_key_order_is_kept(self, manager: ProgramStateManager) -> None:
        await manager.save({"b": 1, "a": {"z": 2, "y": 3}}, 0)
        loaded = await manager.load(0)
        assert list(loaded) == ["b", "a"]
        assert list(loaded["a"]) == ["z", "y"]

    async def test_each_version_loads_its_own_state(self, manager: ProgramStateManager) -> None:
        for version in (0, 1, 2):
            await manager.save(_state(version), version)
        for version in (0, 1, 2):
            assert await manager.load(version) == _state(version)

    async def test_a_save_is_a_snapshot_of_the_state(self, manager: ProgramStateManager) -> None:
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

    async def test_mutating_a_loaded_state_leaves_the_saved_one(
        self, manager: ProgramStateManager
    ) -> None:
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

    # Templates

    async def test_a_template_gives_its_container_types(self, manager: ProgramStateManager) -> None:
        await manager.save(
            {
                "weights": {"kernel": [1.0, 2.0], "bias": 0.5},
                "optimizer": {"lr": 0.01, "step": 7},
                "pair": [3, 4],
            },
            2,
        )
        template = {
            "weights": _Weights(kernel=(0.0, 0.0), bias=0.0),
            "optimizer": _OptimizerState(lr=0.0, step=0),
            "pair": (0, 0),
        }
        loaded = await manager.load(2, template)
        assert loaded == {
            "weights": _Weights(kernel=(1.0, 2.0), bias=0.5),
            "optimizer": _OptimizerState(lr=0.01, step=7),
            "pair": (3, 4),
        }
        assert type(loaded["weights"]) is _Weights
        assert type(loaded["weights"].kernel) is tuple
        assert type(loaded["optimizer"]) is _OptimizerState
        assert type(loaded["pair"]) is tuple
        assert template["optimizer"] == _OptimizerState(lr=0.0, step=0)  # left as it was

    @pytest.mark.parametrize(
        ("saved", "template", "expected"),
        [
            ([[1.0, 2.0], 3.0], _Weights([0.0, 0.0], 0.0), _Weights([1.0, 2.0], 3.0)),
            ({"lr": 0.5, "step": 3}, _OptimizerState(0.0, 0), _OptimizerState(0.5, 3)),
            ([1, [2, 3]], (0, (0, 0)), (1, (2, 3))),
            ({"a": 1, "b": 2}, OrderedDict(a=0, b=0), OrderedDict(a=1, b=2)),
        ],
        ids=["namedtuple", "dataclass", "tuple", "dict-subclass"],
    )
    async def test_a_template_at_the_root_gives_its_type(
        self, manager: ProgramStateManager, saved: Any, template: Any, expected: Any
    ) -> None:
        await manager.save(saved, 0)
        loaded = await manager.load(0, template)
        assert loaded == expected
        assert type(loaded) is type(expected)
        if isinstance(expected, tuple) and not hasattr(expected, "_fields"):
            assert type(loaded[1]) is tuple

    async def test_a_template_keeps_array_leaves(self, manager: ProgramStateManager) -> None:
        await manager.save({"w": np.array([1.0, 2.0]), "b": np.float64(0.5)}, 0)
        loaded = await manager.load(0, _Weights(kernel=np.zeros(2), bias=0.0))
        assert type(loaded) is _Weights
        np.testing.assert_array_equal(loaded.kernel, [1.0, 2.0])
        assert loaded.bias == 0.5

    async def test_none_in_a_template_keeps_the_stored_subtree(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save({"model": [1.0, 2.0], "optimizer": {"lr": 0.1, "step": 4}}, 1)
        loaded = await manager.load(1, {"model": None, "optimizer": _OptimizerState(0.0, 0)})
        assert loaded == {"model": [1.0, 2.0], "optimizer": _OptimizerState(lr=0.1, step=4)}
        assert type(loaded["model"]) is list
        assert type(loaded["optimizer"]) is _OptimizerState

    async def test_load_latest_takes_a_template(self, manager: ProgramStateManager) -> None:
        await manager.save({"kernel": [0.0], "bias": 0.0}, 0)
        await manager.save({"kernel": [1.0], "bias": 2.0}, 1)
        state, version = await manager.load_latest(_Weights(kernel=(0.0,), bias=0.0))
        assert version == 1
        assert state == _Weights(kernel=(1.0,), bias=2.0)
        assert type(state) is _Weights

    # Versions

    async def test_load_latest_returns_the_newest_version(
        self, manager: ProgramStateManager
    ) -> None:
        for version in (1, 4, 9):
            await manager.save(_state(version), version)
        assert await manager.load_latest() == (_state(9), 9)

    async def test_versions_are_listed_ascending(self, manager: ProgramStateManager) -> None:
        for version in (0, 2, 3, 10, 11):
            await manager.save(_state(version), version)
        assert await manager.get_versions() == [0, 2, 3, 10, 11]

    async def test_saving_an_existing_version_raises_version_exists_error(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(_state(1), 1)
        await manager.save(_state(3), 3)
        for version in (3, 1):
            with pytest.raises(VersionExistsError, match=f"version {version}") as raised:
                await manager.save(_state(99), version)
            assert isinstance(raised.value, VersionError)
            assert isinstance(raised.value, ValueError)
            assert isinstance(raised.value, ManagerError)
        assert await manager.load(3) == _state(3)
        assert await manager.get_versions() == [1, 3]

    async def test_saving_a_version_lower_than_the_newest_raises_version_error(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(_state(5), 5)
        with pytest.raises(VersionError, match="version 4 is lower than the newest") as raised:
            await manager.save(_state(4), 4)
        assert not isinstance(raised.value, VersionExistsError)
        assert await manager.get_versions() == [5]

    @pytest.mark.parametrize(
        ("version", "message"),
        [
            (True, "must be an int, got bool True"),
            (False, "must be an int, got bool False"),
            (-1, "must be >= 0, got -1"),
            (1.0, "must be an int, got float 1.0"),
            ("1", "must be an int, got str '1'"),
            (None, "must be an int, got NoneType None"),
            (np.int64(1), "must be an int, got int64"),
        ],
        ids=["true", "false", "negative", "float", "str", "none", "numpy-int"],
    )
    async def test_an_invalid_version_raises_version_error_naming_it(
        self, manager: ProgramStateManager, version: Any, message: str
    ) -> None:
        await manager.save(_state(0), 0)
        with pytest.raises(VersionError, match=f"^version {message}"):
            await manager.save(_state(1), version)
        assert await manager.get_versions() == [0]
        assert await manager.load(0) == _state(0)

    async def test_loading_a_missing_version_raises_version_not_found_error(
        self, manager: ProgramStateManager
    ) -> None:
        with pytest.raises(VersionNotFoundError):
            await manager.load(0)
        await manager.save(_state(1), 1)
        with pytest.raises(VersionNotFoundError, match="2") as raised:
            await manager.load(2)
        assert isinstance(raised.value, LookupError)
        assert isinstance(raised.value, ManagerError)

    @pytest.mark.parametrize("version", [True, 1.0, "1", [1]])
    async def test_load_and_remove_of_a_non_int_raise_version_not_found_error(
        self, manager: ProgramStateManager, version: Any
    ) -> None:
        await manager.save({"a": 1}, 1)
        with pytest.raises(VersionNotFoundError):
            await manager.load(version)
        with pytest.raises(VersionNotFoundError):
            await manager.remove(version)
        assert await manager.get_versions() == [1]

    # Removing

    async def test_remove_deletes_one_version(self, manager: ProgramStateManager) -> None:
        for version in (1, 2, 3):
            await manager.save(_state(version), version)
        await manager.remove(2)
        assert await manager.get_versions() == [1, 3]
        with pytest.raises(VersionNotFoundError):
            await manager.load(2)
        assert await manager.load(1) == _state(1)
        assert await manager.load(3) == _state(3)

    async def test_removing_a_missing_version_raises_version_not_found_error(
        self, manager: ProgramStateManager
    ) -> None:
        with pytest.raises(VersionNotFoundError):
            await manager.remove(0)
        await manager.save(_state(1), 1)
        with pytest.raises(VersionNotFoundError, match="5"):
            await manager.remove(5)
        assert await manager.get_versions() == [1]

    async def test_remove_all_deletes_every_version(self, manager: ProgramStateManager) -> None:
        await manager.remove_all()
        for version in (0, 1, 2):
            await manager.save(_state(version), version)
        await manager.remove_all()
        assert await manager.get_versions() == []
        assert await manager.load_latest() == (None, 0)
        with pytest.raises(VersionNotFoundError):
            await manager.load(2)
        await manager.save(_state(0), 0)
        assert await manager.load_latest() == (_state(0), 0)

    async def test_removing_the_newest_version_lets_it_be_saved_again(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(_state(1), 1)
        await manager.save(_state(2), 2)
        await manager.remove(2)
        assert await manager.load_latest() == (_state(1), 1)
        replacement = {**_state(2), "name": "replacement"}
        await manager.save(replacement, 2)
        assert await manager.get_versions() == [1, 2]
        assert await manager.load_latest() == (replacement, 2)

    async def test_removing_an_older_version_still_rejects_lower_than_the_newest(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(_state(1), 1)
        await manager.save(_state(3), 3)
        await manager.remove(1)
        with pytest.raises(VersionError, match="lower than the newest"):
            await manager.save(_state(2), 2)
        assert await manager.get_versions() == [3]

    # Failures and cancellation

    async def test_a_cancelled_save_leaves_the_whole_version_or_none_of_it(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(_state(0), 0)
        for version in range(1, 25):  # cancelled after 0, 1, ... checkpoints of the saver
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(_cancel_after, scope, version - 1)
                    await manager.save(_state(version), version)
            versions = await manager.get_versions()
            assert versions[0] == 0 and versions == sorted(versions)
            assert set(versions) <= set(range(version + 1))
            for saved in versions:
                assert await manager.load(saved) == _state(saved)
        state, version = await manager.load_latest()
        assert state == _state(version)

    # Restarts

    async def test_a_restarted_manager_resumes_from_the_saved_versions(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        if not self.persistent:
            pytest.skip("the versions do not outlive their manager")
        async with state_manager_factory() as first:
            for version in (0, 2):
                await first.save(_state(version), version)
        async with state_manager_factory() as restarted:
            assert await restarted.get_versions() == [0, 2]
            assert await restarted.load_latest() == (_state(2), 2)
            with pytest.raises(VersionExistsError):
                await restarted.save(_state(2), 2)
            with pytest.raises(VersionError, match="lower than the newest"):
                await restarted.save(_state(1), 1)
            await restarted.save(_state(3), 3)
        async with state_manager_factory() as again:
            assert await again.load_latest() == (_state(3), 3)

    # Closing

    async def test_async_with_returns_the_manager_and_closes_it(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        created = state_manager_factory()
        async with created as entered:
            assert entered is created
            await entered.save(_state(0), 0)
            assert await entered.load_latest() == (_state(0), 0)

    async def test_async_with_propagates_errors(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        with pytest.raises(RuntimeError, match="inside"):
            async with state_manager_factory():
                raise RuntimeError("inside")

    async def test_aclose_may_be_called_twice(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        created = state_manager_factory()
        await created.save(_state(0), 0)
        assert await created.aclose() is None
        assert await created.aclose() is None


async def _cancel_after(scope: anyio.CancelScope, checkpoints: int) -> None:
    """Cancel ``scope`` once this task has passed ``checkpoints`` scheduling points."""
    for _ in range(checkpoints):
        await anyio.lowlevel.checkpoint()
    scope.cancel()
