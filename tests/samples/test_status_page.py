"""The status page end to end: a real server, a real run, headless Chromium looking at it;
and pages of other sites, in the same browser, failing to start runs.

Chromium is driven over its DevTools protocol (a WebSocket). It is Debian's ``chromium``
package; where it is missing the test is skipped, except in CI, which installs it.
"""

import base64
import contextlib
import functools
import http.server
import itertools
import os
import pathlib
import shutil
import subprocess
import threading
import time

import anyio
import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.samples.service_helpers import AUTH, TOKEN, Server, serving, wait_for_round

pytestmark = pytest.mark.anyio

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="needs Debian's chromium package (apt-get install chromium)",
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Browser:
    """One page of a headless Chromium, commanded over the DevTools protocol."""

    def __init__(self, socket) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    async def call(self, method: str, **params) -> dict:
        call_id = next(self.ids)
        command = {"id": call_id, "method": method, "params": params}
        await self.socket.send(orjson.dumps(command).decode())  # a text frame, as CDP wants
        while True:  # events arrive in between; the answer carries the call's id
            message = orjson.loads(await self.socket.recv())
            if message.get("id") == call_id:
                assert "error" not in message, message
                return message["result"]

    async def evaluate(self, expression: str):
        """The value of ``expression`` in the page; a promise's once it settled."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        return result["result"].get("value")


async def page_socket_url(profile, process) -> str:
    """The WebSocket address of Chromium's first page, once it is up."""
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    # Chromium creates the file before it writes the port into it.
    while not (port_file.exists() and port_file.read_text().strip()):
        assert process.poll() is None and time.monotonic() < deadline, "chromium did not start"
        await anyio.sleep(0.1)
    port = port_file.read_text().split()[0]
    async with httpx.AsyncClient() as client:
        targets = (await client.get(f"http://127.0.0.1:{port}/json/list")).json()
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


@contextlib.asynccontextmanager
async def chromium(profile: pathlib.Path, *flags: str):
    """A headless Chromium with ``flags``, its first page as a ``Browser``; killed on leaving."""
    assert CHROMIUM is not None, "CI must install chromium (apt-get install chromium)"
    browser_process = subprocess.Popen(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            # The machine has no network: no background connections to refuse.
            "--disable-quic",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            *flags,
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = await page_socket_url(profile, browser_process)
        async with connect(url, max_size=None) as socket:
            yield Browser(socket)
    finally:
        browser_process.kill()
        browser_process.wait()


async def navigate(browser: Browser, url: str) -> None:
    """Open ``url`` in the page and wait until it loaded."""
    await browser.call("Page.enable")
    await browser.call("Page.navigate", url=url)
    deadline = time.monotonic() + 60  # a hang guard
    loaded = f"location.href === {url!r} && document.readyState === 'complete'"
    while not await browser.evaluate(loaded):
        assert time.monotonic() < deadline, f"{url} did not load"
        await anyio.sleep(0.1)


@needs_chromium
async def test_the_status_page_shows_a_live_run_in_chromium(tmp_path):
    profile = tmp_path / "profile"
    with serving(tmp_path / "data", tmp_path / "server.log") as server:
        await server.wait_until_up()
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
            run = (await client.post("/runs", json={"rounds": 100_000})).json()
            await wait_for_round(client, run["id"], 1)
        async with chromium(profile) as browser:
            await browser.call(
                "Emulation.setDeviceMetricsOverride",
                width=900,
                height=640,
                deviceScaleFactor=1,
                mobile=False,
            )
            await browser.call("Page.navigate", url=f"{server.url}/#token={TOKEN}")
            deadline = time.monotonic() + 60
            loss = ""
            while not loss:  # the page fetched the runs and streams the metrics
                assert time.monotonic() < deadline, await browser.evaluate(
                    "document.body.innerText"
                )
                await anyio.sleep(0.2)
                loss = await browser.evaluate("document.getElementById('latest-loss').textContent")
            await anyio.sleep(1)  # a few more rounds on the curve
            listed = await browser.evaluate("document.getElementById('runs').innerText")
            curve = await browser.evaluate(
                "document.getElementById('curve').getAttribute('points')"
            )
            shot = await browser.call("Page.captureScreenshot", format="png")
            # The page's own origin may start and cancel runs.
            changed = await browser.evaluate(START_AND_CANCEL)
    assert changed == [201, 200, "cancelled"]
    assert 0 < float(loss) < 10
    assert run["id"] in listed and "running" in listed
    assert len(curve.split()) >= 1
    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    # PROGRAMLOGIC_SCREENSHOT=path keeps the screenshot, to look at.
    (pathlib.Path(os.environ.get("PROGRAMLOGIC_SCREENSHOT", tmp_path / "page.png"))).write_bytes(
        png
    )


START_AND_CANCEL = """(async () => {
  const started = await fetch("/runs", {
    method: "POST",
    headers: { ...headers, "Content-Type": "application/json" },
    body: JSON.stringify({ rounds: 100000, seed: 7 }),
  });
  const run = await started.json();
  const cancelled = await fetch(`/runs/${run.id}`, { method: "DELETE", headers });
  return [started.status, cancelled.status, (await cancelled.json()).status];
})()"""

CROSS_SITE_POSTS = """(async (url) => {
  const config = JSON.stringify({ rounds: 100000 });
  // A simple request: sent without a preflight; its answer is opaque to the page.
  await fetch(url, { method: "POST", mode: "no-cors", body: config });
  try {  // declared JSON: the browser asks first (a preflight), and is refused
    const json = { "Content-Type": "application/json" };
    await fetch(url, { method: "POST", headers: json, body: config });
    return "sent";
  } catch (error) {
    return error.name;
  }
})"""

REBOUND_POST = """(async () => {
  const answer = await fetch("/runs", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ rounds: 1 }),
  });
  return [answer.status, (await answer.json()).error];
})()"""


@contextlib.contextmanager
def another_site(directory: pathlib.Path):
    """A plain web server of ``directory``'s files on a loopback port: another site's."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=directory)
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield site.server_address[1]
    finally:
        site.shutdown()
        site.server_close()


@needs_chromium
async def test_pages_of_other_sites_cannot_start_runs_in_chromium(tmp_path):
    # The service without a token, on loopback: only the browser's own rules and the
    # service's Host, Origin and Content-Type checks stand between a page and it.
    log = tmp_path / "server.log"
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<title>another site</title>")
    server = Server(tmp_path / "data", log, token="")
    try:
        await server.wait_until_up()
        # Both names resolve to this machine; rebind.example as a DNS rebinding makes it.
        rules = "--host-resolver-rules=MAP other.example 127.0.0.1, MAP rebind.example 127.0.0.1"
        with another_site(tmp_path / "site") as site_port:
            async with chromium(tmp_path / "profile", rules) as browser:
                await navigate(browser, f"http://other.example:{site_port}/")
                preflighted = await browser.evaluate(
                    f"{CROSS_SITE_POSTS}({server.url + '/runs'!r})"
                )
                rebound = f"http://rebind.example:{server.port}/"
                await navigate(browser, rebound)
                shown = await browser.evaluate("document.body.innerText")
                posted = await browser.evaluate(REBOUND_POST)
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.get("/runs")).json() == {"runs": []}
    finally:
        server.kill()
    served = log.read_text()
    # The simple request arrived (with the other site's Origin), and was refused.
    assert '"POST /runs HTTP/1.1" 403' in served
    assert preflighted == "TypeError"
    host = f"rebind.example:{server.port}"
    assert f"the Host header {host!r} does not name this service" in shown
    assert posted == [421, f"the Host header {host!r} does not name this service"]
    assert '"POST /runs HTTP/1.1" 201' not in served
