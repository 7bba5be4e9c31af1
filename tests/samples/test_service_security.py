"""The sample service refuses what it must: no token, oversized or malformed bodies,
invalid configurations, weak tokens. Nothing refused starts a run or
writes a file."""

import pathlib

import pytest

from tests.samples.service_helpers import AUTH, TOKEN, in_process

pytestmark = pytest.mark.anyio

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def files_under(directory: pathlib.Path) -> list[pathlib.Path]:
    """The files under ``directory`` but the lock file every service holds in its own."""
    return sorted(
        path for path in directory.rglob("*") if path.is_file() and path.name != "service.lock"
    )


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}],
    ids=["missing", "wrong", "not-bearer"],
)
async def test_requests_without_the_token_are_401(tmp_path, headers):
    async with in_process(tmp_path / "data", token=TOKEN) as service:
        for method, path in [("GET", "/runs"), ("POST", "/runs"), ("GET", "/runs/x/events")]:
            response = await service.request(method, path, json={"rounds": 1}, headers=headers)
            assert response.status_code == 401
            assert response.json() == {"error": "missing or wrong bearer token"}
            assert response.headers["www-authenticate"] == "Bearer"
        assert (await service.get("/runs", headers=AUTH)).json() == {"runs": []}
        assert (await service.get("/health")).status_code == 200  # for load balancers
        assert (await service.get("/")).status_code == 200  # the page asks with the token
    assert files_under(tmp_path / "data") == []


async def test_an_oversized_body_is_413(tmp_path):
    async with in_process(tmp_path, max_body_bytes=1024) as service:
        padding = "x" * 2000
        declared = await service.post("/runs", json={"rounds": 1, "pad": padding})
        assert declared.status_code == 413
        assert declared.json() == {"error": "the request body is over 1024 bytes"}

        async def chunks():  # no Content-Length: the limit counts what arrives
            for _ in range(4):
                yield b'{"rounds": 1, "pad": "' + b"x" * 500

        streamed = await service.post("/runs", content=chunks(), headers=JSON)
        assert streamed.status_code == 413
        assert (await service.get("/runs")).json() == {"runs": []}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"rounds": 3', "the request body is not valid JSON: "),
        (b"[1, 2]", "the request body must be a JSON object, got list"),
        (b"", "the request body is not valid JSON: "),
    ],
)
async def test_malformed_json_is_400(tmp_path, body, error):
    async with in_process(tmp_path) as service:
        response = await service.post("/runs", content=body, headers=JSON)
        assert response.status_code == 400
        assert response.json()["error"].startswith(error)
        assert "\n" not in response.json()["error"]
        assert (await service.get("/runs")).json() == {"runs": []}
    assert files_under(tmp_path) == []


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({}, "rounds: Field required"),
        ({"rounds": 0}, "rounds: Input should be greater than or equal to 1"),
        ({"rounds": "many"}, "rounds: Input should be a valid integer"),
        ({"rounds": 1, "model": "resnet"}, "model: Input should be 'softmax', 'mlp' or 'cnn'"),
        ({"rounds": 1, "clients_per_round": 11}, "clients_per_round: Input should be less"),
        ({"rounds": 1, "lr": 0.1}, "lr: Extra inputs are not permitted"),
        ({"rounds": 1, "client_lr": -1}, "client_lr: Input should be greater than 0"),
        ({"rounds": True}, "rounds: Input should be a valid integer"),
        ({"rounds": "3"}, "rounds: Input should be a valid integer"),
        ({"rounds": 2.0}, "rounds: Input should be a valid integer"),
        ({"rounds": 1, "seed": False}, "seed: Input should be a valid integer"),
        ({"rounds": 1, "client_lr": "0.1"}, "client_lr: Input should be a valid number"),
        ({"rounds": 1, "directory": "mine"}, "directory: Extra inputs are not permitted"),
    ],
)
async def test_an_invalid_config_is_422_and_starts_nothing(tmp_path, config, error):
    async with in_process(tmp_path) as service:
        response = await service.post("/runs", json=config)
        assert response.status_code == 422
        assert response.json()["error"].startswith(error)
        assert (await service.get("/runs")).json() == {"runs": []}
    assert files_under(tmp_path) == []


@pytest.mark.parametrize(
    "token",
    [
        " " * 16,
        "0123456789 abcdef",
        "0123456789abcdef\n",
        "0123456789abcdef\x07",
        "0123456789abcdéf",
        "short",
    ],
    ids=["blank", "space", "newline", "bell", "non-ascii", "short"],
)
async def test_a_weak_or_garbled_token_is_refused(tmp_path, monkeypatch, capsys, token):
    from samples.service.__main__ import main
    from samples.service.app import create_app

    with pytest.raises(ValueError) as refused:
        create_app(tmp_path, token=token)
    assert str(refused.value) == (
        "token must be at least 16 printable ASCII characters, no whitespace"
    )
    monkeypatch.setenv("PROGRAMLOGIC_SERVICE_TOKEN", token)
    with pytest.raises(SystemExit) as exited:
        main(["--data-dir", str(tmp_path)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m samples.service: error: $PROGRAMLOGIC_SERVICE_TOKEN: {refused.value}"
    )
    assert files_under(tmp_path) == []
