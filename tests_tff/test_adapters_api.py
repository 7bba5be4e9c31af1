"""The data and release adapters of programlogic.contexts.tff are exported and documented."""

from __future__ import annotations

import inspect

import pytest
import tensorflow_federated as tff

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
async def test_a_former_name_is_the_renamed_class_and_warns(
    module: object, former: str, name: str
) -> None:
    with pytest.warns(DeprecationWarning, match=f"{former} is deprecated: use .*{name}"):
        value = getattr(module, former)
    assert value is getattr(module, name)
    assert former not in module.__all__


async def test_a_program_written_with_the_former_names_still_releases() -> None:
    with pytest.warns(DeprecationWarning, match="ReleaseManagerFromTFF"):
        from programlogic.contexts.tff import TFFReleaseManager
    theirs = tff.program.MemoryReleaseManager()
    await TFFReleaseManager(theirs).release({"loss": 0.5}, 3)
    assert list(theirs.values()) == [3]


async def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'TFFSource'"):
        _ = tff_backend.TFFSource
