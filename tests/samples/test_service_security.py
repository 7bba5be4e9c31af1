"""The sample service refuses what it must: no token, paths out of its data directory,
oversized or malformed bodies, invalid configurations. Nothing refused starts a run or
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


@pytest.mark.parametrize(
    "directory",
    ["../escape", "runs/../../escape", "/tmp/elsewhere", ".", "link/run"],
)
async def test_directories_outside_the_data_directory_are_refused(tmp_path, directory):
    data_dir, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    (data_dir / "runs").mkdir(parents=True)
    (data_dir / "runs" / "link").symlink_to(outside)
    async with in_process(data_dir) as service:
        response = await service.post("/runs", json={"rounds": 1, "directory": directory})
        assert response.status_code == 422
        assert response.json()["error"].startswith("directory: directory must ")
        assert directory in response.json()["error"]
        assert (await service.get("/runs")).json() == {"runs": []}
    assert files_under(tmp_path) == []


async def test_a_directory_in_use_or_existing_is_a_conflict(tmp_path):
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    async with in_process(tmp_path) as service:
        response = await service.post("/runs", json={"rounds": 1, "directory": "taken"})
        assert response.status_code == 409
        assert response.json() == {"error": "directory 'taken' exists already"}
        first = await service.post("/runs", json={"rounds": 2, "directory": "a"})
        assert first.status_code == 201
        inside = await service.post("/runs", json={"rounds": 2, "directory": "a/b"})
        assert inside.status_code == 409
        assert inside.json()["error"].startswith("directory 'a/b' overlaps the directory of run")


async def test_an_oversized_body_is_413(tmp_path):
    async with in_process(tmp_path, max_body_bytes=1024) as service:
        padding = "x" * 2000
        declared = await service.post("/runs", json={"rounds": 1, "directory": padding})
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
        ({"rounds": 1, "directory": 7}, "directory: Input should be a valid string"),
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
    ("token", "error"),
    [
        (" " * 16, "token must not contain whitespace or control characters"),
        ("0123456789 abcdef", "token must not contain whitespace or control characters"),
        ("0123456789abcdef\n", "token must not contain whitespace or control characters"),
        ("0123456789abcdef\x07", "token must not contain whitespace or control characters"),
        ("0123456789abcdéf", "token must be printable ASCII"),
        ("short", "token must be at least 16 characters long"),
    ],
    ids=["blank", "space", "newline", "bell", "non-ascii", "short"],
)
async def test_a_weak_or_garbled_token_is_refused(tmp_path, monkeypatch, capsys, token, error):
    from samples.service.__main__ import main
    from samples.service.app import create_app

    with pytest.raises(ValueError) as refused:
        create_app(tmp_path, token=token)
    assert str(refused.value).startswith(error)
    monkeypatch.setenv("PROGRAMLOGIC_SERVICE_TOKEN", token)
    with pytest.raises(SystemExit) as exited:
        main(["--data-dir", str(tmp_path)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m samples.service: error: $PROGRAMLOGIC_SERVICE_TOKEN: {refused.value}"
    )
    assert files_under(tmp_path) == []
