"""The service's live metrics: each round key reaches a listener once, resumed or not."""

import anyio
import pytest

from samples.service.live_metrics import LiveMetrics, stream

pytestmark = pytest.mark.anyio


async def collect(into: list, **managers: LiveMetrics) -> None:
    async for kind, point in stream(**managers):
        into.append((kind, point))


async def test_a_round_released_again_after_a_resume_is_streamed_once_with_its_new_value():
    # A restarted run: its metrics file holds rounds 1-3, its checkpoint is at round 3,
    # so the resumed run releases round 3 again, then 4.
    history = [{"round": key, "metrics": {"loss": 1.0 / key}} for key in (1, 2, 3)]
    manager = LiveMetrics(history)
    streamed: list = []
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(lambda: collect(streamed, metrics=manager))
        await anyio.wait_all_tasks_blocked()
        await manager.release({"loss": 0.25}, 3)
        await manager.release({"loss": 0.2}, 4)
        await manager.release({"loss": 0.19}, 4)  # a later cadence replays the last rounds
        await manager.aclose()
    assert [point["round"] for _, point in streamed] == [1, 2, 3, 4]
    assert [point["round"] for point in manager.points()] == [1, 2, 3, 4]
    assert manager.points()[2] == {"round": 3, "metrics": {"loss": 0.25}}
    assert manager.latest() == {"round": 4, "metrics": {"loss": 0.19}}
    late: list = []
    await collect(late, metrics=manager)  # a listener arriving later sees the kept values
    assert late == [("metrics", point) for point in manager.points()]


async def test_held_out_points_stream_beside_the_training_ones_as_their_own_kind():
    training = LiveMetrics()
    held_out = LiveMetrics([{"round": 1, "metrics": {"acc": 0.5}}])
    streamed: list = []
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(lambda: collect(streamed, metrics=training, evaluation=held_out))
        await anyio.wait_all_tasks_blocked()
        await training.release({"loss": 0.3, "note": "text"}, 2)
        await anyio.wait_all_tasks_blocked()
        await held_out.release({"acc": 0.75}, 2)
        await anyio.wait_all_tasks_blocked()  # streamed before it is released again
        await held_out.release({"acc": 0.8}, 2)  # replayed: kept, not streamed
        await anyio.wait_all_tasks_blocked()
        assert streamed == [
            ("evaluation", {"round": 1, "metrics": {"acc": 0.5}}),
            ("metrics", {"round": 2, "metrics": {"loss": 0.3}}),
            ("evaluation", {"round": 2, "metrics": {"acc": 0.75}}),
        ]
        await training.aclose()
        await anyio.wait_all_tasks_blocked()
        assert len(streamed) == 3  # the stream goes on while one of them is open
        await held_out.aclose()
    assert held_out.latest() == {"round": 2, "metrics": {"acc": 0.8}}


async def test_a_history_with_a_key_twice_keeps_the_last_row():
    manager = LiveMetrics(
        [{"round": 1, "metrics": {"loss": 2.0}}, {"round": 1, "metrics": {"loss": 1.0}}]
    )
    assert manager.points() == [{"round": 1, "metrics": {"loss": 1.0}}]
