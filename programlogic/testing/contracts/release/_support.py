"""What the tests of the release suite share: the subject, the value references they
release and the check of what the storage holds."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

from managers.release.base import ReleaseKey, ReleaseManager
from programlogic.testing.contracts._base import unwatched

__all__ = [
    "Capabilities",
    "ReleaseSubject",
    "comparable",
    "held_by",
    "holds",
    "needs_idempotency",
    "reopened",
]

ReadBack = Callable[[], dict[ReleaseKey, Any] | Awaitable[dict[ReleaseKey, Any]]]


def _unchanged(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a manager's storage holds, so that the suite expects what it can."""

    str_keys: bool = True
    """Whether it takes str keys; one that does not raises ``TypeError`` for them
    (TensorBoard steps are ints)."""
    arrays: bool = True
    """Whether it holds arrays; one that does not raises ``TypeError`` naming the path."""
    idempotent: bool = True
    """Whether releasing a key again within one manager's life replaces what it held.
    The logging manager logs every release; TensorBoard replaces steps only on a restart."""
    normalize: Callable[[Any], Any] = _unchanged
    """A released plain value as ``read_back`` shows it (CSV and JSON have no tuples,
    TensorBoard stores numbers as float32 and drops text)."""


class ReleaseSubject(NamedTuple):
    """A release manager under test, with what the suite needs to check it."""

    manager: ReleaseManager
    """A new manager, not yet used, holding nothing."""
    read_back: ReadBack
    """Returns (or returns an awaitable of) ``{key: value}``: what the manager's storage
    holds, read independently of the manager where possible (parse the file it wrote)."""
    capabilities: Capabilities = Capabilities()
    """What the storage holds."""
    reopen: Callable[[], ReleaseManager] | None = None
    """Makes a new manager over the same storage, as a restarted program would; ``None``
    when the storage does not outlive its manager (memory, logs)."""


class _DiskFull(OSError):
    """What a failing value reference of the suite raises."""


def needs_idempotency(subject: ReleaseSubject) -> None:
    """Skip the test unless the subject's manager replaces a key released again."""
    if not subject.capabilities.idempotent:
        pytest.skip("the manager does not replace a key released again")


async def held_by(subject: ReleaseSubject) -> dict[ReleaseKey, Any]:
    """What the subject's storage holds, as its ``read_back`` gives it (a step of the
    suite: the loop watchdog does not count it)."""
    with unwatched():
        held = subject.read_back()
        if inspect.isawaitable(held):
            held = await held
    return held


def reopened(subject: ReleaseSubject) -> ReleaseManager:
    """A new manager over the subject's storage (building it is a step of the suite,
    synchronous by nature: the loop watchdog does not count it)."""
    if subject.reopen is None:
        raise ValueError("the subject has no reopen")
    with unwatched():
        return subject.reopen()


async def holds(subject: ReleaseSubject, expected: dict[ReleaseKey, Any]) -> None:
    """Assert that the subject's storage holds ``expected``, normalized, and nothing else."""
    held = await held_by(subject)
    normalize = subject.capabilities.normalize
    wanted = {key: comparable(normalize(value)) for key, value in expected.items()}
    assert {key: comparable(value) for key, value in held.items()} == wanted


def comparable(value: Any) -> Any:
    """``value`` with its arrays made comparable with ``==`` (dtype, shape and items)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tolist())
    if isinstance(value, dict):
        return {key: comparable(child) for key, child in value.items()}
    if isinstance(value, list):
        return [comparable(child) for child in value]
    if isinstance(value, tuple):
        return tuple(comparable(child) for child in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (
            type(value),
            {field.name: comparable(getattr(value, field.name)) for field in fields},
        )
    return value
