"""The sample service's own files: runs kept apart from them under ``runs/``, a registry
that cannot write refusing what it cannot record, and the data directory locked against
a second service."""

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


async def test_runs_live_under_runs_and_the_service_files_stay_apart(tmp_path):
    async with in_process(tmp_path) as service:
        run = (await service.post("/runs", json={"rounds": 1})).json()
        await wait_for_round(service, run["id"], 1)
    assert (tmp_path / "runs" / run["id"] / "metrics.csv").exists()
    assert [record["id"] for record in orjson.loads((tmp_path / "runs.json").read_bytes())] == [
        run["id"]
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs", "runs.json", "service.lock"]


async def test_a_registry_that_cannot_write_refuses_new_runs_and_health_tells(tmp_path):
    async with in_process(tmp_path) as service:
        lasting = (await service.post("/runs", json={"rounds": 100_000, "epochs": 1})).json()
        short = (await service.post("/runs", json={"rounds": 1, "epochs": 1})).json()
        # A directory where the registry writes its index: the write at the end of the
        # short run fails.
        (tmp_path / "runs.json").unlink()
        (tmp_path / "runs.json").mkdir()
        # The run is seen finished just before the registry records it: wait for both.
        with anyio.fail_after(120):  # a hang guard only
            while (await service.get(f"/runs/{short['id']}")).json()["status"] == "running" or (
                health := await service.get("/health")
            ).status_code == 200:
                await anyio.sleep(0.1)
        assert health.status_code == 503
        assert health.json()["status"] == "failed"
        assert "IsADirectoryError" in health.json()["error"]
        assert "runs.json" in health.json()["error"]

        refused = await service.post("/runs", json={"rounds": 1})
        assert refused.status_code == 503
        assert refused.json()["error"].startswith("the service cannot record its runs (")
        not_cancelled = await service.delete(f"/runs/{lasting['id']}")
        assert not_cancelled.status_code == 503
        listed = [(run["id"], run["status"]) for run in (await service.get("/runs")).json()["runs"]]
        assert listed == [(lasting["id"], "running"), (short["id"], "finished")]
        assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == sorted(
            [lasting["id"], short["id"]]
        )
        # The other run goes on training.
        at = (await service.get(f"/runs/{lasting['id']}")).json()["round"]
        await wait_for_round(service, lasting["id"], at + 1)

        (tmp_path / "runs.json").rmdir()  # fixed: the next write records every run
        assert (await service.delete(f"/runs/{lasting['id']}")).status_code == 200
        assert (await service.get("/health")).json() == {"status": "ok", "running": 0}
    recorded = orjson.loads((tmp_path / "runs.json").read_bytes())
    assert [(record["id"], record["status"]) for record in recorded] == [
        (lasting["id"], "cancelled"),
        (short["id"], "finished"),
    ]


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
    from samples.service.runs import DataDirectoryError

    async with in_process(tmp_path) as service:
        with pytest.raises(DataDirectoryError, match="in use by another service"):
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
        (b'[{"id": "../a", "config": {"rounds": 1}}]', "0.id: String should match pattern"),
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
