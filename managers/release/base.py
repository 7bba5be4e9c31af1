"""The abstract release manager: the contract every metrics and model sink fulfils."""

from __future__ import annotations

import abc
from typing import Any

from managers.closing import AsyncClosing

__all__ = ["ReleaseKey", "ReleaseManager", "check_key"]

ReleaseKey = int | str
"""A release key: an ``int`` (usually a round number) or a ``str`` (a named release)."""


class ReleaseManager(AsyncClosing, abc.ABC):
    """Publishes values (metrics, models) of a running program under keys.

    A program releases each round's metrics with ``key`` = round number and its final
    model with a ``str`` key such as ``final_training_checkpoint_round_100``. A manager
    decides where values go: memory, a log, files, TensorBoard, another manager.

    Contract for every implementation:

    - ``release(value, key)``: ``value`` is a structure (see :mod:`managers.structure`)
      whose leaves may be value references (see :mod:`managers.values`); the manager
      materializes what it needs. ``key`` is an ``int`` (not ``bool``) or a ``str``;
      anything else raises ``TypeError``.
    - Idempotent by key: releasing a key again replaces what that key held and leaves
      other keys alone, whatever order keys arrive in. A program that resumes after a
      crash releases its last round again, and forked evaluations finish out of order;
      neither may leave duplicates. An implementation that cannot honour this says so
      (the logging manager logs every release).
    - Errors are raised to the caller, never only logged. A release that raises or is
      cancelled leaves what other keys hold intact.
    - Concurrent calls on one instance are allowed unless the implementation says
      otherwise.
    - A call never blocks the event loop: blocking I/O and CPU-heavy work (encoding,
      writing, fsync) run in worker threads, so that the program's other tasks (the
      next round, an evaluation, a deadline) go on while a release is in flight.
    - A cancelled release returns promptly, within a short grace (the contract suite
      allows half a second), and leaves all of its effect or none: its key holds what
      it held before or the whole new value, never a part of it, and nothing the
      release started changes what is stored after it returned. It may finish a write
      already under way in a thread before returning; it never shields itself from
      cancellation to go on with a long call.
    - Implementations document what they write and where.

    Optional, for speed: ``async prepare_release(value, key)`` does what ``release``
    does up to its write and returns that write as a
    :class:`~managers.writes.PreparedWrite`, not made (or ``None`` when nothing is to be
    written), so that a caller makes several managers' writes in one worker-thread call
    (:class:`~managers.writes.WriteBatch`; ``train_model`` does). Nothing of the release
    is visible before the write is made. A caller uses ``prepare_release`` only where
    the class that defines it is the one that defines ``release`` or below it
    (:func:`~managers.writes.preparer`): a subclass that overrides ``release`` alone is
    always called through it.

    Subclasses need not call ``__init__`` of this class. ``aclose`` and the async
    context manager protocol have no-op defaults; an implementation that holds open
    files or connections releases them in ``aclose``.

    The reference implementation is :class:`~managers.release.memory.MemoryReleaseManager`.
    Writing your own takes a few lines::

        class PrintingReleaseManager(ReleaseManager):
            async def release(self, value, key):
                check_key(key)
                logger.info("%s: %s", key, await materialize(value))
    """

    @abc.abstractmethod
    async def release(self, value: Any, key: ReleaseKey) -> None:
        """Publish ``value`` under ``key``, replacing what ``key`` held."""

    async def aclose(self) -> None:
        """Release what the manager holds; the default holds nothing."""


def check_key(key: object) -> ReleaseKey:
    """``key`` if it is a valid release key; ``TypeError`` naming its type otherwise."""
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise TypeError(f"a release key must be an int or a str, got {type(key).__name__} {key!r}")
    return key
