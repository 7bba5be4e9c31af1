"""programlogic.contexts.tff exports its public names, each with a docstring."""

from __future__ import annotations

import inspect

import pytest

import programlogic.contexts.tff as tff_backend
from programlogic.contexts.tff import context, process, structures

pytestmark = pytest.mark.anyio


async def test_every_public_name_is_exported_sorted_and_documented() -> None:
    assert tff_backend.__all__ == sorted(tff_backend.__all__)
    assert inspect.getdoc(tff_backend)
    for module in (context, process, structures):
        for name in module.__all__:
            assert name in tff_backend.__all__, f"{module.__name__}.{name} is not exported"
    for name in tff_backend.__all__:
        value = getattr(tff_backend, name)
        assert inspect.getdoc(value), f"{name} has no docstring"
        if inspect.isclass(value):
            for attribute, member in vars(value).items():
                if not attribute.startswith("_") and callable(member):
                    assert inspect.getdoc(member), f"{name}.{attribute} has no docstring"
