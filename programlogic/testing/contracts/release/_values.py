"""Tests of the release suite: releasing a value holds it under its key."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np
import pytest

from managers.release.base import ReleaseManager
from managers.testing import FakeValueReference
from programlogic.testing.contracts.release._support import ReleaseSubject, holds

__all__ = ["ValueTests"]


class _Metrics(NamedTuple):
    loss: Any
    accuracy: Any


@dataclasses.dataclass
class _Summary:
    rounds: Any


class ValueTests:
    """What a release holds: its value, with references materialized, in its structure."""

    async def test_a_new_manager_holds_nothing(self, subject: ReleaseSubject) -> None:
        assert isinstance(subject.manager, ReleaseManager)
        await holds(subject, {})

    async def test_a_release_is_held_under_its_key(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 0.5, "accuracy": 0.75}, 1)
        await holds(subject, {1: {"loss": 0.5, "accuracy": 0.75}})

    async def test_value_references_are_materialized(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release(
            {
                "loss": FakeValueReference(0.25),
                "nested": {"accuracy": FakeValueReference(0.75), "count": 3},
                "ids": [FakeValueReference(1)],
            },
            4,
        )
        await manager.release(FakeValueReference(0.5, delay=3), 100)
        await holds(
            subject,
            {4: {"loss": 0.25, "nested": {"accuracy": 0.75, "count": 3}, "ids": [1]}, 100: 0.5},
        )

    async def test_namedtuples_and_dataclasses_are_released(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        value = {
            "metrics": _Metrics(loss=FakeValueReference(0.5), accuracy=0.25),
            "summary": _Summary(FakeValueReference(3)),
        }
        await manager.release(value, 1)
        expected = {"metrics": _Metrics(loss=0.5, accuracy=0.25), "summary": _Summary(rounds=3)}
        await holds(subject, {1: expected})

    async def test_arrays_are_held_or_refused_naming_their_path(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        value = {
            "weights": FakeValueReference(np.arange(3.0)),
            "bias": np.ones(2, dtype=np.float32),
        }
        if not subject.capabilities.arrays:
            with pytest.raises(TypeError, match=r"'weights'.* array of shape \(3,\)"):
                await manager.release(value, 1)
            await holds(subject, {})
            return
        await manager.release(value, 1)
        await holds(subject, {1: {"weights": np.arange(3.0), "bias": np.ones(2, np.float32)}})
