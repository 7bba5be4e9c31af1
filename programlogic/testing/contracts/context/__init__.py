"""The contract of :class:`~programlogic.context.FederatedContext`, as tests a backend runs.

Subclass :class:`FederatedContextContract` in a test file, name the subclass ``Test...``
and override its ``make_context`` fixture to return a callable that builds a new,
not yet entered context of yours::

    import pytest

    from programlogic.testing.contracts import FederatedContextContract

    class TestMyContext(FederatedContextContract):
        @pytest.fixture
        def make_context(self):
            return lambda: MyContext(workers=2)

Some tests build two contexts at once (nesting, two programs in one event loop). The
client work and server steps of the suite are module-level functions of this package,
so a backend that runs work in other processes can import them there (Ray: register
this package, which covers its modules, with ``ray.cloudpickle.register_pickle_by_value``
if the workers cannot import it). They coordinate through files in the test's
``tmp_path``, so the suite works whether client work runs on threads of this process or
on other processes of this machine; a backend whose work runs on other machines needs a
shared ``tmp_path``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from programlogic.context import FederatedContext
from programlogic.testing.contracts._base import Contract
from programlogic.testing.contracts.context._background import BackgroundWorkTests
from programlogic.testing.contracts.context._clients import ClientWorkTests
from programlogic.testing.contracts.context._current import CurrentContextTests
from programlogic.testing.contracts.context._server import ServerStepTests
from programlogic.testing.contracts.context._work import WAIT_LIMIT_S as WAIT_LIMIT_S
from programlogic.testing.contracts.context._work import WORK_S as WORK_S

__all__ = ["FederatedContextContract"]


# pytest runs the tests of the last base first: current context, server, clients, background.
class FederatedContextContract(
    BackgroundWorkTests, ClientWorkTests, ServerStepTests, CurrentContextTests, Contract
):
    """The promises every :class:`~programlogic.context.FederatedContext` keeps.

    Override the ``make_context`` fixture: a zero-argument callable returning a new,
    not yet entered context. Set ``streams_aggregation = False`` if the context keeps
    the base class's ``aggregate_clients``, which folds the results once every client
    has finished instead of as they arrive. To leave out a test that cannot apply to
    your backend, set its name to ``None`` in your subclass, and say why there.

    Beyond the base class's docstring, the suite holds a context to habits of the
    library's backends: ``run`` and ``map_clients`` on a context that is not entered
    raise ``RuntimeError`` saying it is "not entered"; an invalid ``group_size`` is a
    ``ValueError`` naming it; a ``ClientError`` keeps the client's error as its
    ``__cause__`` even when it comes from another process; and a cancelled call
    returns only once the client work it started has finished or been interrupted
    (work cut short runs its ``finally`` clauses, or its process is gone).

    Every test runs beside the loop watchdog of
    :class:`~programlogic.testing.contracts.Contract`: a context runs work off the event
    loop, and the suite fails a test during which the loop stalled longer than
    ``loop_stall_limit`` (0.25 s).
    """

    streams_aggregation: bool = True
    """Whether ``aggregate_clients`` folds each result as soon as every earlier one is in."""

    @pytest.fixture
    def make_context(self) -> Callable[[], FederatedContext]:
        """A callable building a new, not yet entered context (override this fixture)."""
        pytest.fail(
            f"{type(self).__name__} must override the make_context fixture: return a "
            "zero-argument callable that builds a new, not yet entered context"
        )
