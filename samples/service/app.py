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
``/`` and ``/health`` needs ``Authorization: Bearer <token>``. What a web page on
another site could make a browser send is refused: a ``Host`` header that does not name
the service (421: DNS rebinding), a POST or DELETE from a foreign ``Origin`` (403), a
body not declared ``application/json`` (415: such a cross-site request needs no CORS
preflight). Beyond ``max_running`` active runs, ``POST /runs`` answers 429.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Collection
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

from samples.service.admission import DEFAULT_MAX_RUNNING, Admission, TooManyRunsError
from samples.service.config import RunConfig, check_token
from samples.service.live_metrics import stream_points
from samples.service.runs import (
    RegistryFailedError,
    RunConflictError,
    RunNotFoundError,
    RunRegistry,
)

__all__ = ["LOOPBACK_HOSTS", "MAX_BODY_BYTES", "create_app"]

MAX_BODY_BYTES = 16 * 1024
"""The largest request body accepted; a run's configuration is a few hundred bytes."""

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
"""The names a service listening on loopback answers to, in ``Host`` and ``Origin``."""

_OPEN_PATHS = ("/", "/health")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def create_app(
    data_dir: str | Path,
    *,
    token: str | None = None,
    allowed_hosts: Collection[str] = LOOPBACK_HOSTS,
    max_running: int = DEFAULT_MAX_RUNNING,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The service over ``data_dir``: its runs start, and unfinished ones resume, at startup.

    ``token``: when given, requests need it as a bearer token (401 otherwise); it must
    be 16 printable ASCII characters or more, without whitespace (``ValueError``).
    ``allowed_hosts``: the host names (IPv6 addresses in brackets) that requests may
    name in ``Host``, at the port the service listens on (421 otherwise); own origins
    are ``http://`` these. ``max_running``: the most runs trained at once; beyond it
    ``POST /runs`` answers 429.
    """
    if token is not None:
        check_token(token)
    if not allowed_hosts:
        raise ValueError("allowed_hosts must name at least one host")
    admission = Admission(max_running)
    data_dir = Path(data_dir)
    page = resources.files("samples.service").joinpath("page.html").read_text()

    async def status_page(request: Request) -> Response:
        return HTMLResponse(page)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        registry = RunRegistry(data_dir, admission)
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
    # The last added runs first: Host, then Origin, then the token, the size, the type.
    app.add_middleware(JSONBody)
    app.add_middleware(BearerToken, token=token)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    hosts = frozenset(host.lower() for host in allowed_hosts)
    app.add_middleware(SameOrigin, hosts=hosts)
    app.add_middleware(AllowedHosts, hosts=hosts)
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
    except RegistryFailedError as error:
        return _error(503, str(error))
    except RunConflictError as error:
        return _error(409, str(error))
    except TooManyRunsError as error:
        response = _error(429, str(error))
        response.headers["Retry-After"] = str(error.retry_after)
        return response
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
    except RegistryFailedError as error:
        return _error(503, str(error))
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


class AllowedHosts:
    """Refuses requests whose ``Host`` header names no host of the service (421).

    A page on another site that rebinds its own name to this machine's address
    (DNS rebinding) reaches the service in the browser's eyes same-origin, but its
    requests carry that site's name in ``Host``.
    """

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host").decode("latin-1")
        if _names_service(host, self.hosts, scope):
            await self.app(scope, receive, send)
            return
        message = (
            f"the Host header {host!r} does not name this service" if host else "no Host header"
        )
        await _error(421, message)(scope, receive, send)


class SameOrigin:
    """Refuses requests that change runs (not GET, HEAD, OPTIONS) from a foreign ``Origin`` (403).

    Own origins are ``http://`` followed by an allowed host at the service's port.
    Requests without ``Origin`` (not from a browser) pass.
    """

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        origin = _header(scope, b"origin").decode("latin-1")
        scheme, separator, authority = origin.partition("://")
        if not origin or (
            separator
            and scheme.lower() == scope.get("scheme", "http")
            and _names_service(authority, self.hosts, scope)
        ):
            await self.app(scope, receive, send)
            return
        message = f"requests from the origin {origin!r} may not change runs"
        await _error(403, message)(scope, receive, send)


class JSONBody:
    """Refuses request bodies not declared ``Content-Type: application/json`` (415).

    A cross-site form or ``text/plain`` request is sent by browsers without asking the
    service first (no CORS preflight); one declared JSON is not.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (
            scope["method"] in _BODY_METHODS
            or _header(scope, b"content-length") not in (b"", b"0")
            or _header(scope, b"transfer-encoding")
        ):
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-type").decode("latin-1")
        if declared.partition(";")[0].strip().lower() == "application/json":
            await self.app(scope, receive, send)
            return
        got = repr(declared) if declared else "none"
        await _error(415, f"Content-Type must be application/json, got {got}")(scope, receive, send)


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


def _names_service(authority: str, hosts: Collection[str], scope: Scope) -> bool:
    """Whether ``authority`` (``name[:port]``) is an allowed host at the listening port.

    Without a port it means port 80. When the server does not say its port (a Unix
    socket, which browsers cannot reach), any port is taken.
    """
    if authority.startswith("["):
        end = authority.find("]") + 1
        if end == 0:
            return False
        name, rest = authority[:end], authority[end:]
    else:
        name, colon, port_text = authority.partition(":")
        rest = colon + port_text
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return False
    port = int(rest[1:]) if rest else 80
    server = scope.get("server")
    listening = server[1] if server and server[1] is not None else port
    return name.lower() in hosts and port == listening


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return b""
