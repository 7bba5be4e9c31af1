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


@pytest.mark.parametrize(
    ("module", "former", "name"),
    [
        (tff_backend, "TFFDataSource", "FederatedDataSourceFromTFF"),
        (tff_backend, "TFFReleaseManager", "ReleaseManagerFromTFF"),
        (data, "TFFDataSource", "FederatedDataSourceFromTFF"),
        (release, "TFFReleaseManager", "ReleaseManagerFromTFF"),
    ],
)
async def test_a_former_name_is_gone(module: object, former: str, name: str) -> None:
    assert getattr(module, name) is not None
    assert not hasattr(module, former), f"{former} is a second name of {name}"
    assert former not in module.__all__


async def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'TFFSource'"):
        _ = tff_backend.TFFSource
