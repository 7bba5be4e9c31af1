"""Tests of the release suite: closing a manager, and restarting over its storage."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from programlogic.testing.contracts.release._support import ReleaseSubject, holds, reopened

__all__ = ["ClosingTests"]


class ClosingTests:
    """What closing a manager, however it happens, and a restart over its storage keep."""

    # Closing

    async def test_async_with_returns_the_manager_and_propagates_errors(
        self, subject: ReleaseSubject
    ) -> None:
        with pytest.raises(RuntimeError, match="inside"):
            async with subject.manager as entered:
                assert entered is subject.manager
                await entered.release({"loss": 0.5}, 1)
                raise RuntimeError("inside")
        await holds(subject, {1: {"loss": 0.5}})

    async def test_aclose_may_be_called_twice(self, subject: ReleaseSubject) -> None:
        await subject.manager.release({"loss": 0.5}, 1)
        await subject.manager.aclose()
        await subject.manager.aclose()
        await holds(subject, {1: {"loss": 0.5}})

    async def test_leaving_on_cancellation_closes_the_files(
        self, subject: ReleaseSubject, tmp_path: Path
    ) -> None:
        if not _can_list_open_files():
            pytest.skip("needs Linux's /proc/self/fd")
        with anyio.CancelScope() as scope:
            async with subject.manager as manager:
                await manager.release({"loss": 0.5}, 1)
                scope.cancel()
                await anyio.sleep_forever()
        assert scope.cancelled_caught
        assert _open_files_under(tmp_path) == []
        await holds(subject, {1: {"loss": 0.5}})

    # Restarts

    async def test_a_restarted_manager_replaying_keys_holds_each_key_once(
        self, subject: ReleaseSubject
    ) -> None:
        if subject.reopen is None:
            pytest.skip("the storage does not outlive its manager")
        async with subject.manager as manager:
            for key in (1, 2, 3):
                await manager.release({"loss": float(key), "round": key}, key)
        async with reopened(subject) as restarted:  # resumed at round 2, as after a crash
            for key in (2, 3, 4):
                await restarted.release({"loss": key + 0.5, "round": key}, key)
        await holds(
            subject,
            {
                1: {"loss": 1.0, "round": 1},
                2: {"loss": 2.5, "round": 2},
                3: {"loss": 3.5, "round": 3},
                4: {"loss": 4.5, "round": 4},
            },
        )


def _can_list_open_files() -> bool:
    return Path("/proc/self/fd").is_dir()


def _open_files_under(directory: Path) -> list[str]:
    """The files under ``directory`` this process holds open (Linux's /proc/self/fd)."""
    held = []
    for descriptor in Path("/proc/self/fd").iterdir():
        try:
            target = descriptor.readlink()
        except OSError:
            continue  # closed since the listing
        if target.is_relative_to(directory):
            held.append(str(target))
    return held
