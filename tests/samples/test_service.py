"""The sample service: runs started, streamed, cancelled and resumed, in-process and served.

The service runs on uvicorn's asyncio loop, so these tests run under asyncio only.
"""

import csv
import pathlib
import subprocess
import sys

import httpx
import pytest

from managers import FileProgramStateManager
from tests.samples.service_helpers import (
    AUTH,
    GRACEFUL,
    REPO,
    TOKEN,
    events,
    in_process,
    serving,
    wait_for_round,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def latest_checkpoint(directory: pathlib.Path) -> int:
    async with FileProgramStateManager(directory / "state") as state:
        _, version = await state.load_latest()
    return version


def metric_keys(directory: pathlib.Path) -> list[int]:
    with (directory / "metrics.csv").open(newline="") as file:
        return [int(row["key"]) for row in csv.DictReader(file)]


async def test_runs_stream_cancel_and_resume_after_a_restart(tmp_path):
    async with in_process(tmp_path) as service:
        finite = (await service.post("/runs", json={"rounds": 3})).json()
        doomed = (await service.post("/runs", json={"rounds": 100_000, "seed": 1})).json()
        lasting = await service.post("/runs", json={"rounds": 100_000})
        assert lasting.status_code == 201, lasting.text
        lasting = lasting.json()
        assert lasting["status"] == "running"

        streamed = events((await service.get(f"/runs/{finite['id']}/events")).text)
        assert [data["round"] for kind, data in streamed if kind == "metrics"] == [1, 2, 3]
        trained = [data for kind, data in streamed if kind == "metrics"]
        assert all("client_work/train/loss" in data["metrics"] for data in trained)
        held_out = [data["round"] for kind, data in streamed if kind == "evaluation"]
        assert held_out == [0, 1, 2, 3]  # the initial model is evaluated too
        assert streamed[-1][0] == "end" and streamed[-1][1]["status"] == "finished"

        await wait_for_round(service, doomed["id"], 2)
        cancelled = await service.delete(f"/runs/{doomed['id']}")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        again = await service.delete(f"/runs/{doomed['id']}")
        assert again.status_code == 409
        assert again.json() == {"error": f"run {doomed['id']} is cancelled, not running"}
        await wait_for_round(service, lasting["id"], 2)
    # Leaving the app shut it down: the lasting run was interrupted, not cancelled.
    doomed_dir, lasting_dir = tmp_path / "runs" / doomed["id"], tmp_path / "runs" / lasting["id"]
    stopped_at = await latest_checkpoint(lasting_dir)
    doomed_at = await latest_checkpoint(doomed_dir)
    assert stopped_at >= 2 and doomed_at >= 2

    async with in_process(tmp_path) as service:
        runs = {run["id"]: run for run in (await service.get("/runs")).json()["runs"]}
        assert runs[finite["id"]]["status"] == "finished" and runs[finite["id"]]["round"] == 3
        assert runs[doomed["id"]]["status"] == "cancelled"
        assert runs[lasting["id"]]["status"] == "running"
        # Its history came back from the CSV, which may lag the checkpoint by the round
        # whose release the shutdown interrupted (the resumed run releases that round first).
        assert runs[lasting["id"]]["round"] >= stopped_at - 1
        await wait_for_round(service, lasting["id"], stopped_at + 2)
        await service.delete(f"/runs/{lasting['id']}")
        # One event per round, though the resumed run released its checkpoint's round again.
        streamed = events((await service.get(f"/runs/{lasting['id']}/events")).text)
        rounds = [data["round"] for kind, data in streamed if kind == "metrics"]
        assert rounds == list(range(1, len(rounds) + 1)) and len(rounds) >= stopped_at + 2
    keys = metric_keys(lasting_dir)
    assert keys == list(range(1, len(keys) + 1)) and len(keys) >= stopped_at + 2
    assert await latest_checkpoint(doomed_dir) == doomed_at  # a cancelled run stays stopped


async def test_unknown_run_ids_are_404(tmp_path):
    async with in_process(tmp_path) as service:
        for request in (service.get, service.delete):
            response = await request("/runs/nope")
            assert response.status_code == 404
            assert response.json() == {"error": "no run has the id 'nope'"}
        assert (await service.get("/runs/nope/events")).status_code == 404


async def test_the_status_page_and_health_are_served(tmp_path):
    async with in_process(tmp_path) as service:
        page = await service.get("/")
        assert page.status_code == 200 and "<title>programlogic runs</title>" in page.text
        assert (await service.get("/health")).json() == {"status": "ok", "running": 0}


async def test_a_served_run_stopped_by_sigterm_resumes_at_the_next_start(tmp_path):
    data_dir, log = tmp_path / "data", tmp_path / "server.log"
    with serving(data_dir, log, *GRACEFUL) as server:
        await server.wait_until_up()
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
            run = (await client.post("/runs", json={"rounds": 100_000})).json()
            await wait_for_round(client, run["id"], 3)
        server.terminate()
    stopped_at = await latest_checkpoint(data_dir / "runs" / run["id"])
    assert stopped_at >= 3

    with serving(data_dir, log, *GRACEFUL) as server:
        await server.wait_until_up()
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
            resumed = await wait_for_round(client, run["id"], stopped_at + 2)
            assert resumed["status"] == "running"
        server.terminate()
    assert f"resuming run {run['id']}" in log.read_text()
    keys = metric_keys(data_dir / "runs" / run["id"])
    assert keys == list(range(1, len(keys) + 1)) and len(keys) >= stopped_at + 2


async def test_serving_beyond_loopback_without_a_token_is_refused(tmp_path):
    refused = subprocess.run(
        [sys.executable, "-m", "samples.service", "--host", "0.0.0.0", "--data-dir", tmp_path],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert refused.returncode == 2
    assert "listening on 0.0.0.0 needs a token in $PROGRAMLOGIC_SERVICE_TOKEN" in refused.stderr
    assert not any(tmp_path.iterdir())


async def test_a_token_shorter_than_16_characters_is_refused(tmp_path):
    from samples.service.app import create_app

    with pytest.raises(ValueError, match="token must be at least 16 printable ASCII characters"):
        create_app(tmp_path, token="short")
    assert TOKEN != "short"


async def test_a_resumed_run_streams_each_round_once(tmp_path):
    async with in_process(tmp_path) as service:
        run = (await service.post("/runs", json={"rounds": 3, "epochs": 1})).json()
        await service.get(f"/runs/{run['id']}/events")  # ends when the run has
    # A service killed after the run's last checkpoint, before it recorded the run as
    # finished: the restart resumes it, and train_model releases round 3 once more.
    index = tmp_path / "runs.json"
    index.write_bytes(index.read_bytes().replace(b'"finished"', b'"running"'))
    async with in_process(tmp_path) as service:
        streamed = events((await service.get(f"/runs/{run['id']}/events")).text)
    assert [data["round"] for kind, data in streamed if kind == "metrics"] == [1, 2, 3]
    assert streamed[-1][0] == "end" and streamed[-1][1]["status"] == "finished"


async def test_a_finished_run_shows_its_settings_times_and_saved_model(tmp_path):
    async with in_process(tmp_path) as service:
        config = {"rounds": 2, "epochs": 1, "model": "mlp", "seed": 4}
        run = (await service.post("/runs", json=config)).json()
        await service.get(f"/runs/{run['id']}/events")  # ends when the run has
        shown = (await service.get(f"/runs/{run['id']}")).json()
        assert shown["status"] == "finished"
        assert {key: shown["config"][key] for key in config} == config
        again = (await service.get(f"/runs/{run['id']}")).json()
        assert shown["elapsed_s"] is not None and again["elapsed_s"] == shown["elapsed_s"]
        assert shown["eta_s"] is None
        assert 0 <= shown["evaluation"]["client_work/eval/current_round_metrics/loss"]
        assert shown["evaluated_round"] == 2
        [url] = shown["models"]
        model = await service.get(url)
        assert model.status_code == 200
        assert (
            model.content
            == (tmp_path / "runs" / run["id"] / "models" / url.split("/")[-1]).read_bytes()
        )
        for name in ("..%2F..%2Fruns.json", "nope.model", "%2E%2E%2Fstate"):
            assert (await service.get(f"/runs/{run['id']}/models/{name}")).status_code == 404
