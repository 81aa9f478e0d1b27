"""The worker's HTTP server: /healthz, /readyz, /metrics and /status (the last two behind hoss.kube.access when
``--access=kubernetes``)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from hoss.kube.access import TokenAccess, middleware
from workers.core import Worker


def build_app(worker: Worker, *, access: TokenAccess | None = None) -> web.Application:
    """The routes; with ``access``, /status and /metrics need a bearer token it accepts."""
    app = web.Application(middlewares=[middleware(access)] if access is not None else [])

    async def healthz(_request: web.Request) -> web.Response:
        unwell = worker.supervisor.health()
        if unwell:
            return web.Response(status=500, text="".join(f"loop {name} {why}\n" for name, why in unwell.items()))
        return web.Response(text="ok")

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(worker.tally.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status(_request: web.Request) -> web.Response:
        info = worker.info()
        events = worker.notices.events
        return web.json_response({"id": info.id, "policies": info.policies, "queue_depth": info.queue_depth,
                                  "in_flight": info.in_flight, "nodes": len(worker.nodes.names),
                                  "counters": info.counters, "progress": info.progress,
                                  "requeues": worker.requeues, "unhealthy": worker.supervisor.health(),
                                  "feed": {"position": worker.feed.position, "epoch": worker.feed.epoch,
                                           "applied": worker.feed.applied, "reads": worker.feed.reads,
                                           "reloads": worker.feed.reloads},
                                  "policies_file": worker.policies_file.status(),
                                  "events": None if events is None else {
                                      "posted": events.posted, "failed": events.failed,
                                      "dropped": events.dropped, "queued": events.queued}})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)
    return app
