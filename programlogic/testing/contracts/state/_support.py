"""What the tests of the program-state suite share: the manager factory, the optional
damage capability and the states they save."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from managers.state.base import ProgramStateManager

__all__ = ["StateDamage", "StateManagerFactory", "damage_version", "needs_damage", "state_of"]

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
    """Damage ``version`` of ``manager``'s storage as ``damage`` says."""
    done = damage.damage(manager, version)
    if inspect.isawaitable(done):
        await done


def state_of(round_number: int) -> dict[str, Any]:
    """The state a program saves after round ``round_number``."""
    return {
        "round": round_number,
        "weights": [float(round_number), float(round_number) + 0.5],
        "optimizer": {"lr": 0.1, "step": round_number},
        "name": f"round-{round_number}",
    }
