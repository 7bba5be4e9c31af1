"""The contract suite of program-state managers: versioning, retention, round-trips,
errors, cancellation, closing.

Subclass :class:`ProgramStateManagerContract` in a test file of yours and override its
``state_manager_factory`` fixture::

    import pytest

    from programlogic.testing.contracts import ProgramStateManagerContract


    class TestMyStateManager(ProgramStateManagerContract):
        @pytest.fixture
        def state_manager_factory(self, tmp_path):
            return lambda: MyStateManager(tmp_path / "state")

Every test of the suite then runs against your manager under asyncio and trio. A
manager that detects damaged versions (a checksum) also overrides ``state_damage`` to
return a :class:`StateDamage`, and the suite checks what ``load_latest`` does with them.

Beyond round-trips and versioning, the suite checks three promises of
:class:`~managers.ProgramStateManager` that hold for every call:

- **The event loop stays free.** A watchdog task runs beside every test and fails it
  when the event loop stalls longer than ``loop_stall_limit`` (0.25 s): a call that
  writes, fsyncs or encodes on the event loop instead of in a worker thread.
- **A cancelled call returns promptly and leaves all of its effect or none.** Saves
  are cancelled at each of their first scheduling points and once 0.1 s after they
  began; each must return within ``cancel_grace`` (0.5 s) of its cancellation, leave
  its version saved completely (with retention applied) or not at all, and change
  nothing once it returned.
- **Retention is declared.** The versions listed after each save are exactly those
  the manager's ``retention`` keeps (every version when it is ``None``), and the
  version just saved is never removed. A manager that deletes old versions declares
  how with a :class:`~managers.Retention`; the suite then expects that policy in every
  test, with no override.

A manager that offers ``prepare_save`` (write batching, see :mod:`managers.writes`) is
also checked through it: the version is saved once a :class:`~managers.WriteBatch`
made the write, a dropped one is never saved, and a save it refuses fails the flush.

Set ``loop_stall_limit`` or ``cancel_grace`` in your subclass to change a bound
(``loop_stall_limit = None`` turns the watchdog off); say why there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from managers.state.base import ProgramStateManager
from programlogic.testing.contracts._base import Contract
from programlogic.testing.contracts.state._damage import DamageTests
from programlogic.testing.contracts.state._lifecycle import LifecycleTests
from programlogic.testing.contracts.state._prepared import PreparedSaveTests
from programlogic.testing.contracts.state._round_trips import RoundTripTests
from programlogic.testing.contracts.state._support import StateDamage, StateManagerFactory
from programlogic.testing.contracts.state._versions import VersionTests

__all__ = ["ProgramStateManagerContract", "StateDamage"]


# pytest runs the tests of the last base first: round-trips, versions, lifecycle, damage,
# prepared saves.
class ProgramStateManagerContract(
    PreparedSaveTests, DamageTests, LifecycleTests, VersionTests, RoundTripTests, Contract
):
    """The promises every :class:`~managers.ProgramStateManager` keeps.

    Override :meth:`state_manager_factory` to return a zero-argument callable that makes
    a manager; the first one it makes in a test holds no version (for a manager on
    disk: make each on one directory under the test's ``tmp_path``). The suite closes
    each manager it makes before it makes the next. Set :attr:`persistent` when later
    managers see what earlier ones saved, as a restarted program's does. Tests are named
    after the promise they check; one that your manager cannot keep can be overridden
    in your subclass, marked ``pytest.mark.xfail(strict=True, reason=...)``.

    Override :meth:`state_damage` when your manager detects damaged versions: the suite
    then checks that ``load_latest`` skips them for the newest version that loads, and
    that it raises :class:`~managers.exceptions.AllVersionsDamagedError` listing them
    when none loads (and again when asked again), or starts over when told to.
    """

    persistent: bool = False
    """Whether a manager the factory makes sees the versions that earlier ones saved."""

    loop_stall_limit: float | None = 0.25
    """The longest the event loop may stall while a test runs, in seconds (``None``:
    not watched); see :mod:`programlogic.testing.contracts._base`."""

    cancel_grace: float = 0.5
    """How soon a cancelled call must return after its cancellation, in seconds."""

    @pytest.fixture
    def state_manager_factory(self) -> StateManagerFactory:
        """A callable making a new, empty manager; override it in your subclass."""
        raise NotImplementedError(
            f"{type(self).__name__} must override the state_manager_factory fixture"
        )

    @pytest.fixture
    def state_damage(self) -> StateDamage | None:
        """How the suite damages stored versions; ``None`` (the default) skips the
        damage tests."""
        return None

    @pytest.fixture
    async def manager(
        self, state_manager_factory: StateManagerFactory
    ) -> AsyncIterator[ProgramStateManager]:
        """A new manager, open for the test and closed after it."""
        async with state_manager_factory() as created:
            yield created
