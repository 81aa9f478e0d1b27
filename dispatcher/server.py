"""The dispatcher's HTTP server: the dashboard, /status (and its schema), /metrics and /healthz."""

from __future__ import annotations

import asyncio
import importlib.resources
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from redis.asyncio import Redis
from redis.exceptions import RedisError

from dispatcher.core import Dispatcher
from dispatcher.leader import LeaderElector
from dispatcher.notices import STATUS_TIMEOUT_SECONDS
from dispatcher.resolverstats import RESOLVER_STATS_MATCH, resolver_instance
from dispatcher.settings import DispatcherSettings
from dispatcher.status import SystemStatus
from dispatcher.statusviews import build_status
from hoss.errors import LedgerUnavailable
from hoss.kube.access import TokenAccess, middleware
from hoss.ledger.client import Ledger
from hoss.ledger.keys import RESCHED_STATUS_KEY
from hoss.ledger.results import LedgerSnapshot, QuotaReport
from hoss.queue import WorkerInfo
from hoss.supervise import Supervisor


@dataclass
class ServiceState:
    settings: DispatcherSettings
    dispatcher: Dispatcher
    elector: LeaderElector
    redis: Redis
    ledger: Ledger
    supervisor: Supervisor = field(default_factory=Supervisor)
    """Runs the informers and the roles: restarts one that raised, and names a failing or dead one in /healthz."""


STATE_KEY = web.AppKey("state", ServiceState)


async def read_resolver_stats(redis: Redis) -> dict[str, dict[str, str]]:
    """Every resolver instance's stats hash, by instance name."""
    keys = sorted([str(key) async for key in redis.scan_iter(match=RESOLVER_STATS_MATCH, count=100)])
    if not keys:
        return {}
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    replies = await pipe.execute()
    return {resolver_instance(key): dict(reply) for key, reply in zip(keys, replies, strict=True) if reply}


async def gather_status(state: ServiceState) -> SystemStatus:
    """The inputs of /status from Redis and memory; an unreachable Redis empties its sections, never fails."""
    dispatcher = state.dispatcher
    now = time.time()
    live: list[WorkerInfo] = []
    dead: set[str] = set()
    dispatched: dict[str, str] | None = None
    snapshot: LedgerSnapshot | None = None
    quotas: QuotaReport | None = None
    stats: dict[str, dict[str, str]] | None = None
    rescheduler: dict[str, Any] | None = None
    redis_error: str | None = None
    try:
        async with asyncio.timeout(STATUS_TIMEOUT_SECONDS):
            read_live, read_dead = await dispatcher.queue.workers()
            read_dispatched = await dispatcher.queue.dispatched()
            read_snapshot = await state.ledger.snapshot()
            read_stats = await read_resolver_stats(state.redis)
            rescheduler = _json_object(await state.redis.get(RESCHED_STATUS_KEY))
            read_quotas = await state.ledger.quotas()
    except TimeoutError:
        redis_error = f"no answer within {STATUS_TIMEOUT_SECONDS:.0f}s"
    except (LedgerUnavailable, RedisError) as error:
        redis_error = str(error) or type(error).__name__
    else:
        live, dead, dispatched, snapshot, stats = read_live, read_dead, read_dispatched, read_snapshot, read_stats
        quotas = read_quotas
    return build_status(
        identity=state.settings.identity,
        leader=state.elector.is_leader,
        leader_identity=state.elector.holder,
        redis_error=redis_error,
        queues=dispatcher.queue_status(dispatched),
        throughput=dispatcher.throughput(),
        live=live,
        dead=dead,
        routed={worker.id for worker in dispatcher.workers} if state.elector.is_leader else None,
        dispatched=dispatched,
        snapshot=snapshot,
        resolver_stats=stats,
        pending=dispatcher.pending_status(dispatched),
        gangs=dispatcher.gang_status(dispatched),
        rescheduler=rescheduler,
        quotas=quotas,
        now_unix=now,
    )


def _json_object(raw: object) -> dict[str, Any] | None:
    """The rescheduler's published status, or None (none published, or unreadable)."""
    if not isinstance(raw, str | bytes):
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


async def status(request: web.Request) -> web.Response:
    document = await gather_status(request.app[STATE_KEY])
    return web.Response(text=document.model_dump_json(), content_type="application/json")


async def status_schema(_request: web.Request) -> web.Response:
    return web.json_response(SystemStatus.model_json_schema())


DASHBOARD_FILES = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
"""The operator dashboard: static files in dispatcher/dashboard/ (package data) that render /status."""
DASHBOARD_KEY = web.AppKey("dashboard", dict[str, bytes])
DASHBOARD_HEADERS = {
    # Everything the page needs comes from this server; pod names and messages are rendered as text, never markup.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def load_dashboard() -> dict[str, bytes]:
    """The dashboard's files, read once at start-up (a missing one fails the start, not a request)."""
    folder = importlib.resources.files("dispatcher").joinpath("dashboard")
    return {name: folder.joinpath(name).read_bytes() for name in DASHBOARD_FILES}


async def dashboard(request: web.Request) -> web.Response:
    name = request.match_info.get("name", "index.html")
    if name not in DASHBOARD_FILES:
        raise web.HTTPNotFound()
    return web.Response(
        body=request.app[DASHBOARD_KEY][name], content_type=DASHBOARD_FILES[name], charset="utf-8",
        headers=DASHBOARD_HEADERS,
    )


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE_KEY].dispatcher.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    unwell = request.app[STATE_KEY].supervisor.health()
    if unwell:
        return web.Response(status=500, text="".join(f"loop {name} {why}\n" for name, why in unwell.items()))
    return web.Response(text="ok")


def build_app(state: ServiceState, *, access: TokenAccess | None = None) -> web.Application:
    """The routes; with ``access``, /status (and its schema) and /metrics need a bearer token it accepts
    (hoss.kube.access)."""
    app = web.Application(middlewares=[middleware(access)] if access is not None else [])
    app[STATE_KEY] = state
    app[DASHBOARD_KEY] = load_dashboard()
    app.router.add_get("/", dashboard)
    app.router.add_get("/dashboard/{name}", dashboard)
    app.router.add_get("/status", status)
    app.router.add_get("/status/schema", status_schema)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app
