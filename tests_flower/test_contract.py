"""FlowerContext keeps the federated-context contract on Flower's own machinery.

The nodes are Flower's: registered in its in-memory link state, served by threads that
run our ClientApp (:class:`~programlogic.contexts.flower.InProcessFederation`), behind
its ``InMemoryGrid``. The suite's loaders travel as importable references.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from programlogic.contexts.flower import (
    FlowerContext,
    InProcessFederation,
    make_client_app,
)
from programlogic.testing.contracts import FederatedContextContract

pytestmark = pytest.mark.anyio

CLIENTS = [f"c{i}" for i in range(10)] + ["lost"]


class TestFlowerContext(FederatedContextContract):
    @pytest.fixture
    def make_context(self) -> Iterator[Callable[[], FlowerContext]]:
        with InProcessFederation(make_client_app(), CLIENTS) as federation:
            yield lambda: FlowerContext(federation.grid, max_in_flight=3, poll_interval=0.01)

    # A client's data lives on its own node, so a group function gets one client at a
    # time on Flower: a failing group is the failing client alone (tested in test_context.py).
    test_a_failing_group_fails_the_call_with_client_error_naming_the_group = None
