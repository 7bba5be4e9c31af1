"""The contract suite of release managers: idempotency by key, errors, concurrency, closing.

Subclass :class:`ReleaseManagerContract` in a test file of yours and override its
``subject`` fixture. A subject is the manager under test, a way to read back what its
storage holds, and what that storage can hold::

    import pytest

    from programlogic.testing.contracts import Capabilities, ReleaseManagerContract, ReleaseSubject


    class TestMySink(ReleaseManagerContract):
        @pytest.fixture
        def subject(self, tmp_path):
            path = tmp_path / "metrics.db"
            return ReleaseSubject(
                manager=MySink(path),
                read_back=lambda: read_my_sink(path),  # {key: value}
                capabilities=Capabilities(arrays=False),
                reopen=lambda: MySink(path),
            )

Every test of the suite then runs against your manager under asyncio and trio.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from managers.release.base import ReleaseKey, ReleaseManager
from managers.testing import FakeValueReference
from programlogic.testing.contracts._base import Contract

__all__ = ["Capabilities", "ReleaseManagerContract", "ReleaseSubject"]

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
    """What a failing value reference raises."""


class _Metrics(NamedTuple):
    loss: Any
    accuracy: Any


@dataclasses.dataclass
class _Summary:
    rounds: Any


class ReleaseManagerContract(Contract):
    """The promises every :class:`~managers.ReleaseManager` keeps.

    Override :meth:`subject` to return a new :class:`ReleaseSubject` (it may be a
    generator fixture, to clean up after the test). The suite enters the manager with
    ``async with`` (or calls ``aclose``) itself. Values released are numbers and
    structures of numbers; :attr:`Capabilities.normalize` turns each into what
    ``read_back`` shows for it. Tests are named after the promise they check; one that
    your manager cannot keep can be overridden in your subclass, marked
    ``pytest.mark.xfail(strict=True, reason=...)``, with the reason.
    """

    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        """The manager under test and how to read it back; override it in your subclass."""
        raise NotImplementedError(f"{type(self).__name__} must override the subject fixture")

    @pytest.fixture
    async def manager(self, subject: ReleaseSubject) -> AsyncIterator[ReleaseManager]:
        """The subject's manager, open for the test and closed after it."""
        async with subject.manager as entered:
            yield entered

    # Releasing

    async def test_a_new_manager_holds_nothing(self, subject: ReleaseSubject) -> None:
        assert isinstance(subject.manager, ReleaseManager)
        await _holds(subject, {})

    async def test_a_release_is_held_under_its_key(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 0.5, "accuracy": 0.75}, 1)
        await _holds(subject, {1: {"loss": 0.5, "accuracy": 0.75}})

    async def test_value_references_are_materialized(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release(
            {
                "loss": FakeValueReference(0.25),
                "nested": {"accuracy": FakeValueReference(0.75), "count": 3},
                "ids": [FakeValueReference(1)],
            },
            4,
        )
        await manager.release(FakeValueReference(0.5, delay=3), 100)
        await _holds(
            subject,
            {4: {"loss": 0.25, "nested": {"accuracy": 0.75, "count": 3}, "ids": [1]}, 100: 0.5},
        )

    async def test_namedtuples_and_dataclasses_are_released(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        value = {
            "metrics": _Metrics(loss=FakeValueReference(0.5), accuracy=0.25),
            "summary": _Summary(FakeValueReference(3)),
        }
        await manager.release(value, 1)
        expected = {"metrics": _Metrics(loss=0.5, accuracy=0.25), "summary": _Summary(rounds=3)}
        await _holds(subject, {1: expected})

    async def test_arrays_are_held_or_refused_naming_their_path(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        value = {
            "weights": FakeValueReference(np.arange(3.0)),
            "bias": np.ones(2, dtype=np.float32),
        }
        if not subject.capabilities.arrays:
            with pytest.raises(TypeError, match=r"'weights'.* array of shape \(3,\)"):
                await manager.release(value, 1)
            await _holds(subject, {})
            return
        await manager.release(value, 1)
        await _holds(subject, {1: {"weights": np.arange(3.0), "bias": np.ones(2, np.float32)}})

    # Keys

    async def test_keys_may_arrive_in_any_order(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        for key in (5, 2, 9, 1):
            await manager.release({"round": key}, key)
        await _holds(subject, {key: {"round": key} for key in (1, 2, 5, 9)})

    async def test_int_and_str_keys_are_held_apart(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        if not subject.capabilities.str_keys:
            with pytest.raises(TypeError, match="'final'"):
                await manager.release({"loss": 0.5}, "final")
            await _holds(subject, {})
            return
        await manager.release({"loss": 0.25}, 1)
        await manager.release({"loss": 0.75}, "1")
        await manager.release({"weights": [1.0, 2.0]}, "final_training_checkpoint_round_100")
        await _holds(
            subject,
            {
                1: {"loss": 0.25},
                "1": {"loss": 0.75},
                "final_training_checkpoint_round_100": {"weights": [1.0, 2.0]},
            },
        )

    @pytest.mark.parametrize(
        ("key", "found"),
        [(True, "bool True"), (False, "bool False"), (1.0, "float 1.0"), (None, "NoneType None")],
        ids=["true", "false", "float", "none"],
    )
    async def test_an_invalid_key_raises_type_error_naming_it(
        self, subject: ReleaseSubject, manager: ReleaseManager, key: Any, found: str
    ) -> None:
        await manager.release({"loss": 0.5}, 1)
        with pytest.raises(TypeError, match=rf"release key must be an int or a str, got {found}"):
            await manager.release({"loss": 0.25}, key)
        await _holds(subject, {1: {"loss": 0.5}})

    # Idempotency by key

    async def test_releasing_a_key_again_replaces_it_and_leaves_other_keys(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        _needs_idempotency(subject)
        for key in (1, 2, 3):
            await manager.release({"loss": float(key)}, key)
        await manager.release({"loss": 2.5}, 2)
        await _holds(subject, {1: {"loss": 1.0}, 2: {"loss": 2.5}, 3: {"loss": 3.0}})

    async def test_releasing_the_same_value_again_holds_it_once(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        _needs_idempotency(subject)
        for _ in range(3):
            await manager.release({"loss": 1.0}, 7)
        await _holds(subject, {7: {"loss": 1.0}})

    async def test_keys_released_again_in_any_order_hold_their_last_value(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        _needs_idempotency(subject)
        for key in range(1, 7):
            await manager.release({"loss": float(key), "round": key}, key)
        for key in (4, 1, 6, 2, 4):
            await manager.release({"loss": key + 0.5, "round": key}, key)
        replaced = {1, 2, 4, 6}
        expected = {
            key: {"loss": key + 0.5 if key in replaced else float(key), "round": key}
            for key in range(1, 7)
        }
        await _holds(subject, expected)

    async def test_overlapping_releases_of_one_key_keep_the_last_call(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        _needs_idempotency(subject)
        gate = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(
                manager.release, {"loss": FakeValueReference(0.25, gate=gate, delay=0)}, 1
            )
            await anyio.wait_all_tasks_blocked()
            group.start_soon(manager.release, {"loss": FakeValueReference(0.75)}, 1)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        await _holds(subject, {1: {"loss": 0.75}})

    # Failures

    async def test_a_failed_release_raises_its_error_and_leaves_what_keys_held(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 1.0}, 1)
        with pytest.raises(_DiskFull, match="disk full"):
            await manager.release({"loss": FakeValueReference(error=_DiskFull("disk full"))}, 2)
        with pytest.raises(_DiskFull, match="disk full"):
            await manager.release(
                {"loss": FakeValueReference(error=_DiskFull("disk full")), "accuracy": 0.5}, 1
            )
        await _holds(subject, {1: {"loss": 1.0}})

    async def test_a_later_failed_release_of_a_key_leaves_an_earlier_overlapping_one(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        gate = anyio.Event()
        failures: list[BaseException] = []

        async def release_failing() -> None:
            with pytest.raises(_DiskFull) as raised:
                await manager.release({"loss": FakeValueReference(error=_DiskFull("disk full"))}, 1)
            failures.append(raised.value)

        async with anyio.create_task_group() as group:
            group.start_soon(
                manager.release, {"loss": FakeValueReference(0.25, gate=gate, delay=0)}, 1
            )
            await anyio.wait_all_tasks_blocked()
            group.start_soon(release_failing)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        assert len(failures) == 1
        await _holds(subject, {1: {"loss": 0.25}})

    # Concurrency and cancellation

    async def test_concurrent_releases_of_different_keys_all_land(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        count = 40
        str_keys = [f"s{key}" for key in range(count)] if subject.capabilities.str_keys else []
        async with anyio.create_task_group() as group:
            for key in range(count):
                value = {"round": FakeValueReference(key, delay=(key * 7) % 5), "half": key / 2}
                group.start_soon(manager.release, value, key)
            for index, key in enumerate(str_keys):
                group.start_soon(
                    manager.release, {"index": FakeValueReference(index, delay=index % 3)}, key
                )
        expected: dict[ReleaseKey, Any] = {
            key: {"round": key, "half": key / 2} for key in range(count)
        }
        expected.update({key: {"index": index} for index, key in enumerate(str_keys)})
        await _holds(subject, expected)

    async def test_a_cancelled_release_leaves_the_whole_value_or_none_of_it(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 0.0, "round": 0}, 0)
        for key in range(1, 16):  # cancelled after 0, 1, ... scheduling points
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(_cancel_after, scope, key - 1)
                    await manager.release(
                        {"loss": FakeValueReference(key / 4, delay=2), "round": key}, key
                    )
        held = await _read_back(subject)
        assert 0 in held
        assert set(held) <= set(range(16))
        await _holds(subject, {key: {"loss": key / 4, "round": key} for key in held})

    # Closing

    async def test_async_with_returns_the_manager_and_propagates_errors(
        self, subject: ReleaseSubject
    ) -> None:
        with pytest.raises(RuntimeError, match="inside"):
            async with subject.manager as entered:
                assert entered is subject.manager
                await entered.release({"loss": 0.5}, 1)
                raise RuntimeError("inside")
        await _holds(subject, {1: {"loss": 0.5}})

    async def test_aclose_may_be_called_twice(self, subject: ReleaseSubject) -> None:
        await subject.manager.release({"loss": 0.5}, 1)
        await subject.manager.aclose()
        await subject.manager.aclose()
        await _holds(subject, {1: {"loss": 0.5}})

    async def test_leaving_on_cancellation_closes_the_files(
        self, subject: ReleaseSubject, tmp_path: Path
    ) -> None:
        if not _can_list_open_files():
            pytest.skip("needs Linux's /proc/self/fd")
        with anyio.CancelScope() as scope:
            async with subject.manager as manager:
                await manager.release({"loss": 0.5}, 1)
                scope.cancel()
                await anyio.sleep_forever()
        assert scope.cancelled_caught
        assert _open_files_under(tmp_path) == []
        await _holds(subject, {1: {"loss": 0.5}})

    # Restarts

    async def test_a_restarted_manager_replaying_keys_holds_each_key_once(
        self, subject: ReleaseSubject
    ) -> None:
        if subject.reopen is None:
            pytest.skip("the storage does not outlive its manager")
        async with subject.manager as manager:
            for key in (1, 2, 3):
                await manager.release({"loss": float(key), "round": key}, key)
        async with subject.reopen() as restarted:  # resumed at round 2, as after a crash
            for key in (2, 3, 4):
                await restarted.release({"loss": key + 0.5, "round": key}, key)
        await _holds(
            subject,
            {
                1: {"loss": 1.0, "round": 1},
                2: {"loss": 2.5, "round": 2},
                3: {"loss": 3.5, "round": 3},
                4: {"loss": 4.5, "round": 4},
            },
        )


def _needs_idempotency(subject: ReleaseSubject) -> None:
    if not subject.capabilities.idempotent:
        pytest.skip("the manager does not replace a key released again")


async def _read_back(subject: ReleaseSubject) -> dict[ReleaseKey, Any]:
    held = subject.read_back()
    if inspect.isawaitable(held):
        held = await held
    return held


async def _holds(subject: ReleaseSubject, expected: dict[ReleaseKey, Any]) -> None:
    """Assert that the subject's storage holds ``expected``, normalized, and nothing else."""
    held = await _read_back(subject)
    normalize = subject.capabilities.normalize
    wanted = {key: _comparable(normalize(value)) for key, value in expected.items()}
    assert {key: _comparable(value) for key, value in held.items()} == wanted


def _comparable(value: Any) -> Any:
    """``value`` with its arrays made comparable with ``==`` (dtype, shape and items)."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tolist())
    if isinstance(value, dict):
        return {key: _comparable(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_comparable(child) for child in value]
    if isinstance(value, tuple):
        return tuple(_comparable(child) for child in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (
            type(value),
            {field.name: _comparable(getattr(value, field.name)) for field in fields},
        )
    return value


async def _cancel_after(scope: anyio.CancelScope, checkpoints: int) -> None:
    """Cancel ``scope`` once this task has passed ``checkpoints`` scheduling points."""
    for _ in range(checkpoints):
        await anyio.lowlevel.checkpoint()
    scope.cancel()


def _can_list_open_files() -> bool:
    return Path("/proc/self/fd").is_dir()


def _open_files_under(directory: Path) -> list[str]:
    """The files under ``directory`` this process holds open (Linux's /proc/self/fd)."""
    held = []
    for descriptor in Path("/proc/self/fd").iterdir():
        try:
            target = descriptor.readlink()
        except OSError:
            continue  # closed since the listing
        if target.is_relative_to(directory):
            held.append(str(target))
    return held
