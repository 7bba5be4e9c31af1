import anyio
import anyio.lowlevel
import pytest

from managers.taskgroups import task_group
from programlogic.tasks import TaskTracker

pytestmark = pytest.mark.anyio


async def test_a_lone_failure_in_a_task_group_is_raised_as_itself() -> None:
    error = ValueError("save failed")

    async def fail() -> None:
        raise error

    with pytest.raises(ValueError) as caught:
        async with task_group() as group:
            group.start_soon(fail)
            group.start_soon(anyio.sleep_forever)
    assert caught.value is error


async def test_several_failures_in_a_task_group_surface_together() -> None:
    arrived: list[Exception] = []
    both_arrived = anyio.Event()

    async def fail(error: Exception) -> None:
        arrived.append(error)
        if len(arrived) == 2:
            both_arrived.set()
        with anyio.CancelScope(shield=True):  # the first failure cannot cancel the second
            await both_arrived.wait()
        raise error

    with pytest.raises(ExceptionGroup) as caught:
        async with task_group() as group:
            group.start_soon(fail, KeyError("a"))
            group.start_soon(fail, IndexError("b"))
            await anyio.sleep_forever()
    kinds = sorted(type(e).__name__ for e in caught.value.exceptions)
    assert kinds == ["IndexError", "KeyError"]


@pytest.mark.parametrize("where", ["task", "block"])
async def test_an_exception_group_a_task_raises_itself_comes_back_whole(where: str) -> None:
    error = ExceptionGroup("the task's own", [KeyError("a")])

    async def fail() -> None:
        raise error

    with pytest.raises(ExceptionGroup) as caught:
        async with task_group() as group:
            group.start_soon(anyio.sleep_forever)
            if where == "task":
                group.start_soon(fail)
            else:
                await fail()
    assert caught.value is error


async def test_an_unwrapped_failure_keeps_its_own_cause() -> None:
    async def fail() -> None:
        try:
            raise OSError("disk")
        except OSError as cause:
            raise RuntimeError("checkpoint failed") from cause

    with pytest.raises(RuntimeError) as caught:
        async with task_group() as group:
            group.start_soon(fail)
    assert isinstance(caught.value.__cause__, OSError)


async def test_leaving_a_task_group_block_waits_for_its_tasks() -> None:
    finished: list[str] = []

    async def work() -> None:
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        finished.append("work")

    async with task_group() as group:
        group.start_soon(work)
    assert finished == ["work"]


async def test_a_cancelled_task_group_stays_cancelled() -> None:
    finished = []

    async def cancel_once_blocked(scope: anyio.CancelScope) -> None:
        await anyio.wait_all_tasks_blocked()  # the group is waiting for its task
        scope.cancel()

    async with anyio.create_task_group() as outer:
        with anyio.CancelScope() as scope:
            outer.start_soon(cancel_once_blocked, scope)
            async with task_group() as group:
                group.start_soon(anyio.sleep_forever)
            finished.append(True)
    assert scope.cancelled_caught and not finished


async def test_tracked_failures_wait_for_their_owner() -> None:
    done = []
    failed = anyio.Event()

    async def fail() -> None:
        failed.set()
        raise KeyError("eval")

    async def succeed() -> None:
        await failed.wait()
        await anyio.wait_all_tasks_blocked()  # the owner had every chance to return early
        done.append("other task finished")

    async with TaskTracker() as tracker:
        tracker.start_soon(fail)
        tracker.start_soon(succeed)
        assert tracker.running == 2
        with pytest.raises(KeyError, match="eval"):
            await tracker.wait()
        assert done == ["other task finished"] and tracker.running == 0
        await tracker.wait()  # the failure was handed over once


async def test_several_tracked_failures_are_an_exception_group() -> None:
    async def fail(error: Exception) -> None:
        raise error

    async with TaskTracker() as tracker:
        tracker.start_soon(fail, KeyError("a"))
        tracker.start_soon(fail, ValueError("b"))
        with pytest.raises(ExceptionGroup, match="2 background tasks failed"):
            await tracker.wait()


async def test_start_returns_once_the_task_is_ready() -> None:
    steps = []
    may_evaluate = anyio.Event()

    async def evaluation(*, task_status) -> None:
        steps.append("bookkeeping saved")
        task_status.started("ready")
        await may_evaluate.wait()
        steps.append("evaluated")

    async with TaskTracker() as tracker:
        task = await tracker.start(evaluation)
        assert task.value == "ready" and not task.done
        assert steps == ["bookkeeping saved"]
        may_evaluate.set()
        await tracker.wait()
    assert steps == ["bookkeeping saved", "evaluated"]


async def test_a_failure_before_started_is_raised_to_the_caller() -> None:
    async def broken(*, task_status) -> None:
        raise OSError("could not persist")

    async with TaskTracker() as tracker:
        with pytest.raises(OSError, match="could not persist"):
            await tracker.start(broken)
        await tracker.wait()


async def test_closing_cancels_running_tasks_and_raises_uncollected_failures() -> None:
    cancelled = []

    async def forever() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(True)

    async def fail() -> None:
        raise LookupError("never collected")

    with pytest.raises(LookupError, match="never collected"):
        async with TaskTracker() as tracker:
            tracker.start_soon(forever)
            tracker.start_soon(fail)
            await anyio.wait_all_tasks_blocked()  # forever runs and fail has failed
    assert cancelled == [True]


async def test_the_block_exception_propagates_unchanged_through_the_tracker() -> None:
    error = ZeroDivisionError("in the body")
    with pytest.raises(ZeroDivisionError) as caught:
        async with TaskTracker() as tracker:
            tracker.start_soon(anyio.sleep_forever)
            raise error
    assert caught.value is error


async def test_a_closed_tracker_refuses_new_tasks() -> None:
    tracker = TaskTracker()
    with pytest.raises(RuntimeError, match="not open"):
        tracker.start_soon(anyio.sleep, 0)


async def test_a_task_handle_collects_its_own_failure() -> None:
    async def fail(error: Exception) -> None:
        raise error

    async with TaskTracker() as tracker:
        mine = tracker.start_soon(fail, KeyError("mine"), name="mine")
        tracker.start_soon(fail, ValueError("theirs"))
        with pytest.raises(KeyError, match="mine"):
            await mine.wait()
        assert mine.done and mine.name == "mine"
        with pytest.raises(ValueError, match="theirs"):
            await tracker.wait()  # only what the handle did not collect


async def test_a_handle_of_a_successful_task_waits_for_it() -> None:
    steps = []

    async def work() -> None:
        await anyio.wait_all_tasks_blocked()  # the handle's owner is waiting by now
        steps.append("done")

    async with TaskTracker() as tracker:
        task = tracker.start_soon(work)
        await task.wait()
        assert steps == ["done"] and task.done


async def test_leaving_a_tracker_lets_the_blocks_own_exception_group_through_whole() -> None:
    error = ExceptionGroup("the block's own", [KeyError("a")])
    with pytest.raises(ExceptionGroup) as caught:
        async with TaskTracker() as tracker:
            tracker.start_soon(anyio.sleep_forever)
            raise error
    assert caught.value is error
