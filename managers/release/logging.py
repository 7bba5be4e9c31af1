"""A release manager that logs every release."""

from __future__ import annotations

import logging
from typing import Any

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.validation import check_int, check_type
from managers.values import materialize

__all__ = ["LoggingReleaseManager"]


class LoggingReleaseManager(ReleaseManager):
    """Logs each release as ``released key %r: %r`` (the key and the materialized value).

    Records go to ``logger`` (by default the logger ``managers.release.logging``) at
    ``level`` (by default ``logging.INFO``); the value is formatted only when a handler
    takes the record. This is the one release manager that is not idempotent by key: it
    keeps nothing, so a key released again is logged again. The value is materialized
    even when the level is disabled, so a failing value reference fails the release
    whatever the logging configuration. Handlers run in the calling thread, as with any
    logging call; give slow handlers a ``logging.handlers.QueueHandler``.
    """

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.INFO) -> None:
        check_type("logger", logger, (logging.Logger, logging.LoggerAdapter), allow_none=True)
        check_int("level", level, minimum=0)
        self._logger = logger if logger is not None else logging.getLogger(__name__)
        self._level = level

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        plain = await materialize(value)
        self._logger.log(self._level, "released key %r: %r", key, plain)
