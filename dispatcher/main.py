"""hoss-dispatcher's process: wire Redis, the apiserver, the election, the watches and HTTP; run until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client
from redis.asyncio import Redis

from dispatcher.core import Dispatcher
from dispatcher.intake import pending_pods_selector
from dispatcher.jobs import watch_jobs
from dispatcher.notices import KubeNotifier
from dispatcher.podgroups import (
    track_gangs,
    watch_podgroups,
    watch_volcano_podgroups,
    watch_workload_podgroups,
)
from dispatcher.reservations import end_reservations, watch_reservations
from dispatcher.roles import cancel_and_wait, run_roles
from dispatcher.server import ServiceState, build_app
from dispatcher.settings import DispatcherSettings
from hoss.kube.access import STATUS_PATHS, TokenAccess
from hoss.kube.client import api_client, run_crd_informer, run_informer
from hoss.kube.leader import lease_elector
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from hoss.ledger.redisclient import PipelinedRedis
from hoss.queue import Fence, WorkQueue, term_key
from hoss.settings import run_service

log = logging.getLogger(__name__)



@dataclass
class RunningDispatcher:
    state: ServiceState
    runner: web.AppRunner
    tasks: list[asyncio.Task[None]]



@contextlib.asynccontextmanager
async def running_dispatcher(settings: DispatcherSettings) -> AsyncIterator[RunningDispatcher]:
    """Start the watch, the election, the dispatcher's role and the HTTP server; stop them in reverse on exit.

    On exit the dispatcher stops sending first, then the Lease is released (empty holder), so a standby replica
    takes over at its next check instead of after the lease duration.
    """
    async with contextlib.AsyncExitStack() as stack:
        redis = Redis.from_url(
            settings.redis_url, decode_responses=True, socket_connect_timeout=2.0, socket_timeout=5.0,
            health_check_interval=30,
        )
        stack.push_async_callback(redis.aclose)
        api = await api_client(settings.kubeconfig)
        stack.push_async_callback(api.close)
        core = client.CoreV1Api(api)
        elector = lease_elector(api, settings)
        sends = PipelinedRedis(settings.redis_url)  # the dispatch transactions, one write each
        stack.push_async_callback(sends.aclose)
        # Every write of the leader's carries its term, the Lease's leaseTransitions (hoss.queue, Fencing).
        fence = Fence(key=term_key(f"{settings.lease_namespace}/{settings.lease_name}"), term=lambda: elector.term)
        queue = WorkQueue(redis, pipelined=sends, fence=fence)

        async def fenced(newer: int) -> None:
            await elector.raise_term(above=newer)

        dispatcher = Dispatcher(
            queue=queue, settings=settings, notifier=KubeNotifier(core), is_leader=lambda: elector.is_leader,
            on_fenced=fenced,
        )
        dispatcher.metrics.leader.set_function(lambda: float(elector.is_leader))
        state = ServiceState(
            settings=settings, dispatcher=dispatcher, elector=elector, redis=redis, ledger=Ledger(redis)
        )
        access = None
        if settings.access == "kubernetes":
            rest = await KubeREST.connect(settings.kubeconfig)
            stack.push_async_callback(rest.close)
            access = TokenAccess(
                rest, resource="dispatchers", namespace=settings.access_namespace,
                cache_seconds=settings.access_cache_seconds, reviews_per_second=settings.access_reviews_per_second,
                paths={**STATUS_PATHS, "/status/schema": "status"},
            )
        runner = web.AppRunner(build_app(state, access=access), access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, settings.host, settings.port).start()
        supervise = state.supervisor.run
        namespaces = asyncio.create_task(
            supervise("namespace-watch", lambda: run_informer(
                "namespaces", core.list_namespace, dispatcher.namespace_handlers())),
            name="namespace-watch",
        )
        stack.push_async_callback(cancel_and_wait, namespaces)

        apps = client.AppsV1Api(api)
        sources = {"service": core.list_service_for_all_namespaces,
                   "rc": core.list_replication_controller_for_all_namespaces,
                   "rs": apps.list_replica_set_for_all_namespaces,
                   "ss": apps.list_stateful_set_for_all_namespaces}
        for kind, call in sources.items():
            watch = asyncio.create_task(
                supervise(f"{kind}-selector-watch", functools.partial(
                    run_informer, f"{kind}-selectors", call, dispatcher.spread_handlers(kind))),
                name=f"{kind}-selector-watch",
            )
            stack.push_async_callback(cancel_and_wait, watch)

        storage = client.StorageV1Api(api)
        storage_sources: dict[str, Any] = {"claims": core.list_persistent_volume_claim_for_all_namespaces,
                           "volumes": core.list_persistent_volume,
                           "classes": storage.list_storage_class,
                           "drivers": storage.list_csi_driver,
                           "capacities": storage.list_csi_storage_capacity_for_all_namespaces,
                           "csinodes": storage.list_csi_node,
                           "attachments": storage.list_volume_attachment}
        for kind, call in storage_sources.items():
            watch = asyncio.create_task(
                supervise(f"storage-{kind}-watch", functools.partial(
                    run_informer, f"storage-{kind}", call, dispatcher.storage_handlers(kind))),
                name=f"storage-{kind}-watch",
            )
            stack.push_async_callback(cancel_and_wait, watch)

        resource = client.ResourceV1Api(api)
        device_sources: dict[str, Any] = {"claims": resource.list_resource_claim_for_all_namespaces,
                                          "slices": resource.list_resource_slice,
                                          "classes": resource.list_device_class}
        for kind, call in device_sources.items():
            # resource.k8s.io/v1 is served from Kubernetes 1.34: before that (or with it turned off) nothing is
            # waited for, and a pod with resourceClaims waits for its claim as one not made yet
            synced_kind = dispatcher.devices_synced[kind]

            async def absent(missing: bool, synced_kind: asyncio.Event = synced_kind) -> None:
                if missing:
                    synced_kind.set()

            watch = asyncio.create_task(
                supervise(f"dra-{kind}-watch", functools.partial(
                    run_crd_informer, f"dra-{kind}", call, dispatcher.device_handlers(kind),
                    kind=f"{kind} (resource.k8s.io/v1)", recheck_seconds=60.0, on_missing=absent)),
                name=f"dra-{kind}-watch",
            )
            stack.push_async_callback(cancel_and_wait, watch)

        async def watch_pending() -> None:
            # compact forms resolve namespaceSelectors, default spread selectors and volume claims from the start
            await dispatcher.namespaces_synced.wait()
            for synced in (*dispatcher.spread_synced.values(), *dispatcher.storage_synced.values(),
                           *dispatcher.devices_synced.values()):
                await synced.wait()
            await run_informer(
                "pending-pods", core.list_pod_for_all_namespaces, dispatcher.handlers(), synced=dispatcher.synced,
                field_selector=pending_pods_selector(settings.scheduler_names),
            )

        informer = asyncio.create_task(supervise("pending-pod-watch", watch_pending), name="pending-pod-watch")
        stack.push_async_callback(cancel_and_wait, informer)
        podgroups = asyncio.create_task(supervise("podgroup-watch", lambda: watch_podgroups(api, dispatcher)),
                                        name="podgroup-watch")
        stack.push_async_callback(cancel_and_wait, podgroups)
        for name, watch_groups in (("workload-podgroup-watch", watch_workload_podgroups),
                                   ("volcano-podgroup-watch", watch_volcano_podgroups)):
            groups = asyncio.create_task(supervise(name, functools.partial(watch_groups, api, dispatcher)), name=name)
            stack.push_async_callback(cancel_and_wait, groups)
        watched = asyncio.create_task(supervise("reservation-watch",
                                                lambda: watch_reservations(api, dispatcher)),
                                      name="reservation-watch")
        stack.push_async_callback(cancel_and_wait, watched)
        ending = asyncio.create_task(supervise("reservation-expiry", lambda: end_reservations(
            api, dispatcher, lambda: elector.is_leader, ledger=Ledger(redis))), name="reservation-expiry")
        stack.push_async_callback(cancel_and_wait, ending)
        jobs = asyncio.create_task(supervise("job-watch", lambda: watch_jobs(api, dispatcher)), name="job-watch")
        stack.push_async_callback(cancel_and_wait, jobs)
        gangs = asyncio.create_task(supervise("gang-counts", lambda: track_gangs(api, dispatcher,
                                                                                 lambda: elector.is_leader)),
                                    name="gang-counts")
        stack.push_async_callback(cancel_and_wait, gangs)
        stack.push_async_callback(elector.release)
        election = asyncio.create_task(elector.run(), name="leader-election")
        stack.push_async_callback(cancel_and_wait, election)
        roles = asyncio.create_task(supervise("dispatch", lambda: run_roles(dispatcher, elector)), name="dispatch")
        stack.push_async_callback(cancel_and_wait, roles)
        async def until_a_loop_is_dead() -> None:
            await state.supervisor.fatal.wait()

        fatal = asyncio.create_task(until_a_loop_is_dead(), name="supervisor")
        stack.push_async_callback(cancel_and_wait, fatal)
        log.info(
            "hoss-dispatcher %s serving http on %s; schedulers %s; Lease %s/%s",
            settings.identity, ", ".join(f"{host}:{port}" for host, port, *_ in runner.addresses),
            ",".join(settings.scheduler_names), settings.lease_namespace, settings.lease_name,
        )
        yield RunningDispatcher(state=state, runner=runner, tasks=[informer, election, roles, fatal])


async def serve(settings: DispatcherSettings) -> int:
    """Run until SIGTERM or SIGINT (exit 0) or until a part of the service fails (exit 1)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with running_dispatcher(settings) as service:
        stop = asyncio.create_task(stopping.wait())
        done, _ = await asyncio.wait([stop, *service.tasks], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        failed = [task for task in service.tasks if task in done]
        for task in failed:
            error = None if task.cancelled() else task.exception()
            log.error("%s stopped unexpectedly; shutting down", task.get_name(), exc_info=error)
        if not failed:
            log.info("stopping (signal)")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(
        DispatcherSettings, argv, prog="hoss-dispatcher", serve=serve,
        description="hoss dispatcher: sends pending pods to scheduler workers by policy and load, reclaims the "
            "work of dead workers, serves /status and /metrics; leader-elected on a Lease",
    )


if __name__ == "__main__":
    sys.exit(main())
