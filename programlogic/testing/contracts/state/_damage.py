"""Tests of the program-state suite: damaged versions, for managers that detect them."""

from __future__ import annotations

import pytest

from managers.exceptions import AllVersionsDamagedError
from managers.state.base import ProgramStateManager
from programlogic.testing.contracts.state._support import (
    StateDamage,
    damage_version,
    kept_versions,
    make,
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
        kept = kept_versions(manager.retention, range(4))
        if len(kept) < 2:
            pytest.skip(f"retention {manager.retention} keeps no version to fall back to")
        *older, newest = kept
        damaged = [newest, *older[-1:]] if len(older) > 1 else [newest]
        for version in damaged:
            await damage_version(damage, manager, version)
        loads = max(set(kept) - set(damaged))
        assert await manager.load_latest() == (state_of(loads), loads)
        await manager.save(state_of(loads + 1), loads + 1)  # the resumed program's next round
        assert await manager.load_latest() == (state_of(loads + 1), loads + 1)

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
            kept = kept_versions(manager.retention, range(3))
            assert raised.value.versions == kept
            assert all(f"version {version}" in str(raised.value) for version in kept)

    async def test_told_to_start_fresh_load_latest_starts_over_when_none_loads(
        self, state_damage: StateDamage | None
    ) -> None:
        damage = needs_damage(state_damage)
        async with make(damage.start_fresh) as manager:
            for version in range(2):
                await manager.save(state_of(version), version)
                await damage_version(damage, manager, version)
            assert await manager.load_latest() == (None, 0)
            await manager.save(state_of(0), 0)
            assert await manager.load_latest() == (state_of(0), 0)
