"""Every test of the suite runs under asyncio and under trio.

Test functions are coroutines, which anyio's plugin runs once per backend listed in
the ``anyio_backend`` fixture; collection fails on a plain test function, so no test
silently runs under one backend only.
"""

import inspect
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    plain = [
        item.nodeid
        for item in items
        if isinstance(item, pytest.Function) and not inspect.iscoroutinefunction(_inner(item))
    ]
    if plain:
        raise pytest.UsageError(
            "every test must be an async def so that it runs under asyncio and trio: "
            + ", ".join(plain)
        )


def _inner(item: pytest.Function) -> object:
    """The test's own function, under a hypothesis wrapper if there is one."""
    hypothesis = getattr(item.function, "hypothesis", None)
    return getattr(hypothesis, "inner_test", item.function)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local Ray cluster of two nodes of 1 CPU each, one per test module that uses it."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()
