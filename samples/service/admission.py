"""How many runs the service trains at once, and the worker threads its work may take.

A run holds a TensorFlow model, its traced functions and a thread of its own: a few
hundred megabytes and a share of the CPUs. Past ``max_running`` active runs a new one
is refused (``TooManyRunsError``, answered 429 with ``Retry-After``), never queued: the
service's memory is bounded by the cap. Runs resumed at a start are all admitted; if
there are more than the cap (it was lowered), the surplus waits for a training slot.

The registry's own file work (``runs.json``, checking a run's directory) and the
building of models each have their own thread budget, apart from anyio's default one
that checkpoints and other file work share: a request that writes the index never
waits behind a model build.
"""

from __future__ import annotations

import anyio

__all__ = ["DEFAULT_MAX_RUNNING", "RETRY_AFTER_S", "Admission", "TooManyRunsError"]

DEFAULT_MAX_RUNNING = 4
"""Runs trained at once unless told otherwise (``--max-running``)."""

RETRY_AFTER_S = 30
"""The ``Retry-After`` of a refused run, in seconds: runs last minutes, not seconds."""


class TooManyRunsError(Exception):
    """The service trains as many runs as it may; try again after ``retry_after`` seconds."""

    def __init__(self, max_running: int, retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(
            f"the service already trains {max_running} runs, its most (--max-running); "
            "cancel one or retry later"
        )
        self.retry_after = retry_after


class Admission:
    """The cap on active runs, and the limiters of the service's worker threads.

    ``slots``: a run trains while it holds one (``max_running`` of them).
    ``registry_io``: one thread for the registry's file work. ``builds``: one thread
    building a model at a time (builds take an exclusive graph lock anyway).
    """

    def __init__(self, max_running: int = DEFAULT_MAX_RUNNING) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {max_running}")
        self.max_running = max_running
        self.slots = anyio.CapacityLimiter(max_running)
        self.registry_io = anyio.CapacityLimiter(1)
        self.builds = anyio.CapacityLimiter(1)

    def admit(self, active: int) -> None:
        """Let a new run in beside ``active`` others; ``TooManyRunsError`` at the cap."""
        if active >= self.max_running:
            raise TooManyRunsError(self.max_running)
