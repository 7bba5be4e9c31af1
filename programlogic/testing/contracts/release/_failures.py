"""Tests of the release suite: failed, concurrent and cancelled releases.

A cancelled release returns within the suite's ``cancel_grace`` of its cancellation
(0.5 s unless the suite says otherwise) and leaves all of its effect or none: its key
holds what it held before or the whole new value, never a part of it, and nothing
changes once it returned. The suite cancels releases at each of their first scheduling
points, and once ``CANCEL_AFTER_S`` after the release began.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from managers.release.base import ReleaseKey, ReleaseManager
from managers.testing import FakeValueReference
from programlogic.testing.contracts._base import assert_returned_within, call_cancelled_after
from programlogic.testing.contracts.release._support import (
    ReleaseSubject,
    _DiskFull,
    comparable,
    held_by,
    holds,
)

__all__ = ["CANCEL_AFTER_S", "FailureTests"]

CANCEL_AFTER_S = 0.1
"""How long after it began the suite cancels a release in flight, in one test."""


class FailureTests:
    """What the storage holds after releases that fail, overlap or are cancelled."""

    cancel_grace: float
    """How soon a cancelled call returns: see :class:`ReleaseManagerContract`."""

    # Failures

    async def test_a_failed_release_raises_its_error_and_leaves_what_keys_held(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 1.0}, 1)
        with pytest.raises(_DiskFull, match="disk full"):
            await manager.release({"loss": FakeValueReference(error=_DiskFull("disk full"))}, 2)
        with pytest.raises(_DiskFull, match="disk full"):
            await manager.release(
                {"loss": FakeValueReference(error=_DiskFull("disk full")), "accuracy": 0.5}, 1
            )
        await holds(subject, {1: {"loss": 1.0}})

    async def test_a_later_failed_release_of_a_key_leaves_an_earlier_overlapping_one(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        gate = anyio.Event()
        failures: list[BaseException] = []

        async def release_failing() -> None:
            with pytest.raises(_DiskFull) as raised:
                await manager.release({"loss": FakeValueReference(error=_DiskFull("disk full"))}, 1)
            failures.append(raised.value)

        async with anyio.create_task_group() as group:
            group.start_soon(
                manager.release, {"loss": FakeValueReference(0.25, gate=gate, delay=0)}, 1
            )
            await anyio.wait_all_tasks_blocked()
            group.start_soon(release_failing)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        assert len(failures) == 1
        await holds(subject, {1: {"loss": 0.25}})

    # Concurrency and cancellation

    async def test_concurrent_releases_of_different_keys_all_land(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        count = 40
        str_keys = [f"s{key}" for key in range(count)] if subject.capabilities.str_keys else []
        async with anyio.create_task_group() as group:
            for key in range(count):
                value = {"round": FakeValueReference(key, delay=(key * 7) % 5), "half": key / 2}
                group.start_soon(manager.release, value, key)
            for index, key in enumerate(str_keys):
                group.start_soon(
                    manager.release, {"index": FakeValueReference(index, delay=index % 3)}, key
                )
        expected: dict[ReleaseKey, Any] = {
            key: {"round": key, "half": key / 2} for key in range(count)
        }
        expected.update({key: {"index": index} for index, key in enumerate(str_keys)})
        await holds(subject, expected)

    async def test_a_cancelled_release_leaves_the_whole_value_or_none_of_it(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 0.0, "round": 0}, 0)
        for key in range(1, 16):  # cancelled after 0, 1, ... scheduling points
            late = await call_cancelled_after(
                key - 1,
                lambda key=key: manager.release(
                    {"loss": FakeValueReference(key / 4, delay=2), "round": key}, key
                ),
            )
            assert_returned_within(self.cancel_grace, late, f"a release of key {key}")
        held = await held_by(subject)
        assert 0 in held
        assert set(held) <= set(range(16))
        await holds(subject, {key: {"loss": key / 4, "round": key} for key in held})

    async def test_a_release_cancelled_in_flight_returns_within_the_grace_and_changes_nothing_later(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 0.0, "round": 0}, 0)
        value = {"loss": 0.5, "accuracy": 0.75, "round": 1}
        with anyio.move_on_after(CANCEL_AFTER_S) as scope:
            await manager.release(value, 1)
        late = anyio.current_time() - scope.deadline  # < 0: it returned before its cancellation
        assert_returned_within(self.cancel_grace, max(0.0, late), "a release of key 1")
        held = await held_by(subject)
        expected = {0: {"loss": 0.0, "round": 0}} | ({1: value} if 1 in held else {})
        await holds(subject, expected)
        if late >= 0:
            await anyio.sleep(self.cancel_grace)  # what it left running, if anything, lands
            assert comparable(await held_by(subject)) == comparable(held), (
                "what the storage holds changed after a cancelled release returned"
            )
