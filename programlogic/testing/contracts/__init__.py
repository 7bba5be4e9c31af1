"""Contract suites: the promises of every abstract base, as tests users can run.

Each suite is a class whose tests are named after the promise they check. To hold your
own implementation to the same promises as the library's, subclass the suite in a test
file of yours, name the subclass ``Test...`` so that pytest collects it, and override
its factory fixture::

    from programlogic.testing.contracts import ReleaseManagerContract

    class TestMySink(ReleaseManagerContract):
        @pytest.fixture
        def subject(self, tmp_path):
            ...

Every test runs under asyncio and trio (``pip install 'programlogic[testing]'`` brings
pytest and trio; anyio's pytest plugin runs the coroutines). The library's own
implementations are the suites' first users: see ``tests/contracts/``.

Beyond each base's own promises, the suites check these, which hold for every call:

- **The event loop stays free**: blocking I/O and CPU work go to worker threads. Every
  test runs beside a watchdog task that fails it when the event loop stalls longer
  than the suite's ``loop_stall_limit``: 0.25 s, generous against a loaded machine's
  noise and fatal to a blocking call; 1.0 s for learning processes, whose graphs are
  traced in worker threads that hold the GIL; not watched for data sources, whose
  calls are synchronous. The suite's own steps (reading the storage back, damaging it,
  building a manager) and garbage collections are not counted.
- **A cancelled call returns promptly and leaves all of its effect or none** (release
  and program-state suites): it returns within ``cancel_grace`` (0.5 s) of its
  cancellation, a release's key holds its old value or the whole new one and a save's
  version is saved completely or not at all, and nothing changes once it returned.
  Calls are cancelled at each of their first scheduling points, and once 0.1 s in.
- **Retention is declared** (program-state suite): the versions listed after each save
  are exactly those the manager's ``retention`` keeps (every one when it is ``None``),
  and the version just saved is never removed.

Set either bound as a class attribute of your subclass (``loop_stall_limit = None``
turns the watchdog off), and say why there: a first call that imports a heavy module,
or a library that holds the GIL in its worker thread, may stall the loop for a while.
"""

from pkgutil import iter_modules

import pytest

# Every suite's asserts explain their failures as a test module's do (a suite that is a
# package is registered by its name, which covers the modules in it).
pytest.register_assert_rewrite(*(f"{__name__}.{module.name}" for module in iter_modules(__path__)))

from programlogic.testing.contracts._base import Contract  # noqa: E402
from programlogic.testing.contracts.context import FederatedContextContract  # noqa: E402
from programlogic.testing.contracts.data import FederatedDataSourceContract  # noqa: E402
from programlogic.testing.contracts.process import LearningProcessContract  # noqa: E402
from programlogic.testing.contracts.release import (  # noqa: E402
    Capabilities,
    ReleaseManagerContract,
    ReleaseSubject,
)
from programlogic.testing.contracts.state import (  # noqa: E402
    ProgramStateManagerContract,
    StateDamage,
)
from programlogic.testing.contracts.stopping import StoppingPolicyContract  # noqa: E402

__all__ = [
    "Capabilities",
    "Contract",
    "FederatedContextContract",
    "FederatedDataSourceContract",
    "LearningProcessContract",
    "ProgramStateManagerContract",
    "ReleaseManagerContract",
    "ReleaseSubject",
    "StateDamage",
    "StoppingPolicyContract",
]
