"""The suite's rule for backends: tests that touch concurrency run twice, others once."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()

TESTS = """
import anyio
import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
async def started():
    yield 1


@pytest.fixture
def plain_value():
    return 2


async def test_sleeps():
    await anyio.sleep(0)


async def test_enters_a_task_group():
    async with anyio.create_task_group():
        pass


async def test_computes():
    assert 1 + 1 == 2


async def test_computes_with_a_plain_fixture(plain_value):
    assert plain_value == 2


async def test_computes_with_an_async_fixture(started):
    assert started == 1


async def test_names_its_backend(anyio_backend):
    assert anyio_backend in ("asyncio", "trio")


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_chooses_its_backend():
    assert True


class TestInAClass:
    async def test_computes_in_a_class(self):
        assert True

    async def test_sleeps_in_a_class(self):
        await anyio.sleep(0)
"""


def collected(pytester: pytest.Pytester, tests: str) -> list[str]:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_backends=tests)
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    return sorted(line.split("::", 1)[1] for line in result.outlines if "::" in line)


async def test_a_test_runs_under_both_backends_only_when_it_touches_concurrency(
    pytester: pytest.Pytester,
) -> None:
    assert collected(pytester, TESTS) == [
        "TestInAClass::test_computes_in_a_class[asyncio]",
        "TestInAClass::test_sleeps_in_a_class[asyncio]",
        "TestInAClass::test_sleeps_in_a_class[trio]",
        "test_chooses_its_backend[trio]",
        "test_computes[asyncio]",
        "test_computes_with_a_plain_fixture[asyncio]",
        "test_computes_with_an_async_fixture[asyncio]",
        "test_computes_with_an_async_fixture[trio]",
        "test_enters_a_task_group[asyncio]",
        "test_enters_a_task_group[trio]",
        "test_names_its_backend[asyncio]",
        "test_names_its_backend[trio]",
        "test_sleeps[asyncio]",
        "test_sleeps[trio]",
    ]


async def test_a_plain_test_function_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "every test must be an async def" in result.stderr.str()
    assert "test_plain.py::test_plain" in result.stderr.str()
