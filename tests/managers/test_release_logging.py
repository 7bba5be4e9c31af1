"""LoggingReleaseManager: what it logs, where, and at which level."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from managers.release.logging import LoggingReleaseManager
from managers.testing import FakeValueReference

pytestmark = pytest.mark.anyio


def logged(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str]]:
    return [(record.name, record.levelno, record.getMessage()) for record in caplog.records]


async def test_logs_key_and_materialized_value(caplog):
    caplog.set_level(logging.INFO, logger="managers.release.logging")
    manager = LoggingReleaseManager()
    await manager.release({"loss": FakeValueReference(0.5), "round": 3}, 3)
    await manager.release(FakeValueReference("model"), "final")
    assert logged(caplog) == [
        ("managers.release.logging", logging.INFO, "released key 3: {'loss': 0.5, 'round': 3}"),
        ("managers.release.logging", logging.INFO, "released key 'final': 'model'"),
    ]


async def test_every_release_is_logged_even_of_the_same_key(caplog):
    caplog.set_level(logging.INFO, logger="managers.release.logging")
    manager = LoggingReleaseManager()
    for _ in range(3):
        await manager.release(1.0, 1)
    assert [message for _, _, message in logged(caplog)] == ["released key 1: 1.0"] * 3


async def test_custom_logger_and_level(caplog):
    caplog.set_level(logging.DEBUG, logger="my.metrics")
    manager = LoggingReleaseManager(logging.getLogger("my.metrics"), level=logging.DEBUG)
    await manager.release({"weights": np.arange(2)}, 1)
    assert logged(caplog) == [
        ("my.metrics", logging.DEBUG, "released key 1: {'weights': array([0, 1])}")
    ]


async def test_nothing_is_logged_below_the_logger_level(caplog):
    caplog.set_level(logging.WARNING, logger="managers.release.logging")
    await LoggingReleaseManager().release(1.0, 1)
    assert caplog.records == []


async def test_failing_reference_raises_and_logs_nothing(caplog):
    caplog.set_level(logging.INFO, logger="managers.release.logging")

    with pytest.raises(OSError, match="no value"):
        await LoggingReleaseManager().release(
            {"loss": FakeValueReference(error=OSError("no value"))}, 1
        )
    assert caplog.records == []


async def test_invalid_key_raises(caplog):
    caplog.set_level(logging.INFO, logger="managers.release.logging")
    with pytest.raises(TypeError, match="release key must be an int or a str, got bool"):
        await LoggingReleaseManager().release(1.0, False)
    assert caplog.records == []


async def test_invalid_arguments_raise_type_error():
    message = r"logger must be a Logger or a LoggerAdapter or None, got str 'root'"
    with pytest.raises(TypeError, match=message):
        LoggingReleaseManager("root")
    with pytest.raises(TypeError, match=r"level must be an int >= 0, got str 'INFO'"):
        LoggingReleaseManager(level="INFO")
