"""``hoss-worker``: read work from the dispatcher, decide, reserve in the ledger, bind.

One worker runs one decision at a time (decisions are CPU work over numpy arrays) and many bindings at once
(they are network waits). The order for each pod:

1. look the pod up in the worker's cache of pending pods (a GET when the cache lags);
2. ``decide``: filter and score every node with the policy's profile; the best few nodes are candidates;
3. reserve on the first candidate in the ledger (one atomic call); on a conflict, read that node's totals back
   from the ledger and try the next candidate — without deciding again from scratch;
4. post the binding (metadata.uid set); the resolver webhook checks it against the reservation;
5. acknowledge the work item. A pod that fits nowhere gets PodScheduled=False and a FailedScheduling event and
   is retried with backoff, sooner when the cluster frees room.

Invariants: a work item is acknowledged only when its pod is bound, gone, or cannot be parsed (it then carries
an event saying why); a failed binding releases only a reservation that is still assumed, never a bound entry.
On SIGTERM the worker stops reading, lets bindings in flight finish, releases its reservations and drops its
heartbeat, so the dispatcher hands its unfinished items to other workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from redis.asyncio import Redis

from dispatcher.queue import GangMember, WorkerInfo, WorkItem, WorkQueue
from resolver.errors import LedgerNotReadyError, LedgerUnavailable, ResolverError
from resolver.events import pod_event, post_event, set_unschedulable
from resolver.kube import InformerHandlers, Json, KubeError, api_client, request_json, run_informer
from resolver.ledger import Conflict, GangReserved, HeldElsewhere, Ledger, LedgerNotReady, Reserved, UnknownNode
from resolver.ledger import GangMember as GangPlacementMember
from resolver.settings import SettingsError, load_settings
from workers.extender import decide_with_extenders
from workers.framework import Placement, Profile, Unschedulable, decide
from workers.gang import place_gang
from workers.nodes import NodeTable
from workers.pod import PodView, parse_pod
from workers.profiles import load_profiles
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)

COUNTERS = ("bound", "conflicts", "denied", "unschedulable", "malformed", "retries", "gone")


@dataclass(order=True)
class _Retry:
    due: float
    message_id: str = field(compare=False)
    item: WorkItem = field(compare=False)
    delay: float = field(compare=False, default=0.0)


class Worker:
    """One scheduler worker process."""

    def __init__(self, settings: WorkerSettings, *, api: client.ApiClient, redis: Redis) -> None:
        self.settings = settings
        self.api = api
        self.core: Any = client.CoreV1Api(api)
        self.queue = WorkQueue(redis)
        self.ledger = Ledger(redis)
        profiles, default = load_profiles(settings.policies_file)
        missing = [p for p in settings.policies if p not in profiles]
        if missing:
            raise SettingsError(
                f"hoss-worker: policies {missing} are not in {settings.policies_file} "
                f"(profiles there: {sorted(profiles)})"
            )
        self.profiles: dict[str, Profile] = profiles
        self.default_profile = default
        self.nodes = NodeTable()
        self.pending: dict[str, Json] = {}
        self.rng = np.random.default_rng(settings.seed)
        self.jitter = random.Random(settings.seed)
        self.ready: asyncio.Queue[tuple[str, WorkItem]] = asyncio.Queue()
        self.retries: list[_Retry] = []
        self.backoff: dict[str, float] = {}
        self.last_message: dict[str, str] = {}
        self.binds = asyncio.Semaphore(settings.max_binds_in_flight)
        self.in_flight = 0
        self.started = time.time()
        self.stopping = asyncio.Event()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.registry = CollectorRegistry()
        self.metric_pods = Counter(
            "hoss_worker_pods", "Pods handled by outcome", ["outcome"], registry=self.registry
        )
        self.metric_queue = Gauge("hoss_worker_queue_depth", "Work items waiting", registry=self.registry)
        self._nodes_synced = asyncio.Event()
        self._pods_synced = asyncio.Event()
        self._bind_tasks: set[asyncio.Task[None]] = set()
        self._acks: list[tuple[str, list[str]]] = []
        self.http: aiohttp.ClientSession | None = None
        self._ack_ready = asyncio.Event()

    # --- bookkeeping -------------------------------------------------------------------------------------

    def count(self, outcome: str, n: int = 1) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + n
        self.metric_pods.labels(outcome).inc(n)

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.settings.id,
            policies=list(self.settings.policies),
            queue_depth=self.ready.qsize() + len(self.retries),
            in_flight=self.in_flight,
            capacity=self.settings.max_binds_in_flight,
            started_unix=self.started,
            counters=dict(self.counters),
        )

    # --- informers ---------------------------------------------------------------------------------------

    async def _on_node_list(self, items: list[Json]) -> None:
        present = set()
        for node in items:
            name = self._upsert_node(node)
            if name:
                present.add(name)
        for name in list(self.nodes.names):
            if name not in present:
                self.nodes.remove_node(name)

    def _upsert_node(self, node: Json) -> str | None:
        try:
            self.nodes.upsert_node(node)
        except ResolverError as error:
            log.warning("node %s ignored: %s", (node.get("metadata") or {}).get("name"), error)
            return None
        return str(node["metadata"]["name"])

    async def _on_node_event(self, kind: str, node: Json) -> None:
        name = str((node.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self.nodes.remove_node(name)
            return
        is_new = name not in self.nodes.index
        self._upsert_node(node)
        if is_new:
            await self._refresh_usage([name])
            self._wake_retries()

    async def _on_pod_list(self, items: list[Json]) -> None:
        self.pending = {str(p["metadata"]["uid"]): p for p in items if self._ours(p)}

    async def _on_pod_event(self, kind: str, pod: Json) -> None:
        uid = str((pod.get("metadata") or {}).get("uid"))
        if kind == "DELETED" or not self._ours(pod):
            self.pending.pop(uid, None)
        else:
            self.pending[uid] = pod

    @staticmethod
    def _ours(pod: Json) -> bool:
        return not (pod.get("spec") or {}).get("nodeName") and not (pod.get("metadata") or {}).get(
            "deletionTimestamp"
        )

    # --- ledger totals -----------------------------------------------------------------------------------

    async def _refresh_usage(self, names: Sequence[str] | None = None) -> bool:
        """Read node totals (bound + assumed) back from the ledger; True when some node gained room."""
        wanted = list(names if names is not None else self.nodes.names)
        if not wanted:
            return False
        usage = await self.ledger.node_usage(wanted)
        freed = False
        for name, (_alloc, used) in usage.items():
            if name not in self.nodes.index:
                continue
            before = self.nodes.used_of(name)
            self.nodes.set_used(name, used)
            if any(used.get(r, 0) < amount for r, amount in before.items()):
                freed = True
        return freed

    async def _usage_loop(self) -> None:
        while not self.stopping.is_set():
            await asyncio.sleep(self.settings.usage_refresh_seconds)
            try:
                if await self._refresh_usage():
                    self._wake_retries()
            except LedgerUnavailable as error:
                log.warning("cannot read node totals from the ledger: %s", error)

    # --- intake and retries ------------------------------------------------------------------------------

    async def _intake_loop(self) -> None:
        await self.queue.ensure_group(self.settings.id)
        # Items delivered to this id before a restart and never acknowledged come first.
        for message_id, item in await self.queue.read(self.settings.id, count=100_000, block_ms=0, pending=True):
            await self.ready.put((message_id, item))
        while not self.stopping.is_set():
            try:
                batch = await self.queue.read(self.settings.id, count=self.settings.read_batch, block_ms=500)
            except LedgerUnavailable as error:
                log.warning("cannot read work: %s", error)
                await asyncio.sleep(1)
                continue
            for message_id, item in batch:
                await self.ready.put((message_id, item))
            self.metric_queue.set(self.ready.qsize() + len(self.retries))

    def _retry_later(self, message_id: str, item: WorkItem, *, soon: bool = False) -> None:
        previous = self.backoff.get(item.uid, 0.0)
        delay = 0.2 if soon else min(
            max(previous * 2, self.settings.backoff_initial_seconds), self.settings.backoff_max_seconds
        )
        if not soon:
            self.backoff[item.uid] = delay
        delay *= 0.8 + 0.4 * self.jitter.random()
        heapq.heappush(self.retries, _Retry(time.monotonic() + delay, message_id, item, delay))
        self.count("retries")

    def _wake_retries(self) -> None:
        """The cluster gained room: retry waiting pods now rather than at the end of their backoff."""
        now = time.monotonic()
        self.retries = [
            _Retry(min(r.due, now + 0.05), r.message_id, r.item, r.delay) for r in self.retries
        ]
        heapq.heapify(self.retries)

    async def _retry_loop(self) -> None:
        while not self.stopping.is_set():
            now = time.monotonic()
            while self.retries and self.retries[0].due <= now:
                entry = heapq.heappop(self.retries)
                await self.ready.put((entry.message_id, entry.item))
            await asyncio.sleep(0.05)

    # --- scheduling --------------------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                message_id, item = await asyncio.wait_for(self.ready.get(), 0.5)
            except TimeoutError:
                continue
            try:
                await self.schedule_one(message_id, item)
            except LedgerUnavailable as error:
                log.warning("ledger unavailable while scheduling %s: %s", item.key, error)
                self._retry_later(message_id, item, soon=True)
                await asyncio.sleep(0.5)

    async def _pod_for(self, item: WorkItem) -> Json | None:
        pod = self.pending.get(item.uid)
        # The dispatcher may have seen the pod a moment before this worker's own watch did: wait a little
        # for the watch before paying for a GET.
        for _ in range(10):
            if pod is not None:
                return pod
            await asyncio.sleep(0.01)
            pod = self.pending.get(item.uid)
        try:
            fetched = await request_json(self.core.read_namespaced_pod, item.name, item.namespace)
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        if fetched["metadata"].get("uid") != item.uid or not self._ours(fetched):
            return None
        return fetched

    async def _member_pod(self, item: WorkItem) -> tuple[Json | None, PodView | None, str]:
        """The raw pod and its parsed view; (None, None, "") when it is gone or bound, or an error text."""
        raw = await self._pod_for(item)
        if raw is None:
            return None, None, ""
        try:
            return raw, parse_pod(raw), ""
        except ResolverError as error:
            return raw, None, f"hoss cannot schedule this pod: {error}"

    async def schedule_one(self, message_id: str, item: WorkItem) -> None:
        if item.members:
            await self.schedule_gang(message_id, item)
            return
        try:
            raw, pod, problem = await self._member_pod(item)
        except (KubeError, aiohttp.ClientError, OSError) as error:
            log.warning("cannot read pod %s: %s", item.key, error)
            self._retry_later(message_id, item, soon=True)
            return
        if raw is None:
            self.count("gone")
            await self._done(message_id, item)
            return
        if pod is None:
            await self._malformed(item, problem)
            await self._done(message_id, item)
            return
        profile = self.profiles.get(item.policy) or self.profiles[self.default_profile]
        for _attempt in range(3):
            decision = await self._decide(profile, pod, raw)
            if isinstance(decision, Unschedulable):
                await self._unschedulable(message_id, item, decision.message)
                return
            outcome = await self._reserve_first(pod, decision)
            if outcome == "retry-now":
                continue
            if outcome == "not-ready":
                self._retry_later(message_id, item, soon=True)
                return
            if outcome == "bound-elsewhere":
                await self._done(message_id, item)
                return
            if outcome is not None:
                self._start_bind(message_id, item, [(pod, outcome)])
                return
        self._retry_later(message_id, item)

    async def _decide(self, profile: Profile, pod: PodView, raw: Json) -> Placement | Unschedulable:
        if profile.extenders:
            if self.http is None:
                self.http = aiohttp.ClientSession()
            return await decide_with_extenders(profile, pod, raw, self.nodes, rng=self.rng,
                                               top=self.settings.candidates, session=self.http)
        return decide(profile, pod, self.nodes, rng=self.rng, top=self.settings.candidates)

    async def _malformed(self, item: WorkItem, message: str) -> None:
        self.count("malformed")
        log.warning("pod %s is malformed: %s", item.key, message)
        await post_event(self.core, pod_event(namespace=item.namespace, name=item.name, uid=item.uid,
                                              reason="FailedScheduling", message=message,
                                              component=self._component()))
        await set_unschedulable(self.core, namespace=item.namespace, name=item.name, message=message,
                                reason="InvalidPod")

    async def _reserve_first(self, pod: PodView, decision: Placement) -> str | None:
        """Reserve on the best candidate that still fits; the node name, or what to do instead."""
        for node in decision.candidates:
            result = await self.ledger.reserve(
                uid=pod.uid, pod=f"{pod.namespace}/{pod.name}", node=node, request=pod.request,
                owner=self.settings.id, ttl_seconds=self.settings.reservation_ttl_seconds,
            )
            match result:
                case Reserved():
                    self.nodes.add_used(node, pod.request)
                    return node
                case Conflict():
                    self.count("conflicts")
                    await self._refresh_usage([node])
                case UnknownNode():
                    continue
                case HeldElsewhere(state="bound"):
                    return "bound-elsewhere"
                case HeldElsewhere():
                    continue
                case LedgerNotReady():
                    return "not-ready"
        return "retry-now"

    async def _unschedulable(self, message_id: str, item: WorkItem, message: str) -> None:
        self.count("unschedulable")
        for member in self._members(item):
            if self.last_message.get(member.uid) != message:
                self.last_message[member.uid] = message
                await set_unschedulable(self.core, namespace=member.namespace, name=member.name, message=message)
                await post_event(self.core, pod_event(namespace=member.namespace, name=member.name, uid=member.uid,
                                                      reason="FailedScheduling", message=message,
                                                      component=self._component()))
        self._retry_later(message_id, item)

    @staticmethod
    def _members(item: WorkItem) -> list[GangMember]:
        return list(item.members) or [GangMember(uid=item.uid, namespace=item.namespace, name=item.name)]

    def _component(self) -> str:
        return f"hoss-worker/{self.settings.id}"

    # --- gangs -------------------------------------------------------------------------------------------

    async def schedule_gang(self, message_id: str, item: WorkItem) -> None:
        """All or nothing: place the pending members, reserve them in one ledger call, then bind them."""
        views: list[PodView] = []
        gone = 0
        try:
            for member in item.members:
                lookup = WorkItem(uid=member.uid, namespace=member.namespace, name=member.name, policy=item.policy)
                raw, pod, problem = await self._member_pod(lookup)
                if raw is None:
                    gone += 1
                elif pod is None:
                    await self._malformed(lookup, problem)
                    await self._unschedulable(message_id, item,
                                              f"gang {item.gang}: member {lookup.key} is invalid: {problem}")
                    return
                else:
                    views.append(pod)
        except (KubeError, aiohttp.ClientError, OSError) as error:
            log.warning("cannot read the members of gang %s: %s", item.gang, error)
            self._retry_later(message_id, item, soon=True)
            return
        if not views:
            self.count("gone")
            await self._done(message_id, item)
            return
        # Members already bound (or deleted) no longer need room; the rest must reach min-available together.
        need = max(1, min(len(views), item.min_available - gone))
        profile = self.profiles.get(item.policy) or self.profiles[self.default_profile]
        placement = place_gang(profile, views, self.nodes, rng=self.rng, min_available=need,
                               topology_key=profile.topology_key, gang=item.gang)
        if isinstance(placement, Unschedulable):
            await self._unschedulable(message_id, item, placement.message)
            return
        chosen = [v for v in views if v.uid in placement.assignments]
        members = [GangPlacementMember(uid=v.uid, pod=v.key, node=placement.assignments[v.uid], request=v.request)
                   for v in chosen]
        result = await self.ledger.reserve_gang(members=members, owner=self.settings.id,
                                                ttl_seconds=self.settings.reservation_ttl_seconds)
        match result:
            case GangReserved():
                for placed in members:
                    self.nodes.add_used(placed.node, placed.request)
                log.info("gang %s: %d members reserved on %d nodes (leaves: %s)", item.gang, len(members),
                         len({m.node for m in members}), ", ".join(placement.leaves) or "-")
                self._start_bind(message_id, item, [(v, placement.assignments[v.uid]) for v in chosen])
            case Conflict(node=node):
                self.count("conflicts")
                await self._refresh_usage(sorted({m.node for m in members} | {node}))
                self._retry_later(message_id, item, soon=True)
            case LedgerNotReady() | UnknownNode() | HeldElsewhere():
                await self._refresh_usage(sorted({m.node for m in members}))
                self._retry_later(message_id, item, soon=True)

    # --- binding -----------------------------------------------------------------------------------------

    def _start_bind(self, message_id: str, item: WorkItem, placements: list[tuple[PodView, str]]) -> None:
        task = asyncio.create_task(self._bind_item(message_id, item, placements))
        self._bind_tasks.add(task)
        task.add_done_callback(self._bind_tasks.discard)

    async def _bind_item(self, message_id: str, item: WorkItem, placements: list[tuple[PodView, str]]) -> None:
        """Bind every placement of the item; acknowledge when all are bound, else try the item again."""
        outcomes = await asyncio.gather(*(self._bind(pod, node) for pod, node in placements))
        if all(ok for ok, _status in outcomes):
            self.backoff.pop(item.uid, None)
            for member in self._members(item):
                self.last_message.pop(member.uid, None)
            await self._done(message_id, item)
        elif not item.members and outcomes[0][1] == 404:
            await self._done(message_id, item)  # the pod is gone
        else:
            conflict = any(status == 409 for _ok, status in outcomes)
            self._retry_later(message_id, item, soon=conflict)

    async def _bind(self, pod: PodView, node: str) -> tuple[bool, int | None]:
        """Post one binding; on refusal release the reservation (only while it is still assumed)."""
        async with self.binds:
            self.in_flight += 1
            try:
                return await self._post_binding(pod, node)
            finally:
                self.in_flight -= 1

    async def _post_binding(self, pod: PodView, node: str) -> tuple[bool, int | None]:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await request_json(self.core.create_namespaced_pod_binding, pod.name, pod.namespace, body)
        except KubeError as error:
            reason = str(error)
            self.count("denied")
            log.info("binding %s to %s refused (%s): %s", pod.key, node, error.status, reason)
            await self._unreserve(pod, node)
            if error.status != 404:
                await post_event(self.core, pod_event(
                    namespace=pod.namespace, name=pod.name, uid=pod.uid, reason="FailedScheduling",
                    message=f"binding to {node} refused: {reason}", component=self._component()))
            return False, error.status
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("binding %s to %s failed: %s", pod.key, node, error)
            await self._unreserve(pod, node)
            return False, None
        self.count("bound")
        policy = pod.policy or self.default_profile
        self.counters[f"bound:{policy}"] = self.counters.get(f"bound:{policy}", 0) + 1
        log.debug("bound %s to %s", pod.key, node)
        return True, 200

    async def _unreserve(self, pod: PodView, node: str) -> None:
        try:
            if await self.ledger.release_assumed(uid=pod.uid, node=node):
                self.nodes.sub_used(node, pod.request)
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            log.warning("cannot release the reservation of %s on %s (it expires by itself): %s", pod.key, node, error)

    async def _done(self, message_id: str, item: WorkItem) -> None:
        """Acknowledge soon: acknowledgements are sent in batches by ``_ack_loop``."""
        self._acks.append((message_id, [m.uid for m in item.members] or [item.uid]))
        self._ack_ready.set()

    async def _flush_acks(self) -> None:
        done, self._acks = self._acks, []
        try:
            await self.queue.ack_many(self.settings.id, done)
        except LedgerUnavailable as error:
            log.warning("cannot acknowledge %d items (they stay queued and are retried): %s", len(done), error)
            self._acks[:0] = done

    async def _ack_loop(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ack_ready.wait(), 0.5)
            self._ack_ready.clear()
            await asyncio.sleep(0.01)  # gather the acknowledgements of a burst into one round trip
            await self._flush_acks()

    # --- lifecycle ---------------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.queue.heartbeat(self.info(), ttl_seconds=self.settings.heartbeat_ttl_seconds)
            except LedgerUnavailable as error:
                log.warning("cannot send heartbeat: %s", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.settings.heartbeat_interval_seconds)

    async def run(self) -> None:
        """Run until ``stopping`` is set, then shut down gracefully."""
        informers = [
            asyncio.create_task(run_informer(
                "nodes", self.core.list_node,
                InformerHandlers(on_list=self._on_node_list, on_event=self._on_node_event),
                synced=self._nodes_synced)),
            asyncio.create_task(run_informer(
                "pending pods", self.core.list_pod_for_all_namespaces,
                InformerHandlers(on_list=self._on_pod_list, on_event=self._on_pod_event),
                synced=self._pods_synced, field_selector="spec.nodeName=")),
        ]
        await self._nodes_synced.wait()
        await self._pods_synced.wait()
        await self._refresh_usage()
        log.info("worker %s ready: %d nodes, policies %s", self.settings.id, len(self.nodes.names),
                 ",".join(self.settings.policies))
        loops = [
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._intake_loop()),
            asyncio.create_task(self._retry_loop()),
            asyncio.create_task(self._usage_loop()),
            asyncio.create_task(self._schedule_loop()),
            asyncio.create_task(self._ack_loop()),
        ]
        await self.stopping.wait()
        log.info("worker %s stopping: %d bindings in flight", self.settings.id, len(self._bind_tasks))
        await asyncio.gather(*loops[1:], return_exceptions=True)
        if self._bind_tasks:
            await asyncio.wait(self._bind_tasks, timeout=10)
        await self._flush_acks()
        released = await self.ledger.release_owner(self.settings.id)
        await self.queue.deregister(self.settings.id)
        await asyncio.gather(loops[0], return_exceptions=True)
        if self.http is not None:
            await self.http.close()
        for task in informers:
            task.cancel()
        await asyncio.gather(*informers, return_exceptions=True)
        log.info("worker %s stopped: released %d reservations; unfinished work returns to the dispatcher",
                 self.settings.id, released)


def build_app(worker: Worker) -> web.Application:
    app = web.Application()

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(worker.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status(_request: web.Request) -> web.Response:
        info = worker.info()
        return web.json_response({"id": info.id, "policies": info.policies, "queue_depth": info.queue_depth,
                                  "in_flight": info.in_flight, "nodes": len(worker.nodes.names),
                                  "counters": info.counters})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)
    return app


async def serve(settings: WorkerSettings) -> None:
    api = await api_client(settings.kubeconfig)
    redis = Redis.from_url(settings.redis_url, decode_responses=True)
    worker = Worker(settings, api=api, redis=redis)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stopping.set)
    runner = web.AppRunner(build_app(worker), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.host, settings.port).start()
    try:
        await worker.run()
    finally:
        await runner.cleanup()
        await redis.aclose()
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(WorkerSettings, argv, prog="hoss-worker",
                                 description="hoss scheduler worker: decide, reserve in the ledger, bind")
        logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        asyncio.run(serve(settings))
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
