"""The HTTP API of the training service, a Starlette application.

    GET    /                    the status page (runs and a live loss curve)
    GET    /health              {"status": "ok", "running": N}; needs no token; 503 and
                                {"status": "failed", "error": ...} if the registry failed
    POST   /runs                start a run from a JSON RunConfig -> 201 and the run
    GET    /runs                every run: status, round, latest metrics
    GET    /runs/{id}           one run
    GET    /runs/{id}/events    its metrics as server-sent events, past ones first
    DELETE /runs/{id}           cancel it; it stops within a round, checkpoints intact

Errors are ``{"error": "one line"}`` with a 4xx status. With a token, every route but
``/`` and ``/health`` needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import orjson
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from samples.service.config import RunConfig, check_token
from samples.service.live_metrics import stream_points
from samples.service.runs import RunConflictError, RunNotFoundError, RunRegistry

__all__ = ["MAX_BODY_BYTES", "create_app"]

MAX_BODY_BYTES = 16 * 1024
"""The largest request body accepted; a run's configuration is a few hundred bytes."""

_OPEN_PATHS = ("/", "/health")


def create_app(
    data_dir: str | Path, *, token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES
) -> Starlette:
    """The service over ``data_dir``: its runs start, and unfinished ones resume, at startup.

    ``token``: when given, requests need it as a bearer token (401 otherwise); it must
    be 16 printable ASCII characters or more, without whitespace (``ValueError``).
    """
    if token is not None:
        check_token(token)
    data_dir = Path(data_dir)
    page = resources.files("samples.service").joinpath("page.html").read_text()

    async def status_page(request: Request) -> Response:
        return HTMLResponse(page)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        registry = RunRegistry(data_dir)
        async with anyio.create_task_group() as task_group:
            await registry.open(task_group)
            app.state.registry = registry
            try:
                yield
            finally:
                # Shutting down interrupts the runs without marking them: the next start
                # resumes them from their last checkpoint.
                task_group.cancel_scope.cancel()

    app = Starlette(
        routes=[
            Route("/", status_page),
            Route("/health", health),
            Route("/runs", list_runs, methods=["GET"]),
            Route("/runs", start_run, methods=["POST"]),
            Route("/runs/{run_id}", get_run, methods=["GET"]),
            Route("/runs/{run_id}", cancel_run, methods=["DELETE"]),
            Route("/runs/{run_id}/events", run_events),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.add_middleware(BearerToken, token=token)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    return app


def _registry(request: Request) -> RunRegistry:
    return request.app.state.registry


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code, media_type="application/json")


def _error(status_code: int, message: str) -> Response:
    return _json({"error": message}, status_code)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    return _error(error.status_code, error.detail)


async def health(request: Request) -> Response:
    registry = _registry(request)
    if registry.failure is not None:
        return _json({"status": "failed", "error": registry.failure}, 503)
    running = sum(run.status == "running" for run in registry.runs)
    return _json({"status": "ok", "running": running})


async def list_runs(request: Request) -> Response:
    registry = _registry(request)
    return _json({"runs": [run.summary(registry.data_dir) for run in registry.runs]})


async def start_run(request: Request) -> Response:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as error:
        return _error(400, f"the request body is not valid JSON: {error}")
    if not isinstance(body, dict):
        return _error(400, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        config = RunConfig.model_validate(body)
    except ValidationError as error:
        return _error(422, _one_line(error))
    registry = _registry(request)
    try:
        run = await registry.create(config)
    except ValueError as error:
        return _error(422, f"directory: {error}")
    except RunConflictError as error:
        return _error(409, str(error))
    return _json(run.summary(registry.data_dir), 201)


async def get_run(request: Request) -> Response:
    registry = _registry(request)
    try:
        run = registry.get(request.path_params["run_id"])
    except RunNotFoundError as error:
        return _error(404, str(error))
    return _json(run.summary(registry.data_dir))


async def cancel_run(request: Request) -> Response:
    registry = _registry(request)
    try:
        run = await registry.cancel(request.path_params["run_id"])
    except RunNotFoundError as error:
        return _error(404, str(error))
    except RunConflictError as error:
        return _error(409, str(error))
    return _json(run.summary(registry.data_dir))


async def run_events(request: Request) -> Response:
    """``metrics`` events (a point each) while the run trains, then one ``end`` event."""
    registry = _registry(request)
    try:
        run = registry.get(request.path_params["run_id"])
    except RunNotFoundError as error:
        return _error(404, str(error))

    async def events() -> AsyncIterator[dict[str, str]]:
        async for point in stream_points(run.live):
            yield {"event": "metrics", "data": orjson.dumps(point).decode()}
        await run.ended.wait()
        yield {"event": "end", "data": orjson.dumps(run.summary(registry.data_dir)).decode()}

    return EventSourceResponse(events(), ping=15)


def _one_line(error: ValidationError) -> str:
    """Pydantic's errors as ``field: message`` pairs on one line."""
    parts = []
    for detail in error.errors(include_url=False):
        field = ".".join(str(part) for part in detail["loc"]) or "body"
        parts.append(f"{field}: {detail['msg']}")
    return "; ".join(parts)


class BearerToken:
    """Refuses requests without ``Authorization: Bearer <token>`` (401), if a token is set."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.expected = None if token is None else f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.expected is None
            or scope["type"] != "http"
            or scope["path"] in _OPEN_PATHS
            or secrets.compare_digest(_header(scope, b"authorization"), self.expected)
        ):
            await self.app(scope, receive, send)
            return
        response = _error(401, "missing or wrong bearer token")
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


class BodySizeLimit:
    """Refuses request bodies over ``max_bytes`` (413), declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _error(413, f"the request body is over {self.max_bytes} bytes")
        declared = _header(scope, b"content-length")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except _BodyTooLarge:
            if started:
                raise
            await too_large(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return b""
