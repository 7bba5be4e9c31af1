"""LocalContext kept to the FederatedContext contract, under asyncio and trio."""

from collections.abc import Callable

import pytest

from programlogic import LocalContext
from programlogic.testing.contracts import FederatedContextContract


class TestLocalContext(FederatedContextContract):
    @pytest.fixture
    def make_context(self) -> Callable[[], LocalContext]:
        return lambda: LocalContext(max_workers=2)


class TestLocalContextOfOneWorker(FederatedContextContract):
    @pytest.fixture
    def make_context(self) -> Callable[[], LocalContext]:
        return lambda: LocalContext(max_workers=1)
