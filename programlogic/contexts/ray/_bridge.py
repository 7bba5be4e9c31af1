"""Ray's futures awaited on asyncio or trio, without blocking the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import sniffio

__all__ = ["await_future"]


async def await_future(future: concurrent.futures.Future[Any]) -> Any:
    """The result of ``future`` (a Ray object reference's ``future()``), once it is done."""
    if sniffio.current_async_library() == "asyncio":
        return await asyncio.wrap_future(future)
    import trio

    done = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def wake(_: Any) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:  # the run is over: nobody waits any more
            pass

    future.add_done_callback(wake)
    await done.wait()
    return future.result()
