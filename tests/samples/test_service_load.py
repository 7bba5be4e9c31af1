"""The sample service under many requests: a cap on the runs it trains (429 beyond), the
registry answering while worker threads are busy, and SIGTERM ending it whatever runs,
with the runs resumed at the next start."""

import pathlib
import signal

import anyio
import anyio.to_thread
import httpx
import pytest

from managers import FileProgramStateManager
from tests.samples.service_helpers import AUTH, Server, in_process, serving, wait_for_round

pytestmark = pytest.mark.anyio

LONG = {"rounds": 100_000}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def post_at_once(client: httpx.AsyncClient, configs: list[dict]) -> list[httpx.Response]:
    answers: list[httpx.Response] = []

    async def post(config: dict) -> None:
        answers.append(await client.post("/runs", json=config))

    async with anyio.create_task_group() as group:
        for config in configs:
            group.start_soon(post, config)
    return answers


async def latest_checkpoint(directory: pathlib.Path) -> int:
    async with FileProgramStateManager(directory / "state") as state:
        _, version = await state.load_latest()
    return version


def stop(server: Server) -> None:
    """SIGTERM; returns once the service ended, gracefully (the signal) or after its grace."""
    server.process.send_signal(signal.SIGTERM)
    # A hang guard, not a speed target: the service must not wait for the runs'
    # TensorFlow work beyond its grace period.
    returncode = server.process.wait(timeout=45)
    assert returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), server.log.read_text()


async def test_runs_beyond_the_cap_are_429_with_retry_after(tmp_path):
    async with in_process(tmp_path, max_running=2) as service:
        answers = await post_at_once(service, [{**LONG, "seed": seed} for seed in range(5)])
        assert sorted(answer.status_code for answer in answers) == [201, 201, 429, 429, 429]
        for refused in (answer for answer in answers if answer.status_code == 429):
            assert refused.headers["retry-after"] == "30"
            assert refused.json() == {
                "error": "the service already trains 2 runs, its most (--max-running); "
                "cancel one or retry later"
            }
        started = [answer.json()["id"] for answer in answers if answer.status_code == 201]
        listed = [run["id"] for run in (await service.get("/runs")).json()["runs"]]
        assert sorted(listed) == sorted(started)
        assert (await service.post("/runs", json=LONG)).status_code == 429

        assert (await service.delete(f"/runs/{started[0]}")).status_code == 200
        assert (await service.post("/runs", json=LONG)).status_code == 201


async def test_with_a_lower_cap_at_a_restart_the_surplus_runs_wait_their_turn(tmp_path):
    async with in_process(tmp_path, max_running=2) as service:
        ids = [(await service.post("/runs", json={**LONG, "seed": s})).json()["id"] for s in (0, 1)]
        for run_id in ids:
            await wait_for_round(service, run_id, 1)
    async with in_process(tmp_path, max_running=1) as service:
        runs = {run["id"]: run for run in (await service.get("/runs")).json()["runs"]}
        assert [runs[run_id]["status"] for run_id in ids] == ["running", "running"]
        assert (await service.post("/runs", json=LONG)).status_code == 429
        # The first resumed holds the one slot; the second trains once it is cancelled.
        await wait_for_round(service, ids[0], runs[ids[0]]["round"] + 1)
        assert (await service.delete(f"/runs/{ids[0]}")).status_code == 200
        await wait_for_round(service, ids[1], runs[ids[1]]["round"] + 1)


async def test_a_run_starts_while_every_default_worker_thread_is_taken(tmp_path):
    # Model builds and checkpoints take anyio's default worker threads; the registry's
    # index write must not wait for one.
    async with in_process(tmp_path) as service:
        limiter = anyio.to_thread.current_default_thread_limiter()
        borrowers = [object() for _ in range(int(limiter.total_tokens))]
        for borrower in borrowers:
            await limiter.acquire_on_behalf_of(borrower)
        answer = None
        try:
            with anyio.move_on_after(60):  # a hang guard: the answer needs no free thread
                answer = await service.post("/runs", json=LONG)
            assert answer is not None, "POST /runs waited for a default worker thread"
            assert answer.status_code == 201
            assert [run["id"] for run in (await service.get("/runs")).json()["runs"]] == [
                answer.json()["id"]
            ]
        finally:
            for borrower in borrowers:
                limiter.release_on_behalf_of(borrower)
    assert (tmp_path / "runs.json").exists()


async def test_sigterm_ends_the_service_whatever_runs_and_the_next_start_resumes(tmp_path):
    data_dir, log = tmp_path / "data", tmp_path / "server.log"
    options = ("--max-running", "3", "--shutdown-grace", "2")
    with serving(data_dir, log, *options) as server:
        await server.wait_until_up()
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=120) as client:
            configs = [{**LONG, "model": "cnn", "seed": seed} for seed in range(5)]
            answers = await post_at_once(client, configs)
            assert sorted(answer.status_code for answer in answers) == [201, 201, 201, 429, 429]
            runs = [answer.json() for answer in answers if answer.status_code == 201]
            await wait_for_round(client, runs[0]["id"], 2)
        stop(server)
    stopped_at = await latest_checkpoint(data_dir / "runs" / runs[0]["id"])
    assert stopped_at >= 2

    with serving(data_dir, log, *options) as server:
        await server.wait_until_up()
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=120) as client:
            listed = (await client.get("/runs")).json()["runs"]
            assert sorted(run["id"] for run in listed) == sorted(run["id"] for run in runs)
            assert all(run["status"] == "running" for run in listed)
            resumed = await wait_for_round(client, runs[0]["id"], stopped_at + 1)
            assert resumed["status"] == "running"
        stop(server)
    for run in runs:
        assert f"resuming run {run['id']}" in log.read_text()
