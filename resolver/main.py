"""``hoss-resolver``: the conflict resolver's process, a validating admission webhook that judges every pod binding
against the Redis ledger (`resolver.judge`), served over HTTPS (`resolver.app`, `resolver.server`).

Every replica serves the webhook; one replica, elected on a Lease (``--lease-name``), runs the ledger sync
(`resolver.sync.LedgerSync`). Losing the Lease stops the sync at once; a sync that fails ends the process with a
non-zero status. Beside them run the stats publisher (`resolver.stats`), the namespace labels' informer for the
router, the DeviceClasses' informer (extended resources left to DRA, `hoss.model.dra`), the certificate reload
(`resolver.tls`) and the check of the ledgers' write fences (`hoss.ledger.fence`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

from kubernetes_asyncio import client
from redis.asyncio import Redis

from hoss.errors import LedgerUnavailable
from hoss.kube.access import TokenAccess
from hoss.kube.client import InformerHandlers, api_client, run_crd_informer, run_informer
from hoss.kube.events import EventTarget, post_event
from hoss.kube.leader import LeaderElector, lease_elector
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from hoss.ledger.connection import ledger_redis
from hoss.ledger.redisclient import PipelinedRedis
from hoss.logs import configure_logging
from hoss.model.objects import Json
from hoss.reload import ConfigFile, Reporter, follow
from hoss.settings import SettingsError, load_settings, run_loop
from resolver.app import build_server
from resolver.judge import LEDGER_CALL_TIMEOUT_SECONDS, POD_READ_TIMEOUT_SECONDS
from resolver.router import Rule, rules_from_text
from resolver.settings import ResolverSettings
from resolver.state import WebhookState
from resolver.stats import publish_stats
from resolver.sync import LedgerSync
from resolver.tls import reload_certificates, tls_context

log = logging.getLogger(__name__)

FENCE_CHECK_SECONDS = 2.0
"""How often every replica checks its write fences (as often as the syncing replica's watchdog looks)."""


async def sync_while_leading(
    state: WebhookState,
    elector: LeaderElector,
    make_sync: Callable[[], LedgerSync],
    *,
    stop_timeout_seconds: float = 10.0,
) -> None:
    """Run a fresh ledger sync each time this replica becomes leader, and stop it the moment it is not.

    Returns only by raising: a sync that ends (it never does unless it fails) ends this task with its error, and
    so does a sync that does not stop within ``stop_timeout_seconds`` of losing the Lease (a deposed leader must
    not keep writing), so the resolver exits non-zero instead of judging against a ledger nobody keeps.
    """
    while True:
        await elector.leading.wait()
        sync = make_sync()
        state.sync = sync
        log.info("leading: starting the ledger sync")
        running = asyncio.create_task(sync.run(), name="ledger-sync")
        lost = asyncio.create_task(elector.following.wait(), name="lease-lost")
        try:
            done, _ = await asyncio.wait({running, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            state.sync = None
            for task in (running, lost):
                task.cancel()
            await asyncio.wait({running, lost}, timeout=stop_timeout_seconds)
        if not running.done():
            raise RuntimeError(f"the ledger sync did not stop within {stop_timeout_seconds:.0f}s of being cancelled")
        if running in done:
            error = running.exception()
            raise error if error is not None else RuntimeError("the ledger sync ended")
        log.warning("lost the Lease: stopped the ledger sync")


def device_class_handlers(state: WebhookState) -> InformerHandlers:
    """Keep ``state.device_classes`` (every replica judges with them); when the names they map change, the sync
    (while this replica runs it) recounts the bound pods that ask for them."""

    async def changed(names: frozenset[str]) -> None:
        if names:
            log.info("extended resources backed by DRA changed: %s", ", ".join(sorted(names)))
            if state.sync is not None:
                await state.sync.recount(names)

    async def on_list(items: list[Json]) -> None:
        await changed(state.device_classes.replace(items))

    async def on_event(kind: str, obj: Json) -> None:
        await changed(state.device_classes.apply(kind, obj))

    return InformerHandlers(on_list=on_list, on_event=on_event)


def device_handlers(state: WebhookState, kind: str) -> InformerHandlers:
    """Keep ``state.devices``' ResourceSlices or ResourceClaims (`kind`: ``slices`` or ``claims``): what allocated
    devices draw on shared counters, for the judgement of allocations (`resolver.claims`)."""

    async def on_list(items: list[Json]) -> None:
        state.devices.replace(kind, items)
        state.slice_changes += kind == "slices"

    async def on_event(event: str, obj: Json) -> None:
        state.devices.apply(kind, event, obj)
        state.slice_changes += kind == "slices"

    return InformerHandlers(on_list=on_list, on_event=on_event)


async def check_fences(ledgers: Sequence[Ledger], *, interval_seconds: float = FENCE_CHECK_SECONDS) -> None:
    """Check every ``interval_seconds`` that Redis lost no write made through `ledgers` (`Ledger.check_fence`),
    so that a loss is noticed even while no review comes; a Redis that does not answer is tried again."""
    while True:
        await asyncio.sleep(interval_seconds)
        for ledger in ledgers:
            try:
                await ledger.check_fence()
            except LedgerUnavailable as error:
                log.debug("cannot check the write fence: %s", error)


def follow_routing(state: WebhookState, file: ConfigFile[list[Rule]], rest: KubeREST) -> Coroutine[Any, Any, None]:
    """Read the routing file every ``config_reload_seconds``; new rules route the pods created from then on (a
    review reads `WebhookState.routing_rules` once), and each change is reported on this replica's Pod."""

    def apply(rules: list[Rule]) -> None:
        state.routing_rules = rules

    reporter = Reporter(counter=state.config_reloads, target=EventTarget.from_env(os.environ),
                        component=f"hoss-resolver/{state.settings.identity}", post=functools.partial(post_event, rest))
    return follow(file, every=state.settings.config_reload_seconds, apply=apply, report=reporter.report)


@contextlib.asynccontextmanager
async def running_resolver(settings: ResolverSettings) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Start the webhook server, the Lease election and the sync (while leading) and timers; stop them on exit.

    Yields the tasks whose end is fatal (the sync's role and the election)."""
    async with contextlib.AsyncExitStack() as stack:
        # Two clients on the ledger: the sync's (redis-py), and the webhook's, one pipelined connection that costs
        # a fraction of redis-py's CPU per call (see hoss.ledger.redisclient); each review bounds its call with
        # asyncio.timeout (see _confirm). Both are a LedgerClient (hoss.ledger.connection).
        # Both are fenced (hoss.ledger.fence): a Redis that comes back without writes they made is noticed at
        # their next call, or at the next check_fences round, and rebuilt by the sync.
        ledger = Ledger(ledger_redis(settings.redis_url), owns_client=True, fenced=True)
        stack.push_async_callback(ledger.close)
        review_ledger = Ledger(PipelinedRedis(settings.redis_url, connect_timeout=LEDGER_CALL_TIMEOUT_SECONDS),
                               owns_client=True, fenced=True)
        stack.push_async_callback(review_ledger.close)
        api = await api_client(settings.kubeconfig)
        stack.push_async_callback(api.close)
        # Pod reads for bindings without a reservation go over their own lean keep-alive client, so they never
        # queue behind the sync's watches or the Lease renewals.
        rest = await KubeREST.connect(settings.kubeconfig)
        stack.push_async_callback(rest.close)
        elector = lease_elector(api, settings)

        async def get_pod(namespace: str, name: str) -> Json:
            return await rest.get_pod(namespace, name, timeout=POD_READ_TIMEOUT_SECONDS)

        access = None
        if settings.access == "kubernetes":
            # Reviews of tokens over a client of their own: a flood of them never delays the webhook's pod reads.
            access_rest = await KubeREST.connect(settings.kubeconfig)
            stack.push_async_callback(access_rest.close)
            access = TokenAccess(access_rest, resource="resolvers", namespace=settings.access_namespace,
                                 cache_seconds=settings.access_cache_seconds,
                                 reviews_per_second=settings.access_reviews_per_second)
        routing_file = ConfigFile(settings.routing_file, what="routing rules",
                                  parse=functools.partial(rules_from_text, source=settings.routing_file)) \
            if settings.routing_file else None
        state = WebhookState(settings=settings, ledger=review_ledger, get_pod=get_pod, elector=elector,
                             access=access, routing_rules=routing_file.load() if routing_file is not None else [],
                             routing_file=routing_file)
        context = tls_context(settings.tls_cert_file, settings.tls_key_file, settings.client_ca_file)
        if settings.client_ca_file is None:
            log.warning(
                "client_ca_file is not set: anyone who reaches this port can post reviews, and what a review admits "
                "is held %.0f s at most unless the apiserver shows its write (set --client-ca-file to the CA of the "
                "apiserver's webhook client certificate where the control plane presents one)",
                settings.held_write_timeout_seconds,
            )
        server = build_server(state)
        await server.start(settings.host, settings.port, ssl_context=context)
        stack.push_async_callback(server.close)
        stats_redis = Redis.from_url(settings.redis_url, decode_responses=True)
        stack.push_async_callback(stats_redis.aclose)

        def make_sync() -> LedgerSync:
            return LedgerSync(ledger=ledger, api=api, expire_interval_seconds=settings.expire_interval_seconds,
                              write_timeout_seconds=settings.held_write_timeout_seconds,
                              audit_interval_seconds=settings.audit_interval_seconds,
                              hoss_scheduler_names=settings.hoss_scheduler_names,
                              device_classes=state.device_classes)

        tasks = [
            asyncio.create_task(sync_while_leading(state, elector, make_sync), name="sync-role"),
            asyncio.create_task(elector.run(), name="leader-election"),
            asyncio.create_task(publish_stats(state, stats_redis, instance=settings.identity), name="publish-stats"),
            asyncio.create_task(check_fences([review_ledger, ledger]), name="write-fences"),
            asyncio.create_task(
                run_informer("namespaces", client.CoreV1Api(api).list_namespace,
                             InformerHandlers(on_list=state.namespaces.on_list, on_event=state.namespaces.on_event)),
                name="namespace-labels",
            ),
            asyncio.create_task(
                run_crd_informer("deviceclasses", client.ResourceV1Api(api).list_device_class,
                                 device_class_handlers(state), kind="DeviceClasses (resource.k8s.io/v1)",
                                 recheck_seconds=60.0),
                name="device-classes",
            ),
            *(asyncio.create_task(
                run_crd_informer(f"resource{kind}", call, device_handlers(state, kind),
                                 kind=f"{what} (resource.k8s.io/v1)", recheck_seconds=60.0),
                name=f"device-{kind}",
            ) for kind, call, what in (
                ("slices", client.ResourceV1Api(api).list_resource_slice, "ResourceSlices"),
                ("claims", client.ResourceV1Api(api).list_resource_claim_for_all_namespaces, "ResourceClaims"))),
            asyncio.create_task(
                reload_certificates(
                    context, settings.tls_cert_file, settings.tls_key_file, client_ca_file=settings.client_ca_file
                ),
                name="cert-reload",
            ),
        ]

        if routing_file is not None and settings.config_reload_seconds > 0:
            tasks.append(asyncio.create_task(follow_routing(state, routing_file, rest), name="routing-reload"))

        async def stop() -> None:
            # The sync stops first, then the Lease is handed back so another replica takes over at once.
            tasks[0].cancel()
            await asyncio.gather(tasks[0], return_exceptions=True)
            for task in tasks[1:]:
                task.cancel()
            await asyncio.gather(*tasks[1:], return_exceptions=True)
            await elector.release()

        stack.push_async_callback(stop)
        log.info(
            "hoss-resolver %s serving https://{%s}:%d (enforce=%s); sync elected on Lease %s/%s",
            settings.identity, ",".join(settings.host), settings.port, settings.enforce, settings.lease_namespace,
            settings.lease_name,
        )
        yield tasks[:2]


async def serve(settings: ResolverSettings) -> None:
    """Serve until SIGTERM or SIGINT (then the sync stops and the Lease is handed back, so another replica takes
    over at once). If the ledger sync ever fails, the resolver exits non-zero (fail loudly: a resolver that no
    longer syncs would judge bindings against a stale ledger), to be restarted by its supervisor."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with running_resolver(settings) as fatal:
        stop = asyncio.create_task(stopping.wait(), name="stop")
        done, _ = await asyncio.wait([stop, *fatal], return_when=asyncio.FIRST_COMPLETED)
        if stop in done:
            log.info("hoss-resolver stopping")
            return
        stop.cancel()
        ended = done.pop()
        error = ended.exception() if not ended.cancelled() else None
        raise SystemExit(f"hoss-resolver: {ended.get_name()} stopped: {error!r}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(
            ResolverSettings, argv, prog="hoss-resolver",
            description="hoss conflict resolver: admission webhook on pod bindings, backed by the Redis ledger",
        )
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    problems = settings.file_problems()
    if problems:
        print("hoss-resolver: invalid settings: " + "; ".join(problems), file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
