"""Tests of the program-state suite: damaged versions, for managers that detect them."""

from __future__ import annotations

import pytest

from managers.exceptions import AllVersionsDamagedError
from managers.state.base import ProgramStateManager
from programlogic.testing.contracts.state._support import (
    StateDamage,
    damage_version,
    needs_damage,
    state_of,
)

__all__ = ["DamageTests"]


class DamageTests:
    """What ``load_latest`` does with damaged versions: skips them for the newest that
    loads, and refuses to start over when none loads unless told to."""

    async def test_load_latest_skips_damaged_versions_for_the_newest_that_loads(
        self, manager: ProgramStateManager, state_damage: StateDamage | None
    ) -> None:
        damage = needs_damage(state_damage)
        for version in range(4):
            await manager.save(state_of(version), version)
        for version in (3, 2):
            await damage_version(damage, manager, version)
        assert await manager.load_latest() == (state_of(1), 1)
        await manager.save(state_of(2), 2)  # the resumed program saves its next round
        assert await manager.load_latest() == (state_of(2), 2)

    async def test_load_latest_raises_listing_the_versions_when_none_loads(
        self, manager: ProgramStateManager, state_damage: StateDamage | None
    ) -> None:
        damage = needs_damage(state_damage)
        for version in range(3):
            await manager.save(state_of(version), version)
            await damage_version(damage, manager, version)
        for _ in range(2):  # the damaged versions stay: asking again raises again
            with pytest.raises(AllVersionsDamagedError) as raised:
                await manager.load_latest()
            assert raised.value.versions == [0, 1, 2]
            assert all(f"version {version}" in str(raised.value) for version in range(3))

    async def test_told_to_start_fresh_load_latest_starts_over_when_none_loads(
        self, state_damage: StateDamage | None
    ) -> None:
        damage = needs_damage(state_damage)
        async with damage.start_fresh() as manager:
            for version in range(2):
                await manager.save(state_of(version), version)
                await damage_version(damage, manager, version)
            assert await manager.load_latest() == (None, 0)
            await manager.save(state_of(0), 0)
            assert await manager.load_latest() == (state_of(0), 0)
