"""The dashboard's worker table says which live workers the leader does not send new pods to (``routed`` false in
/status), in a real browser (Debian's headless Chromium), from a /status document served as the dispatcher would.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from dispatcher.server import DASHBOARD_KEY, dashboard, load_dashboard
from tests.e2e.browser import Page
from tests.status_documents import status_with, worker_row
from tests.waiting import until

READ_WORKERS = """(() => {
  const table = document.querySelector('[data-testid="workers"]');
  if (!table || document.body.dataset.loaded !== "true") return null;
  return Object.fromEntries([...table.querySelectorAll("tr[data-worker]")].map(
    (row) => [row.dataset.worker, row.children[1].textContent]));
})()"""


async def test_a_live_worker_the_leader_does_not_route_to_is_marked(browser: Page) -> None:
    async def serve_status(_request: web.Request) -> web.Response:
        status = status_with([worker_row("w-routed", alive=True, routed=True),
                              worker_row("w-new", alive=True, routed=False),
                              worker_row("w-dead", alive=False, routed=False)])
        status.generated_unix = time.time()
        return web.Response(body=status.model_dump_json(), content_type="application/json")

    app = web.Application()
    app[DASHBOARD_KEY] = load_dashboard()
    app.router.add_get("/", dashboard)
    app.router.add_get("/dashboard/{name}", dashboard)
    app.router.add_get("/status", serve_status)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port, *_ = runner.addresses[0]
    try:
        await browser.open(f"http://{host}:{port}/", width=1366, height=768)
        shown: dict[str, str] = {}

        async def read() -> tuple[bool, str]:
            shown.update(await browser.evaluate(READ_WORKERS) or {})
            return len(shown) == 3, f"rows shown: {shown}"

        await until(read, timeout=30, what="the dashboard's worker table")
    finally:
        await asyncio.wait_for(runner.cleanup(), 10)

    assert shown == {"w-routed": "yes", "w-new": "yes, not routed", "w-dead": "DEAD"}
    assert browser.errors == [], browser.errors
