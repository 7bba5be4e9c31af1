"""The data and release adapters of programlogic.contexts.tff are exported and documented."""

from __future__ import annotations

import inspect

import pytest

import programlogic.contexts.tff as tff_backend
from programlogic.contexts.tff import data, release

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("module", [data, release])
async def test_every_public_name_is_exported_and_documented(module: object) -> None:
    assert inspect.getdoc(module)
    for name in module.__all__:
        assert name in tff_backend.__all__, f"{module.__name__}.{name} is not exported"
        value = getattr(tff_backend, name)
        assert inspect.getdoc(value), f"{name} has no docstring"
        if inspect.isclass(value):
            for attribute, member in vars(value).items():
                if not attribute.startswith("_") and (
                    callable(member) or isinstance(member, property)
                ):
                    assert inspect.getdoc(member), f"{name}.{attribute} has no docstring"
