"""RayContext kept to the FederatedContext contract, on a local two-node Ray cluster.

Asyncio only, as the other tests that start Ray: each test enters a new RayContext
(a pool of two actors) on one cluster started for the module.
"""

from collections.abc import Callable

import pytest

ray = pytest.importorskip("ray")

import programlogic.testing.contracts.context as context_contract  # noqa: E402
from programlogic.contexts.ray import RayContext  # noqa: E402
from programlogic.testing.contracts import FederatedContextContract  # noqa: E402

# The workers run the suite's client work by value, whichever programlogic they import.
ray.cloudpickle.register_pickle_by_value(context_contract)


class TestRayContext(FederatedContextContract):
    # RayContext connects in its session's thread, but the process's first ray.init
    # holds the GIL while Ray's core worker starts (0.4-0.55 s here, seen with
    # faulthandler's dumps): the event loop waits for it once. Later calls stall it
    # less than 0.1 s.
    loop_stall_limit = 1.0

    @pytest.fixture(params=["asyncio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        return request.param

    @pytest.fixture
    def make_context(self, cluster) -> Callable[[], RayContext]:
        return lambda: RayContext(cluster.address, max_workers=2)

    # The base class's own code, which RayContext inherits unchanged: LocalContext's
    # run of the suite covers it, and each Ray test costs a pool of actors.
    test_a_context_cannot_be_entered_twice_at_once = None
    test_leaving_the_context_cancels_its_unfinished_background_work = None
    test_a_background_failure_nobody_collected_is_raised_on_leaving = None
