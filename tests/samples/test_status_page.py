"""The status page end to end: a real server, a real run, headless Chromium looking at it.

Chromium is driven over its DevTools protocol (a WebSocket). It is Debian's ``chromium``
package; where it is missing the test is skipped, except in CI, which installs it.
"""

import base64
import itertools
import os
import pathlib
import shutil
import subprocess
import time

import anyio
import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.samples.service_helpers import AUTH, TOKEN, serving, wait_for_round

pytestmark = pytest.mark.anyio

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


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
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
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


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="needs Debian's chromium package (apt-get install chromium)",
)
async def test_the_status_page_shows_a_live_run_in_chromium(tmp_path):
    assert CHROMIUM is not None, "CI must install chromium (apt-get install chromium)"
    profile = tmp_path / "profile"
    with serving(tmp_path / "data", tmp_path / "server.log") as server:
        await server.wait_until_up()
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
            run = (await client.post("/runs", json={"rounds": 100_000})).json()
            await wait_for_round(client, run["id"], 1)
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
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = await page_socket_url(profile, browser_process)
            async with connect(url, max_size=None) as socket:
                browser = Browser(socket)
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
                    loss = await browser.evaluate(
                        "document.getElementById('latest-loss').textContent"
                    )
                await anyio.sleep(1)  # a few more rounds on the curve
                listed = await browser.evaluate("document.getElementById('runs').innerText")
                curve = await browser.evaluate(
                    "document.getElementById('curve').getAttribute('points')"
                )
                shot = await browser.call("Page.captureScreenshot", format="png")
        finally:
            browser_process.kill()
            browser_process.wait()
    assert 0 < float(loss) < 10
    assert run["id"] in listed and "running" in listed
    assert len(curve.split()) >= 1
    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    # PROGRAMLOGIC_SCREENSHOT=path keeps the screenshot, to look at.
    (pathlib.Path(os.environ.get("PROGRAMLOGIC_SCREENSHOT", tmp_path / "page.png"))).write_bytes(
        png
    )
