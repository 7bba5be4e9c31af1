"""The HTTP API of the training service, a Starlette application.

    GET /  the status page            GET /health  {"status": "ok", "running": N}, no token
    POST /runs  start a run (JSON)    GET /runs, GET /runs/{id}  runs: status, metrics, times
    DELETE /runs/{id}  cancel it      GET /runs/{id}/events  its metrics as server-sent events
    GET /runs/{id}/models/{name}  a model file it saved

Errors are ``{"error": "one line"}``. With a token, all but ``/`` and ``/health`` need
``Authorization: Bearer <token>``. Refused, as a page of another site could send them: a
``Host`` not naming the service (421: DNS rebinding), a POST or DELETE from a foreign
``Origin`` (403), a body not declared JSON (415: it would need no CORS preflight).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from collections.abc import AsyncIterator, Collection
from importlib import resources
from pathlib import Path

from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.authentication import AuthenticationBackend, AuthenticationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from samples.service.live_metrics import stream
from samples.service.runs import RunRegistry

__all__ = ["LOOPBACK_HOSTS", "MAX_BODY_BYTES", "allowed_hosts", "check_token", "create_app"]

MAX_BODY_BYTES = 16 * 1024  # a run's configuration is a few hundred bytes
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
"""The names a service listening on loopback answers to, in ``Host`` and ``Origin``."""


def check_token(token: str) -> None:
    """``ValueError`` (not naming the token) unless ``token`` is at least 16 printable ASCII
    characters without whitespace: a bearer token that survives a header."""
    if len(token) < 16 or not all("!" <= character <= "~" for character in token):
        raise ValueError("token must be at least 16 printable ASCII characters, no whitespace")


def create_app(
    data_dir: str | Path,
    *,
    token: str | None = None,
    allowed_hosts: Collection[str] = LOOPBACK_HOSTS,
    max_running: int = 4,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The service over ``data_dir``, its unfinished runs resumed at startup.

    ``token``: the bearer token requests need (401 otherwise). ``allowed_hosts``: the
    names (IPv6 addresses in brackets) requests may give in ``Host``, at the listening
    port (421 otherwise); own origins are ``http://`` these. ``max_running``: the most
    runs trained at once (429 beyond). Holds ``data_dir`` (see :class:`RunRegistry`).
    """
    if token is not None:
        check_token(token)
    if not allowed_hosts:
        raise ValueError("allowed_hosts must name at least one host")
    page = resources.files("samples.service").joinpath("page.html").read_text()
    registry = RunRegistry(Path(data_dir), max_running)

    middleware = [Middleware(SameSite, hosts={host.lower() for host in allowed_hosts})]
    if token is not None:
        middleware.append(
            Middleware(AuthenticationMiddleware, backend=BearerToken(token), on_error=unauthorized)
        )

    async def status_page(request: Request) -> Response:
        return HTMLResponse(page)

    app = Starlette(
        routes=[
            Route("/", status_page),
            Route("/health", health),
            Route("/runs", list_runs, methods=["GET"]),
            Route("/runs", start_run, methods=["POST"]),
            Route("/runs/{run_id}", get_run, methods=["GET"]),
            Route("/runs/{run_id}", cancel_run, methods=["DELETE"]),
            Route("/runs/{run_id}/events", run_events),
            Route("/runs/{run_id}/models/{name}", model_file),
        ],
        middleware=middleware,
        exception_handlers={HTTPException: http_error},
        lifespan=lambda app: registry.open(),  # its end interrupts the runs: they resume
    )
    app.state.registry, app.state.max_body_bytes = registry, max_body_bytes
    return app


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status``."""
    return JSONResponse({"error": message}, status, headers)


async def http_error(request: Request, refused: Exception) -> Response:
    assert isinstance(refused, HTTPException)
    return error(refused.status_code, refused.detail, refused.headers)


def unauthorized(connection: HTTPConnection, refused: Exception) -> Response:
    return error(401, str(refused), {"WWW-Authenticate": "Bearer"})


class BearerToken(AuthenticationBackend):
    """Asks every request but those of ``/`` and ``/health`` for ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}".encode()

    async def authenticate(self, connection: HTTPConnection) -> None:
        given = connection.headers.get("authorization", "").encode("latin-1")
        if connection.url.path not in ("/", "/health") and not secrets.compare_digest(
            given, self.expected
        ):
            raise AuthenticationError("missing or wrong bearer token")


def _registry(request: Request) -> RunRegistry:
    return request.app.state.registry


async def health(request: Request) -> Response:
    registry = _registry(request)
    if registry.failure is not None:
        return JSONResponse({"status": "failed", "error": registry.failure}, 503)
    running = sum(run.status == "running" for run in registry.runs.values())
    return JSONResponse({"status": "ok", "running": running})


async def list_runs(request: Request) -> Response:
    return JSONResponse({"runs": [run.summary() for run in _registry(request).runs.values()]})


async def start_run(request: Request) -> Response:
    declared = request.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != "application/json":
        got = repr(declared) if declared else "none"
        return error(415, f"Content-Type must be application/json, got {got}")
    limit = request.app.state.max_body_bytes
    too_large = error(413, f"the request body is over {limit} bytes")
    body = b""
    async for chunk in request.stream():  # without Content-Length, what arrives counts
        body += chunk
        if len(body) > limit:
            return too_large
    try:
        config = json.loads(body)
    except ValueError as invalid:  # not JSON, or not UTF-8
        return error(400, f"the request body is not valid JSON: {invalid}")
    if not isinstance(config, dict):
        return error(400, f"the request body must be a JSON object, got {type(config).__name__}")
    return JSONResponse((await _registry(request).create(config)).summary(), 201)


async def get_run(request: Request) -> Response:
    return JSONResponse(_registry(request).get(request.path_params["run_id"]).summary())


async def cancel_run(request: Request) -> Response:
    return JSONResponse((await _registry(request).cancel(request.path_params["run_id"])).summary())


async def run_events(request: Request) -> Response:
    """``metrics`` and ``evaluation`` events (a point each), then one ``end`` event."""
    run = _registry(request).get(request.path_params["run_id"])

    async def events() -> AsyncIterator[dict[str, str]]:
        async for kind, point in stream(metrics=run.metrics, evaluation=run.evaluation):
            yield {"event": kind, "data": json.dumps(point)}
        await run.done.wait()
        yield {"event": "end", "data": json.dumps(run.summary())}

    return EventSourceResponse(events(), ping=15)


async def model_file(request: Request) -> Response:
    """A model the run saved: only names listed in its ``models``."""
    registry = _registry(request)
    run, name = registry.get(request.path_params["run_id"]), request.path_params["name"]
    if name not in run.models:
        return error(404, f"run {run.id} has no model {name!r}")
    return FileResponse(registry.path(run) / "models" / name, filename=name)


def allowed_hosts(host: str, extra: Collection[str] = ()) -> list[str]:
    """The names a service listening on ``host`` answers to: its address and ``extra``."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return [*LOOPBACK_HOSTS, *extra] if host == "localhost" else [host, *extra]
    if address.is_loopback:
        return [*LOOPBACK_HOSTS, *extra]
    if address.is_unspecified:  # every address: no name of its own
        return list(extra)
    return [f"[{host}]" if address.version == 6 else host, *extra]


class SameSite:
    """Refuses a ``Host`` naming no host of the service (421, naming it) and a request
    that changes runs (not GET, HEAD, OPTIONS) from a foreign ``Origin`` (403); requests
    without ``Origin`` (not from a browser) pass. Not Starlette's ``TrustedHostMiddleware``:
    it answers a bare 400, ignores the port, and does not look at ``Origin``.
    """

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            host, origin = headers.get("host", ""), headers.get("origin", "")
            scheme, _, authority = origin.partition("://")
            if not self._names_service(host, scope):
                message = f"the Host header {host!r} does not name this service"
                return await error(421, message if host else "no Host header")(scope, receive, send)
            own = scheme.lower() == scope.get("scheme", "http") and self._names_service(
                authority, scope
            )
            if origin and not own and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
                message = f"requests from the origin {origin!r} may not change runs"
                return await error(403, message)(scope, receive, send)
        await self.app(scope, receive, send)

    def _names_service(self, authority: str, scope: Scope) -> bool:
        """Whether ``authority`` (``name[:port]``, port 80 if none) is an allowed host at
        the listening port (any on a Unix socket)."""
        name, colon, port = authority.lower().rpartition(":")
        if not colon or "]" in port:  # no port: "name" or "[v6 address]"
            name, port = authority.lower(), "80"
        listening = (scope.get("server") or (None, None))[1]
        return name in self.hosts and port == str(listening or port)
