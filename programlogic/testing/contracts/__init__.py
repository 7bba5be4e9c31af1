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
