"""The contract suite of release managers: idempotency by key, errors, concurrency, closing.

Subclass :class:`ReleaseManagerContract` in a test file of yours and override its
``subject`` fixture. A subject is the manager under test, a way to read back what its
storage holds, and what that storage can hold::

    import pytest

    from programlogic.testing.contracts import Capabilities, ReleaseManagerContract, ReleaseSubject


    class TestMySink(ReleaseManagerContract):
        @pytest.fixture
        def subject(self, tmp_path):
            path = tmp_path / "metrics.db"
            return ReleaseSubject(
                manager=MySink(path),
                read_back=lambda: read_my_sink(path),  # {key: value}
                capabilities=Capabilities(arrays=False),
                reopen=lambda: MySink(path),
            )

Every test of the suite then runs against your manager under asyncio and trio.

Beyond keys, values and errors, the suite checks two promises of
:class:`~managers.ReleaseManager` that hold for every call:

- **The event loop stays free.** A watchdog task runs beside every test and fails it
  when the event loop stalls longer than ``loop_stall_limit`` (0.25 s): a release
  that writes, encodes or sleeps on the event loop instead of in a worker thread.
  ``read_back`` and ``reopen`` are the suite's own steps and are not counted.
- **A cancelled release returns promptly and leaves all of its effect or none.**
  Releases are cancelled at each of their first scheduling points and once 0.1 s after
  they began; each must return within ``cancel_grace`` (0.5 s) of its cancellation,
  leave its key holding what it held before or the whole new value, and change nothing
  once it returned (no shielded or abandoned write lands later).

A manager that offers ``prepare_release`` (write batching, see :mod:`managers.writes`)
is also checked through it: a prepared release writes nothing until a
:class:`~managers.WriteBatch` makes its write, then holds what ``release`` would; a
dropped one leaves the other keys, and the manager goes on.

Set ``loop_stall_limit`` or ``cancel_grace`` in your subclass to change a bound
(``loop_stall_limit = None`` turns the watchdog off); say why there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from managers.release.base import ReleaseManager
from programlogic.testing.contracts._base import Contract
from programlogic.testing.contracts.release._closing import ClosingTests
from programlogic.testing.contracts.release._failures import FailureTests
from programlogic.testing.contracts.release._keys import KeyTests
from programlogic.testing.contracts.release._prepared import PreparedWriteTests
from programlogic.testing.contracts.release._support import Capabilities, ReleaseSubject
from programlogic.testing.contracts.release._support import ReadBack as ReadBack
from programlogic.testing.contracts.release._values import ValueTests

__all__ = ["Capabilities", "ReleaseManagerContract", "ReleaseSubject"]


# pytest runs the tests of the last base first: values, keys, failures, closing, prepared.
class ReleaseManagerContract(
    PreparedWriteTests, ClosingTests, FailureTests, KeyTests, ValueTests, Contract
):
    """The promises every :class:`~managers.ReleaseManager` keeps.

    Override :meth:`subject` to return a new :class:`ReleaseSubject` (it may be a
    generator fixture, to clean up after the test). The suite enters the manager with
    ``async with`` (or calls ``aclose``) itself. Values released are numbers and
    structures of numbers; :attr:`Capabilities.normalize` turns each into what
    ``read_back`` shows for it. Tests are named after the promise they check; one that
    your manager cannot keep can be overridden in your subclass, marked
    ``pytest.mark.xfail(strict=True, reason=...)``, with the reason.
    """

    loop_stall_limit: float | None = 0.25
    """The longest the event loop may stall while a test runs, in seconds (``None``:
    not watched); see :mod:`programlogic.testing.contracts._base`."""

    cancel_grace: float = 0.5
    """How soon a cancelled release must return after its cancellation, in seconds."""

    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        """The manager under test and how to read it back; override it in your subclass."""
        raise NotImplementedError(f"{type(self).__name__} must override the subject fixture")

    @pytest.fixture
    async def manager(self, subject: ReleaseSubject) -> AsyncIterator[ReleaseManager]:
        """The subject's manager, open for the test and closed after it."""
        async with subject.manager as entered:
            yield entered
