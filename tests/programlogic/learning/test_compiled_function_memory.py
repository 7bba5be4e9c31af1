"""A compiled function hands the memory its compilation freed back to the system."""

import numpy as np
import pytest

from programlogic.learning import _tensorflow

pytestmark = pytest.mark.anyio


async def test_a_new_shape_compiles_then_trims_and_a_seen_shape_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims = []
    monkeypatch.setattr(_tensorflow, "release_freed_memory", lambda: trims.append(1))
    double = _tensorflow.CompiledFunction(lambda x: x * 2.0)
    assert np.array_equal(double(np.ones(3, np.float32)), np.full(3, 2.0, np.float32))
    assert len(trims) == 1
    double(np.zeros(3, np.float32))
    assert len(trims) == 1
    double(np.ones(4, np.float32))
    assert len(trims) == 2


async def test_releasing_freed_memory_is_safe_to_call_any_time() -> None:
    _tensorflow.release_freed_memory()
    _tensorflow.release_freed_memory()
