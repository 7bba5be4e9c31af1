"""What the tests of the program-state suite share: the manager factory, the optional
damage capability, the states they save and the versions a retention keeps."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from managers.state.base import ProgramStateManager, Retention
from programlogic.testing.contracts._base import unwatched

__all__ = [
    "StateDamage",
    "StateManagerFactory",
    "damage_version",
    "kept_versions",
    "make",
    "needs_damage",
    "state_of",
]

StateManagerFactory = Callable[[], ProgramStateManager]


@dataclasses.dataclass(frozen=True)
class StateDamage:
    """How the suite damages the versions a manager stores: the capability of a manager
    that detects damaged versions (a checksum, as the file manager's), which the suite's
    damage tests need. A manager without it (memory) skips them."""

    damage: Callable[[ProgramStateManager, int], Any]
    """``damage(manager, version)`` damages the stored bytes of ``version``, saved by
    ``manager`` (which is open), so that it no longer loads; may return an awaitable."""
    start_fresh: StateManagerFactory
    """Makes a new, empty manager told to start fresh when every saved version is
    damaged (the file manager's ``on_all_damaged="start_fresh"``)."""


def needs_damage(damage: StateDamage | None) -> StateDamage:
    """``damage``; skips the test when the subject does not declare it."""
    if damage is None:
        pytest.skip("the manager does not declare StateDamage: it cannot be damaged")
    return damage


async def damage_version(damage: StateDamage, manager: ProgramStateManager, version: int) -> None:
    """Damage ``version`` of ``manager``'s storage as ``damage`` says (a step of the
    suite: the loop watchdog does not count it)."""
    with unwatched():
        done = damage.damage(manager, version)
        if inspect.isawaitable(done):
            await done


def make(factory: StateManagerFactory) -> ProgramStateManager:
    """A new manager from ``factory`` (building it is a step of the suite, synchronous
    by nature: the loop watchdog does not count it)."""
    with unwatched():
        return factory()


def kept_versions(
    retention: Retention | None, saved: Iterable[int], listed: Iterable[int] = ()
) -> list[int]:
    """The versions a manager of ``retention`` lists once it saved ``saved``, one after
    the other, when it listed ``listed`` before: each save adds its version and then
    retention keeps what :meth:`~managers.state.base.Retention.keeps` says (every
    version when ``retention`` is ``None``)."""
    versions = sorted(listed)
    for version in saved:
        versions.append(version)
        if retention is not None:
            versions = retention.keeps(versions)
    return versions


def state_of(round_number: int) -> dict[str, Any]:
    """The state a program saves after round ``round_number``."""
    return {
        "round": round_number,
        "weights": [float(round_number), float(round_number) + 0.5],
        "optimizer": {"lr": 0.1, "step": round_number},
        "name": f"round-{round_number}",
    }
