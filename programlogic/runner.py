"""Running a program from synchronous code, notebooks included.

``programlogic.run`` is the one place the library starts an event loop. Everywhere else
programs are coroutines that callers await in the loop they already have.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, Literal, TypeVar

import anyio
import anyio.from_thread
import sniffio

from managers.validation import check_choice

__all__ = ["run"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_BACKENDS = ("asyncio", "trio")


def run(program: Coroutine[Any, Any, T], *, backend: Literal["asyncio", "trio"] = "asyncio") -> T:
    """Run the coroutine ``program`` to completion and return its result.

    Call it from synchronous code. Where no event loop runs in the calling thread (a
    script), the program runs in a new event loop of ``backend`` in this thread. Where one
    already runs (a Jupyter notebook cell, or sync code called from async code), the
    program runs in a new event loop on a thread of its own while this thread waits, so
    nothing needs patching (no ``nest_asyncio``); inside a notebook, ``await program``
    in a cell works as well.

    A ``KeyboardInterrupt`` (Ctrl-C, a notebook's interrupt) cancels the program and
    waits until its cancellation is done (open managers closed, the checkpoints saved so
    far intact) before it is raised again here. While the main thread waits for a program
    on its own thread, Ctrl-C raises ``KeyboardInterrupt`` there even if the running loop
    installed a SIGINT handler of its own (unless SIGINT is ignored). Exceptions of the
    program propagate.

    Raises:
        TypeError: ``program`` is not a coroutine (pass ``main()``, not ``main``).
        ValueError: ``backend`` is neither ``"asyncio"`` nor ``"trio"``.
    """
    if not inspect.iscoroutine(program):
        hint = " (call it: pass main(), not main)" if inspect.iscoroutinefunction(program) else ""
        raise TypeError(f"program must be a coroutine, got {type(program).__name__}{hint}")
    try:
        check_choice("backend", backend, _BACKENDS)
    except (TypeError, ValueError):
        program.close()
        raise
    if not _loop_running():
        return anyio.run(_await, program, backend=backend)
    logger.debug("an event loop runs in this thread; running the program on a thread of its own")
    with _interruptible(), anyio.from_thread.start_blocking_portal(backend) as portal:
        future = portal.start_task_soon(_await, program)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise  # leaving the portal waits for the cancelled program to finish


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` in the main thread while it waits here.

    The running loop's own SIGINT handler (``asyncio.run`` installs one that cancels
    its main task) cannot act while this thread blocks, so the default handler stands
    in for the wait. A SIGINT that is ignored stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, signal.default_int_handler):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _loop_running() -> bool:
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True


async def _await(program: Coroutine[Any, Any, T]) -> T:
    return await program
