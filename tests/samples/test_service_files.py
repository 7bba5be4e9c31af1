"""The sample service's own files: runs kept apart from them under ``runs/``, names and
lengths checked, the old layout still resumed, a failed registry reported by ``/health``,
and the data directory locked against a second service."""

import os
import pathlib
import subprocess
import sys

import anyio
import httpx
import orjson
import pytest

from tests.samples.service_helpers import (
    AUTH,
    GRACEFUL,
    REPO,
    TOKEN,
    free_port,
    in_process,
    serving,
    wait_for_round,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def entries(directory: pathlib.Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


@pytest.mark.parametrize(
    ("directory", "error"),
    [
        ("runs.json", "directory must not be named after the service's file runs.json"),
        ("runs.json.old", "directory must not be named after the service's file runs.json"),
        ("a/service.lock", "directory must not be named after the service's file service.lock"),
        (".runs.json.tmp", "directory must not have a hidden part (starting with '.')"),
        ("mine/.git", "directory must not have a hidden part (starting with '.')"),
        (".", "directory must not have a hidden part (starting with '.')"),
        ("a//b", "directory must not have an empty part"),
        ("tab\there", "directory must not contain control characters"),
        ("nul\x00", "directory must not contain control characters"),
        ("é" * 130, "each part of directory must be at most 255 bytes in UTF-8 (one has 260)"),
    ],
)
async def test_run_names_that_could_clash_or_break_are_refused(tmp_path, directory, error):
    async with in_process(tmp_path) as service:
        response = await service.post("/runs", json={"rounds": 1, "directory": directory})
        assert response.status_code == 422, response.text
        assert response.json() == {"error": f"directory: {error}, got {directory!r}"}
        assert (await service.get("/runs")).json() == {"runs": []}
        assert (await service.get("/health")).json() == {"status": "ok", "running": 0}
    assert entries(tmp_path) == ["service.lock"]


async def test_a_path_over_the_systems_limit_is_refused(tmp_path):
    data_dir = tmp_path.joinpath(*["d" * 200] * 19)  # about 3,900 bytes deep
    data_dir.mkdir(parents=True)
    async with in_process(data_dir) as service:
        directory = "x" * 150
        response = await service.post("/runs", json={"rounds": 1, "directory": directory})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error.startswith("directory: directory makes paths too long (")
        assert f"{directory!r}" in error
    assert entries(data_dir) == ["service.lock"]


async def test_new_runs_live_under_runs_and_the_service_files_stay_apart(tmp_path):
    async with in_process(tmp_path) as service:
        run = (await service.post("/runs", json={"rounds": 1, "directory": "runs.d/a"})).json()
        assert run["directory"] == "runs.d/a"
        default = (await service.post("/runs", json={"rounds": 1})).json()
        assert default["directory"] == default["id"]
        for ended in (run, default):
            await wait_for_round(service, ended["id"], 1)
    assert (tmp_path / "runs" / "runs.d" / "a" / "metrics.csv").exists()
    assert (tmp_path / "runs" / default["id"] / "metrics.csv").exists()
    recorded = orjson.loads((tmp_path / "runs.json").read_bytes())
    assert sorted(record["directory"] for record in recorded) == sorted(
        ["runs/runs.d/a", f"runs/{default['id']}"]
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs", "runs.json", "service.lock"]


def old_record(run_id: str, directory: str, status: str, rounds: int) -> dict:
    config = {
        "rounds": rounds,
        "clients_per_round": 10,
        "model": "softmax",
        "client_lr": 0.02,
        "server_lr": 1.0,
        "epochs": 1,
        "batch_size": 5,
        "seed": 0,
        "directory": directory,
    }
    return {"id": run_id, "config": config, "directory": directory, "status": status, "error": None}


async def test_runs_recorded_in_the_old_layout_still_resume(tmp_path):
    # What the service before runs/ left: run directories anywhere in the data directory,
    # one of them (a run named runs.json) over the registry's own file.
    (tmp_path / "runs.json").write_bytes(
        orjson.dumps(
            [
                old_record("old", "old", "running", 2),
                old_record("wreck", "runs.json", "failed", 1),
                old_record("hidden", ".hidden", "finished", 1),
            ]
        )
    )
    async with in_process(tmp_path) as service:
        resumed = await wait_for_round(service, "old", 2)
        assert resumed["directory"] == "../old"
        listed = {run["id"]: run for run in (await service.get("/runs")).json()["runs"]}
        assert listed["wreck"]["status"] == "failed"
        assert listed["hidden"]["directory"] == "../.hidden"
    assert (tmp_path / "old" / "metrics.csv").read_text().count("\n") == 3  # header, 2 rounds


async def test_health_reports_a_registry_that_can_no_longer_write(tmp_path):
    async with in_process(tmp_path) as service:
        lasting = (await service.post("/runs", json={"rounds": 100_000, "epochs": 1})).json()
        short = (await service.post("/runs", json={"rounds": 1, "epochs": 1})).json()
        # A directory where the registry writes its index: the write at the end of the
        # short run fails.
        (tmp_path / "runs.json").unlink()
        (tmp_path / "runs.json").mkdir()
        with anyio.fail_after(120):  # a hang guard only
            while (await service.get(f"/runs/{short['id']}")).json()["status"] == "running":
                await anyio.sleep(0.1)
        health = await service.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "failed"
        assert "IsADirectoryError" in health.json()["error"]
        assert "runs.json" in health.json()["error"]

        refused = await service.post("/runs", json={"rounds": 1})
        assert refused.status_code == 503
        assert refused.json()["error"].startswith("the service cannot record its runs")
        # The other run goes on training.
        at = (await service.get(f"/runs/{lasting['id']}")).json()["round"]
        await wait_for_round(service, lasting["id"], at + 1)


async def test_a_second_service_on_the_same_data_directory_refuses_to_start(tmp_path):
    data_dir, log = tmp_path / "data", tmp_path / "server.log"
    with serving(data_dir, log, *GRACEFUL) as server:
        await server.wait_until_up()
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
            run = (await client.post("/runs", json={"rounds": 100_000})).json()
            await wait_for_round(client, run["id"], 1)
        command = [sys.executable, "-m", "samples.service"]
        second = subprocess.run(
            [*command, "--data-dir", str(data_dir), "--port", str(free_port())],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,  # a hang guard; it refuses before loading anything
            env={**os.environ, "PROGRAMLOGIC_SERVICE_TOKEN": TOKEN},
        )
        assert second.returncode == 2, second.stderr
        assert second.stderr.strip().splitlines() == [
            f"python -m samples.service: {data_dir} is in use by another service "
            f"(it holds {data_dir / 'service.lock'}): stop that one, or pick another --data-dir"
        ]
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
            assert (await client.get(f"/runs/{run['id']}")).json()["status"] == "running"
        server.terminate()
    recorded = orjson.loads((data_dir / "runs.json").read_bytes())
    assert [record["status"] for record in recorded] == ["running"]


async def test_a_second_app_on_a_locked_data_directory_fails_to_start(tmp_path):
    from samples.service.runs import DataDirectoryLockedError

    async with in_process(tmp_path) as service:
        with pytest.raises(DataDirectoryLockedError, match="in use by another service"):
            async with in_process(tmp_path):
                pass
        assert (await service.get("/health")).status_code == 200
    async with in_process(tmp_path) as service:  # released when the first one stopped
        assert (await service.get("/health")).status_code == 200


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "Invalid JSON"),
        (b'{"runs": []}', "Input should be a valid array"),
        (b'[{"id": "a"}]', "0.config: Field required; 0.directory: Field required"),
    ],
)
async def test_a_damaged_run_record_stops_the_service_with_one_line(tmp_path, content, reason):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "runs.json").write_bytes(content)
    refused = subprocess.run(
        [sys.executable, "-m", "samples.service", "--data-dir", str(data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard; it refuses before loading anything
        env={**os.environ, "PROGRAMLOGIC_SERVICE_TOKEN": TOKEN},
    )
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"python -m samples.service: {data_dir / 'runs.json'} is damaged (")
    assert reason in line and "move it aside to start with no runs recorded" in line
    assert (data_dir / "runs.json").read_bytes() == content  # left as it was
