"""Tests of the release suite: the keys a value is released under, and releasing one again."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from managers.release.base import ReleaseManager
from managers.testing import FakeValueReference
from programlogic.testing.contracts.release._support import (
    ReleaseSubject,
    holds,
    needs_idempotency,
)

__all__ = ["KeyTests"]


class KeyTests:
    """Which keys a manager takes, and how releasing a key again replaces what it held."""

    # Keys

    async def test_keys_may_arrive_in_any_order(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        for key in (5, 2, 9, 1):
            await manager.release({"round": key}, key)
        await holds(subject, {key: {"round": key} for key in (1, 2, 5, 9)})

    async def test_int_and_str_keys_are_held_apart(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        if not subject.capabilities.str_keys:
            with pytest.raises(TypeError, match="'final'"):
                await manager.release({"loss": 0.5}, "final")
            await holds(subject, {})
            return
        await manager.release({"loss": 0.25}, 1)
        await manager.release({"loss": 0.75}, "1")
        await manager.release({"weights": [1.0, 2.0]}, "final_training_checkpoint_round_100")
        await holds(
            subject,
            {
                1: {"loss": 0.25},
                "1": {"loss": 0.75},
                "final_training_checkpoint_round_100": {"weights": [1.0, 2.0]},
            },
        )

    @pytest.mark.parametrize(
        ("key", "found"),
        [(True, "bool True"), (False, "bool False"), (1.0, "float 1.0"), (None, "NoneType None")],
        ids=["true", "false", "float", "none"],
    )
    async def test_an_invalid_key_raises_type_error_naming_it(
        self, subject: ReleaseSubject, manager: ReleaseManager, key: Any, found: str
    ) -> None:
        await manager.release({"loss": 0.5}, 1)
        with pytest.raises(TypeError, match=rf"release key must be an int or a str, got {found}"):
            await manager.release({"loss": 0.25}, key)
        await holds(subject, {1: {"loss": 0.5}})

    # Idempotency by key

    async def test_releasing_a_key_again_replaces_it_and_leaves_other_keys(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        needs_idempotency(subject)
        for key in (1, 2, 3):
            await manager.release({"loss": float(key)}, key)
        await manager.release({"loss": 2.5}, 2)
        await holds(subject, {1: {"loss": 1.0}, 2: {"loss": 2.5}, 3: {"loss": 3.0}})

    async def test_releasing_the_same_value_again_holds_it_once(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        needs_idempotency(subject)
        for _ in range(3):
            await manager.release({"loss": 1.0}, 7)
        await holds(subject, {7: {"loss": 1.0}})

    async def test_keys_released_again_in_any_order_hold_their_last_value(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        needs_idempotency(subject)
        for key in range(1, 7):
            await manager.release({"loss": float(key), "round": key}, key)
        for key in (4, 1, 6, 2, 4):
            await manager.release({"loss": key + 0.5, "round": key}, key)
        replaced = {1, 2, 4, 6}
        expected = {
            key: {"loss": key + 0.5 if key in replaced else float(key), "round": key}
            for key in range(1, 7)
        }
        await holds(subject, expected)

    async def test_overlapping_releases_of_one_key_keep_the_last_call(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        needs_idempotency(subject)
        gate = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(
                manager.release, {"loss": FakeValueReference(0.25, gate=gate, delay=0)}, 1
            )
            await anyio.wait_all_tasks_blocked()
            group.start_soon(manager.release, {"loss": FakeValueReference(0.75)}, 1)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        await holds(subject, {1: {"loss": 0.75}})
