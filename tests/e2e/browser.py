"""Debian's headless Chromium driven over the DevTools protocol (its websocket, through aiohttp).

Just what a page test needs: open a URL, evaluate JavaScript and read the value, take a PNG screenshot, and
collect the page's uncaught exceptions and console errors so a test can fail on them. No browser-automation
package: the Debian packages ``chromium`` and ``chromium-driver`` are the whole dependency.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.waiting import until

CHROMIUM = Path("/usr/bin/chromium")
MISSING = (f"{CHROMIUM} is missing: the browser test needs Debian's chromium; `make test` installs it "
           "(apt-get install chromium chromium-driver)")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
)
START_TIMEOUT_SECONDS = 30.0
CALL_TIMEOUT_SECONDS = 30.0


class BrowserError(RuntimeError):
    """Chromium did not start, or a DevTools call failed."""


class Page:
    """One tab, over its DevTools websocket. Uncaught exceptions and console errors land in `errors`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.errors: list[str] = []
        self._reader = asyncio.create_task(self._read(), name="devtools-reader")

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and wait for its result."""
        call_id = next(self._ids)
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[call_id] = reply
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        try:
            async with asyncio.timeout(CALL_TIMEOUT_SECONDS):
                message = await reply
        finally:
            self._replies.pop(call_id, None)
        if "error" in message:
            raise BrowserError(f"{method} failed: {message['error']}")
        result: dict[str, Any] = message.get("result", {})
        return result

    async def open(self, url: str, *, width: int, height: int) -> None:
        await self.call("Runtime.enable")
        await self.call("Page.enable")
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                        mobile=False)
        navigation = await self.call("Page.navigate", url=url)
        if navigation.get("errorText"):
            raise BrowserError(f"cannot open {url}: {navigation['errorText']}")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-like values only)."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluating {expression[:60]!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path, *, full_page: bool = False) -> None:
        """A PNG of the viewport, or of the whole page (the viewport is stretched to the content's height)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await self.call("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        shot = await self.call("Page.captureScreenshot", **params)
        await asyncio.to_thread(_write, path, base64.b64decode(shot["data"]))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data: dict[str, Any] = message.json()
            if "id" in data:
                reply = self._replies.get(data["id"])
                if reply is not None and not reply.done():
                    reply.set_result(data)
            else:
                self._note(data.get("method", ""), data.get("params", {}))
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(BrowserError("the DevTools connection closed"))

    def _note(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.errors.append(f"uncaught: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append("console.error: " + " ".join(
                str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", [])))


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


async def _devtools_port(profile: Path, process: asyncio.subprocess.Process, log: Path) -> int:
    """The port Chromium's DevTools listen on, from the file it writes in its profile once they do."""
    port_file = profile / "DevToolsActivePort"
    port: list[int] = []

    async def written() -> tuple[bool, str]:
        if process.returncode is not None:
            output = await asyncio.to_thread(log.read_text, errors="replace")
            raise BrowserError(f"chromium exited with {process.returncode}: {output[-2000:]}")
        if await asyncio.to_thread(port_file.exists):
            port[:] = [int(line) for line in (await asyncio.to_thread(port_file.read_text)).split()[:1]]
        return bool(port), f"no port in {port_file} yet"

    await until(written, timeout=START_TIMEOUT_SECONDS, what=f"chromium to open its DevTools port (log: {log})")
    return port[0]


async def _stop(process: asyncio.subprocess.Process) -> None:
    """End the browser, then whatever of its helpers is left: they run in the browser's own process group."""
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            process.kill()
            await process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def chromium(workdir: Path) -> AsyncIterator[Page]:
    """A fresh headless Chromium (profile and log in `workdir`) and its first tab; stopped on exit."""
    profile = workdir / "chromium-profile"
    await asyncio.to_thread(profile.mkdir, parents=True)
    log = workdir / "chromium.log"
    log_file = await asyncio.to_thread(log.open, "wb")
    try:
        process = await asyncio.create_subprocess_exec(
            str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank",
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
    finally:
        log_file.close()
    try:
        port = await _devtools_port(profile, process, log)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            page_url = next((t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page"), None)
            if page_url is None:
                raise BrowserError(f"chromium has no page to drive: {targets}")
            ws = await http.ws_connect(page_url, max_msg_size=0)
            page = Page(ws)
            try:
                yield page
            finally:
                await page.close()
    finally:
        await _stop(process)
