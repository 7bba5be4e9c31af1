"""LocalContext and FakeContext kept to the FederatedContext contract, under asyncio and trio."""

import datetime
from collections.abc import Callable

import pytest

from programlogic import LocalContext
from programlogic.testing import DropClients, FailClient, FakeClock, FakeContext, SlowCall
from programlogic.testing.contracts import FederatedContextContract


class TestLocalContext(FederatedContextContract):
    @pytest.fixture
    def make_context(self) -> Callable[[], LocalContext]:
        return lambda: LocalContext(max_workers=2)


class TestLocalContextOfOneWorker(FederatedContextContract):
    @pytest.fixture
    def make_context(self) -> Callable[[], LocalContext]:
        return lambda: LocalContext(max_workers=1)


class TestFakeContext(FederatedContextContract):
    @pytest.fixture
    def make_context(self) -> Callable[[], FakeContext]:
        return FakeContext


class TestFakeContextOfTwoWorkersWithFaultsForOtherClients(FederatedContextContract):
    # Faults naming clients the suite never asks for, and time on a clock, change nothing.
    @pytest.fixture
    def make_context(self) -> Callable[[], FakeContext]:
        faults = [
            FailClient("nobody"),
            DropClients(["absent"]),
            SlowCall(datetime.timedelta(minutes=1)),
        ]
        return lambda: FakeContext(faults, clock=FakeClock(), max_workers=2)
