"""hoss-rescheduler's process: the apiserver, the ledger, the election, rounds while leading, /healthz, /status and
/metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from redis.asyncio import Redis

from hoss.errors import HossError
from hoss.kube.access import STATUS_PATHS, TokenAccess, middleware
from hoss.kube.client import KubeError, api_client
from hoss.kube.leader import lease_elector
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from hoss.settings import run_service
from rescheduler.service import Rescheduler
from rescheduler.settings import ReschedulerSettings

log = logging.getLogger("rescheduler")


async def serve(settings: ReschedulerSettings) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with contextlib.AsyncExitStack() as stack:
        redis = Redis.from_url(settings.redis_url, decode_responses=True, socket_connect_timeout=2.0,
                               socket_timeout=5.0, health_check_interval=30)
        stack.push_async_callback(redis.aclose)
        api = await api_client(settings.kubeconfig)
        stack.push_async_callback(api.close)
        rest = await KubeREST.connect(settings.kubeconfig)
        stack.push_async_callback(rest.close)
        elector = lease_elector(api, settings)
        rescheduler = Rescheduler(settings, rest=rest, ledger=Ledger(redis), redis=redis)
        rescheduler.metrics.leader.set_function(lambda: float(elector.is_leader))

        async def healthz(_request: web.Request) -> web.Response:
            return web.json_response({"ok": True, "leader": elector.is_leader})

        async def status(_request: web.Request) -> web.Response:
            return web.json_response({**rescheduler.status(), "leader": elector.is_leader,
                                      "identity": settings.identity})

        async def metrics(_request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(rescheduler.metrics.registry),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        guards = []
        if settings.access == "kubernetes":
            access = TokenAccess(rest, resource="reschedulers", namespace=settings.access_namespace,
                                 cache_seconds=settings.access_cache_seconds,
                                 reviews_per_second=settings.access_reviews_per_second, paths=STATUS_PATHS)
            guards.append(middleware(access))
        app = web.Application(middlewares=guards)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/status", status)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, settings.host, settings.port).start()
        election = asyncio.create_task(elector.run(), name="leader-election")

        async def rounds() -> None:
            while not stopping.is_set():
                if elector.is_leader:
                    try:
                        await rescheduler.round()
                    except (HossError, KubeError, OSError, TimeoutError) as error:
                        log.warning("round failed: %s; trying again next round", error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), settings.interval_seconds)

        work = asyncio.create_task(rounds(), name="rounds")
        log.info("hoss-rescheduler %s serving on %s:%s (lease %s/%s, every %gs, dry run %s)", settings.identity,
                 settings.host, settings.port, settings.lease_namespace, settings.lease_name,
                 settings.interval_seconds, settings.dry_run)
        stop = asyncio.create_task(stopping.wait())
        done, _ = await asyncio.wait([stop, work, election], return_when=asyncio.FIRST_COMPLETED)
        failed = [t for t in (work, election) if t in done]
        for task in (stop, work, election):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(work, election, return_exceptions=True)
        await elector.release()
        for task in failed:
            error = None if task.cancelled() else task.exception()
            log.error("%s stopped unexpectedly", task.get_name(), exc_info=error)
        return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(
        ReschedulerSettings, argv, prog="hoss-rescheduler", serve=serve,
        description="hoss rescheduler: moves pods (holding their room in the ledger first) so that GPUs are "
            "not stranded; leader-elected on a Lease",
    )


if __name__ == "__main__":
    sys.exit(main())
