"""hoss-worker's process: connect to the apiserver and Redis, serve HTTP, run the worker until stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from hoss.kube.access import TokenAccess
from hoss.kube.events import EventTarget
from hoss.kube.rest import KubeREST
from hoss.settings import run_service
from workers.connections import Pipelined, connect_redis
from workers.core import Worker, apiserver_requests_in_flight
from workers.server import build_app
from workers.settings import WorkerSettings


async def serve(settings: WorkerSettings) -> int:
    """Run until SIGTERM or SIGINT (0) or until a loop is dead (1)."""
    rest = await KubeREST.connect(settings.kubeconfig, limit=apiserver_requests_in_flight(settings))
    redis = connect_redis(settings.redis_url)
    pipelined = Pipelined.connect(settings.redis_url)
    worker = Worker(settings, redis=redis, rest=rest, pipelined=pipelined, target=EventTarget.from_env(os.environ))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stopping.set)
    access = None
    if settings.access == "kubernetes":
        access = TokenAccess(rest, resource="workers", namespace=settings.access_namespace,
                             cache_seconds=settings.access_cache_seconds,
                             reviews_per_second=settings.access_reviews_per_second)
    runner = web.AppRunner(build_app(worker, access=access), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.host, settings.port).start()
    try:
        await worker.run()
    finally:
        await runner.cleanup()
        await pipelined.aclose()
        await redis.aclose()
        await rest.close()
    return 1 if worker.supervisor.fatal.is_set() else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(WorkerSettings, argv, prog="hoss-worker", serve=serve,
                       description="hoss scheduler worker: decide, reserve in the ledger, bind")


if __name__ == "__main__":
    sys.exit(main())
