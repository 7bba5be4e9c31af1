"""Tests of the program-state suite: a saved state loads back equal, shaped by a template."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import pytest

from managers.state.base import ProgramStateManager
from programlogic.testing.contracts.state._support import kept_versions, state_of

__all__ = ["RoundTripTests"]


class _Weights(NamedTuple):
    kernel: Any
    bias: Any


@dataclasses.dataclass
class _OptimizerState:
    lr: float
    step: int


class RoundTripTests:
    """What a manager loads back: the state it saved, in the types a template gives."""

    # A new manager

    async def test_is_a_program_state_manager(self, manager: ProgramStateManager) -> None:
        assert isinstance(manager, ProgramStateManager)

    async def test_a_new_manager_has_no_version(self, manager: ProgramStateManager) -> None:
        assert await manager.get_versions() == []
        assert await manager.load_latest() == (None, 0)
        assert await manager.load_latest({"weights": [0.0, 0.0]}) == (None, 0)

    # Round-trips

    async def test_a_saved_state_loads_back_equal(self, manager: ProgramStateManager) -> None:
        await manager.save(state_of(0), 0)
        assert await manager.load(0) == state_of(0)

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
            await manager.save(state_of(version), version)
        for version in kept_versions(manager.retention, [0, 1, 2]):
            assert await manager.load(version) == state_of(version)

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
