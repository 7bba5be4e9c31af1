"""``AsyncClosing``: ``async with`` for anything that has ``aclose``."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncClosing"]


class AsyncClosing:
    """Makes an object with ``async aclose()`` an async context manager.

    ``async with thing:`` gives ``thing`` and calls ``aclose()`` on leaving, however the
    block ends. Subclasses implement ``aclose``; this default releases nothing.
    """

    async def aclose(self) -> None:
        """Release what the object holds; the default holds nothing."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
