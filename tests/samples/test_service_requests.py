"""The sample service refuses what a web page elsewhere could make a browser send it:
bodies that are not declared JSON (a cross-site form or ``text/plain`` fetch needs no
preflight), ``Host`` headers naming another site (DNS rebinding), and state-changing
requests from foreign origins. Nothing refused starts or cancels a run.
"""

import subprocess
import sys

import pytest

from samples.service.app import create_app
from tests.samples.service_helpers import REPO, TOKEN, in_process

pytestmark = pytest.mark.anyio

CONFIG = b'{"rounds": 1}'


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("content_type", "error"),
    [
        ("text/plain", "Content-Type must be application/json, got 'text/plain'"),
        (
            "application/x-www-form-urlencoded",
            "Content-Type must be application/json, got 'application/x-www-form-urlencoded'",
        ),
        (None, "Content-Type must be application/json, got none"),
    ],
)
async def test_a_body_not_declared_json_is_415_and_starts_nothing(tmp_path, content_type, error):
    headers = {} if content_type is None else {"Content-Type": content_type}
    async with in_process(tmp_path) as service:
        response = await service.post("/runs", content=CONFIG, headers=headers)
        assert response.status_code == 415
        assert response.json() == {"error": error}
        assert (await service.get("/runs")).json() == {"runs": []}
        declared = {"Content-Type": "application/json; charset=utf-8"}
        accepted = await service.post("/runs", content=CONFIG, headers=declared)
        assert accepted.status_code == 201, accepted.text


@pytest.mark.parametrize(
    "host",
    ["evil.example:8000", "evil.example", "127.0.0.1:9999", "localhost", "127.0.0.1:8000.evil"],
)
async def test_a_host_header_naming_another_site_is_421(tmp_path, host):
    async with in_process(tmp_path) as service:
        for method, path in [("GET", "/runs"), ("POST", "/runs"), ("GET", "/")]:
            response = await service.request(method, path, content=CONFIG, headers={"Host": host})
            assert response.status_code == 421
            assert response.json() == {
                "error": f"the Host header {host!r} does not name this service"
            }
        assert (await service.get("/runs")).json() == {"runs": []}


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST:8000", "[::1]:8000"]
)
async def test_the_loopback_names_at_the_listening_port_are_served(tmp_path, host):
    async with in_process(tmp_path) as service:
        response = await service.get("/runs", headers={"Host": host})
        assert response.status_code == 200 and response.json() == {"runs": []}


async def test_beyond_loopback_only_the_given_names_are_served(tmp_path):
    hosts = ["192.0.2.7", "trainer.example"]
    async with in_process(tmp_path, token=TOKEN, allowed_hosts=hosts) as service:
        for host, status in [
            ("trainer.example:8000", 401),  # served: the token is asked for
            ("192.0.2.7:8000", 401),
            ("localhost:8000", 421),
            ("127.0.0.1:8000", 421),
        ]:
            assert (await service.get("/runs", headers={"Host": host})).status_code == status


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "http://127.0.0.1:9999", "null", "https://127.0.0.1:8000"]
)
async def test_a_foreign_origin_cannot_start_or_cancel_runs(tmp_path, origin):
    json = {"Content-Type": "application/json"}
    async with in_process(tmp_path) as service:
        own = await service.post("/runs", content=b'{"rounds": 100000}', headers=json)
        assert own.status_code == 201
        run_id = own.json()["id"]
        refused = [
            await service.post("/runs", content=CONFIG, headers={**json, "Origin": origin}),
            await service.delete(f"/runs/{run_id}", headers={"Origin": origin}),
        ]
        for response in refused:
            assert response.status_code == 403
            assert response.json() == {
                "error": f"requests from the origin {origin!r} may not change runs"
            }
        runs = (await service.get("/runs", headers={"Origin": origin})).json()["runs"]
        assert [(run["id"], run["status"]) for run in runs] == [(run_id, "running")]
        for own_origin in ("http://127.0.0.1:8000", "http://localhost:8000"):
            started = await service.post(
                "/runs", content=CONFIG, headers={**json, "Origin": own_origin}
            )
            assert started.status_code == 201, started.text
        cancelled = await service.delete(f"/runs/{run_id}", headers={"Origin": own_origin})
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


async def test_serving_on_every_address_needs_the_names_clients_use(tmp_path):
    refused = subprocess.run(
        [sys.executable, "-m", "samples.service", "--host", "0.0.0.0", "--data-dir", tmp_path],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PROGRAMLOGIC_SERVICE_TOKEN": TOKEN},
    )
    assert refused.returncode == 2
    assert "listening on 0.0.0.0 needs --allowed-host NAME" in refused.stderr
    assert not any(tmp_path.iterdir())


async def test_create_app_refuses_an_empty_host_list(tmp_path):
    with pytest.raises(ValueError, match="allowed_hosts must name at least one host"):
        create_app(tmp_path, allowed_hosts=[])
