"""Fixtures of the Flower tests: run them in a venv with the `flower` extra (see .ci/run).

Async tests run under asyncio and trio, as in tests/.
"""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

# Flower and its dependencies warn about each other; the project's `filterwarnings =
# error` is for warnings of this project, which still fail a test.
THIRD_PARTY = r"(flwr|grpc|google|ray|tensorflow|keras|alembic|sqlalchemy)(\..*)?"


def pytest_configure(config: pytest.Config) -> None:
    for kind in ("DeprecationWarning", "PendingDeprecationWarning", "FutureWarning", "UserWarning"):
        config.addinivalue_line("filterwarnings", f"ignore::{kind}:{THIRD_PARTY}")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("flwr")
