"""Every test is a coroutine; those that touch concurrency run under asyncio and trio.

Test functions are coroutines, which anyio's plugin runs once per backend listed in
the ``anyio_backend`` fixture; collection fails on a plain test function. A test runs
under both backends when it awaits something (an ``await``, ``async with`` or
``async for`` anywhere in its body), asks for ``anyio_backend`` itself, or uses an async
fixture (directly or through other fixtures): then what it checks depends on the event
loop. A test that does none of these runs synchronous code only, which the backend
cannot change: it runs once, under asyncio. A test that parametrizes ``anyio_backend``
itself keeps its own list.
"""

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest_plugins = ["pytester"]  # tests/test_conftest_backends.py runs the rule on its own tests

BACKENDS = ["asyncio", "trio"]


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # A parametrize mark, added before pytest reads the marks, takes the place of the
    # fixture's own params.
    if "anyio_backend" not in metafunc.fixturenames or _parametrizes_backend(metafunc):
        return
    function = _inner_function(metafunc.function)
    if not inspect.iscoroutinefunction(function):
        return  # refused at collection below
    if (
        "anyio_backend" in inspect.signature(function).parameters
        or awaits(function)
        or _uses_async_fixtures(metafunc)
    ):
        return
    metafunc.definition.add_marker(pytest.mark.parametrize("anyio_backend", ["asyncio"]))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    plain = [
        item.nodeid
        for item in items
        if isinstance(item, pytest.Function)
        and not inspect.iscoroutinefunction(_inner_function(item.function))
    ]
    if plain:
        raise pytest.UsageError(
            "every test must be an async def (it runs under asyncio, and under trio too "
            "when it touches concurrency): " + ", ".join(plain)
        )


@functools.cache
def awaits(function: Callable[..., Any]) -> bool:
    """Whether ``function``'s source holds an ``await``, ``async with`` or ``async for``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return any(
        isinstance(node, ast.Await | ast.AsyncWith | ast.AsyncFor) for node in ast.walk(tree)
    )


def _inner_function(function: Callable[..., Any]) -> Callable[..., Any]:
    """The test's own function, under a hypothesis wrapper if there is one."""
    hypothesis = getattr(function, "hypothesis", None)
    return getattr(hypothesis, "inner_test", function)


def _parametrizes_backend(metafunc: pytest.Metafunc) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [name.strip() for name in names.split(",")]
        if "anyio_backend" in names:
            return True
    return False


def _uses_async_fixtures(metafunc: pytest.Metafunc) -> bool:
    for name in metafunc.fixturenames:
        for definition in metafunc._arg2fixturedefs.get(name, ()):
            function = definition.func
            if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
                return True
    return False


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local Ray cluster of two nodes of 1 CPU each, one per test module that uses it."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()
