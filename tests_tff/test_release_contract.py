"""TFF's release managers, adapted with ReleaseManagerFromTFF, held to the contract suite.

Both backends: the adapter runs each TFF release on an event loop of its own in a
worker thread, so it promises to work under trio as well as asyncio.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import tensorflow_federated as tff

from programlogic.contexts.tff import ReleaseManagerFromTFF
from programlogic.testing.contracts import Capabilities, ReleaseManagerContract, ReleaseSubject


def _as_tff_holds(value: Any) -> Any:
    """What TFF's memory manager holds: the adapter hands it dataclasses as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {name: _as_tff_holds(child) for name, child in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_as_tff_holds(child) for child in value))
    if isinstance(value, list | tuple):
        return type(value)(_as_tff_holds(child) for child in value)
    return value


class TestTFFMemoryReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        memory = tff.program.MemoryReleaseManager()
        return ReleaseSubject(
            ReleaseManagerFromTFF(memory),
            lambda: dict(memory.values()),
            Capabilities(normalize=_as_tff_holds),
        )
