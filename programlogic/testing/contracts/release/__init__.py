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
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from managers.release.base import ReleaseManager
from programlogic.testing.contracts._base import Contract
from programlogic.testing.contracts.release._closing import ClosingTests
from programlogic.testing.contracts.release._failures import FailureTests
from programlogic.testing.contracts.release._keys import KeyTests
from programlogic.testing.contracts.release._support import Capabilities, ReleaseSubject
from programlogic.testing.contracts.release._support import ReadBack as ReadBack
from programlogic.testing.contracts.release._values import ValueTests

__all__ = ["Capabilities", "ReleaseManagerContract", "ReleaseSubject"]


# pytest runs the tests of the last base first: values, keys, failures, closing.
class ReleaseManagerContract(ClosingTests, FailureTests, KeyTests, ValueTests, Contract):
    """The promises every :class:`~managers.ReleaseManager` keeps.

    Override :meth:`subject` to return a new :class:`ReleaseSubject` (it may be a
    generator fixture, to clean up after the test). The suite enters the manager with
    ``async with`` (or calls ``aclose``) itself. Values released are numbers and
    structures of numbers; :attr:`Capabilities.normalize` turns each into what
    ``read_back`` shows for it. Tests are named after the promise they check; one that
    your manager cannot keep can be overridden in your subclass, marked
    ``pytest.mark.xfail(strict=True, reason=...)``, with the reason.
    """

    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        """The manager under test and how to read it back; override it in your subclass."""
        raise NotImplementedError(f"{type(self).__name__} must override the subject fixture")

    @pytest.fixture
    async def manager(self, subject: ReleaseSubject) -> AsyncIterator[ReleaseManager]:
        """The subject's manager, open for the test and closed after it."""
        async with subject.manager as entered:
            yield entered
