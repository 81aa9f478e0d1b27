"""Keep the ledger true to the apiserver: nodes' allocatable, bound pods, and releases.

Two informers (nodes, pods) mirror the cluster in memory and apply each change to the ledger: a node's
allocatable and labels, a pod that got spec.nodeName becomes a bound entry, a pod deleted or finished releases
its entry. Assumed entries past their deadline are expired on a timer. A watchdog notices a ledger that is not
ready (Redis restarted empty or was flushed: the ready key and epoch are gone) and rebuilds it from the mirror,
which the informers keep equal to the apiserver; until then the ledger answers "not ready" and the webhook denies.

Invariant: the in-memory mirror and the ledger are changed under one lock, so a rebuild never interleaves with
an event and no change is lost between a snapshot and the rebuild.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from resolver import compact
from resolver.errors import LedgerNotReadyError, LedgerUnavailable, ResolverError
from resolver.kube import InformerHandlers, Json, run_informer
from resolver.ledger import BoundPod, Ledger
from resolver.resources import ResourceVector, node_allocatable, pod_requests

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
NodeRecord = tuple[ResourceVector, dict[str, str], str]
"""allocatable, labels, compact description (JSON) of a node, as the ledger keeps it"""


@dataclass(frozen=True)
class PodInfo:
    """What the resolver needs of a pod: identity, node (if bound), scheduler and effective request."""

    uid: str
    namespace: str
    name: str
    node: str | None
    scheduler_name: str
    request: ResourceVector
    terminal: bool
    generation: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_pod(pod: Json, *, known: PodInfo | None = None) -> PodInfo:
    """The typed view of a raw pod; raises ResolverError subclasses naming the bad field.

    ``known``, the view of the same pod from an earlier event, lends its request when the pod's spec has not
    changed since (same uid and ``metadata.generation``, which the apiserver bumps on every spec change, an
    in-place resize included): most events of a pod are status updates, and computing a request is the costly
    part of a view.
    """
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    generation = metadata.get("generation")
    reuse = (
        known is not None
        and generation is not None
        and known.generation == generation
        and known.uid == str(metadata.get("uid", ""))
    )
    return PodInfo(
        uid=str(metadata.get("uid", "")),
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        node=spec.get("nodeName") or None,
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        request=known.request if reuse and known is not None else pod_requests(pod),
        terminal=status.get("phase") in TERMINAL_PHASES,
        generation=generation if isinstance(generation, int) else None,
    )


@dataclass
class PodIndex:
    """Live pods by uid and by namespace/name, so the webhook finds a pod's request without an API call."""

    by_uid: dict[str, PodInfo] = field(default_factory=dict)
    uid_by_key: dict[str, str] = field(default_factory=dict)

    def clear(self) -> None:
        self.by_uid.clear()
        self.uid_by_key.clear()

    def put(self, info: PodInfo) -> None:
        self.by_uid[info.uid] = info
        self.uid_by_key[info.key] = info.uid

    def drop(self, uid: str) -> PodInfo | None:
        info = self.by_uid.pop(uid, None)
        if info is not None and self.uid_by_key.get(info.key) == uid:
            del self.uid_by_key[info.key]
        return info

    def find(self, *, uid: str | None, key: str) -> PodInfo | None:
        if uid:
            return self.by_uid.get(uid)
        found = self.uid_by_key.get(key)
        return self.by_uid.get(found) if found else None

    def bound(self) -> list[BoundPod]:
        return [
            BoundPod(uid=p.uid, pod=p.key, node=p.node, request=p.request)
            for p in self.by_uid.values()
            if p.node and not p.terminal
        ]


@dataclass
class SyncStats:
    rebuilds: int = 0
    last_rebuild_unix: float = 0.0
    node_events: int = 0
    pod_events: int = 0
    expired: int = 0
    malformed_pods: int = 0


class LedgerSync:
    """Runs the informers, the expiry timer and the rebuild watchdog for one resolver process."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        api: client.ApiClient,
        expire_interval_seconds: float = 1.0,
        watchdog_interval_seconds: float = 2.0,
    ) -> None:
        self.ledger = ledger
        self.core: Any = client.CoreV1Api(api)
        self.pods = PodIndex()
        self.nodes: dict[str, NodeRecord] = {}
        self.stats = SyncStats()
        self.synced = asyncio.Event()
        self._expire_interval = expire_interval_seconds
        self._watchdog_interval = watchdog_interval_seconds
        self._lock = asyncio.Lock()
        self._nodes_listed = asyncio.Event()
        self._pods_listed = asyncio.Event()

    async def run(self) -> None:
        """Run until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(
                run_informer(
                    "nodes",
                    self.core.list_node,
                    InformerHandlers(on_list=self._on_node_list, on_event=self._on_node_event),
                    synced=self._nodes_listed,
                )
            )
            group.create_task(
                run_informer(
                    "pods",
                    self.core.list_pod_for_all_namespaces,
                    InformerHandlers(on_list=self._on_pod_list, on_event=self._on_pod_event),
                    synced=self._pods_listed,
                )
            )
            await self._nodes_listed.wait()
            await self._pods_listed.wait()
            await self.rebuild()
            group.create_task(self._expire_loop())
            group.create_task(self._watchdog_loop())

    async def rebuild(self) -> None:
        """Replace the ledger's contents with the mirror of the apiserver; the ledger is ready afterwards."""
        async with self._lock:
            nodes = [(name, alloc, labels, spec) for name, (alloc, labels, spec) in self.nodes.items()]
            epoch = await self.ledger.rebuild(nodes=nodes, bound=self.pods.bound())
        self.stats.rebuilds += 1
        self.stats.last_rebuild_unix = time.time()
        self.synced.set()
        log.info("ledger rebuilt: %d nodes, %d bound pods, epoch %s", len(nodes), len(self.pods.bound()), epoch)

    # --- nodes -------------------------------------------------------------------------------------------

    @staticmethod
    def _node_view(node: Json) -> tuple[str, NodeRecord]:
        """The node's name, and what the ledger keeps of it: allocatable, labels and the compact description
        workers build their node table from (only a change of these is written to the ledger)."""
        metadata = node.get("metadata") or {}
        spec = compact.encode(compact.compact_node(node)).decode()
        return str(metadata.get("name")), (node_allocatable(node), dict(metadata.get("labels") or {}), spec)

    async def _on_node_list(self, items: list[Json]) -> None:
        async with self._lock:
            self.nodes.clear()
            for node in items:
                with _logged_skip("node", node):
                    name, record = self._node_view(node)
                    self.nodes[name] = record
        if self.synced.is_set():
            await self.rebuild()

    async def _on_node_event(self, kind: str, node: Json) -> None:
        self.stats.node_events += 1
        with _logged_skip("node", node):
            name, record = self._node_view(node)
            async with self._lock:
                if kind == "DELETED":
                    self.nodes.pop(name, None)
                    if self.synced.is_set():
                        await self._apply(self.ledger.remove_node(name))
                    return
                previous = self.nodes.get(name)
                self.nodes[name] = record
                if self.synced.is_set() and previous != record:
                    alloc, labels, spec = record
                    await self._apply(self.ledger.sync_node(node=name, allocatable=alloc, labels=labels, spec=spec))

    # --- pods --------------------------------------------------------------------------------------------

    async def _on_pod_list(self, items: list[Json]) -> None:
        async with self._lock:
            self.pods.clear()
            for pod in items:
                info = self._parse(pod)
                if info is not None and not info.terminal:
                    self.pods.put(info)
        if self.synced.is_set():
            await self.rebuild()

    def _parse(self, pod: Json) -> PodInfo | None:
        uid = (pod.get("metadata") or {}).get("uid")
        try:
            return parse_pod(pod, known=self.pods.by_uid.get(uid) if isinstance(uid, str) else None)
        except ResolverError as error:
            self.stats.malformed_pods += 1
            metadata = pod.get("metadata") or {}
            log.warning("pod %s/%s ignored: %s", metadata.get("namespace"), metadata.get("name"), error)
            return None

    async def _on_pod_event(self, kind: str, pod: Json) -> None:
        self.stats.pod_events += 1
        info = self._parse(pod)
        if info is None:
            return
        async with self._lock:
            if kind == "DELETED" or info.terminal:
                self.pods.drop(info.uid)
                if self.synced.is_set():
                    await self._apply(self.ledger.release(info.uid))
                return
            previous = self.pods.by_uid.get(info.uid)
            self.pods.put(info)
            if info.node and self.synced.is_set() and (previous is None or previous.node != info.node):
                await self._apply(
                    self.ledger.bind(uid=info.uid, pod=info.key, node=info.node, request=info.request)
                )

    async def _apply(self, change: Awaitable[object]) -> None:
        """Apply one change to the ledger. A ledger that is not ready is skipped: the mirror already holds the
        change and the watchdog's rebuild writes it. Redis being unreachable propagates (the informer re-lists
        after a backoff, and the re-list rebuilds)."""
        try:
            await change
        except LedgerNotReadyError:
            log.debug("ledger not ready; the rebuild will carry this change")

    # --- timers ------------------------------------------------------------------------------------------

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self._expire_interval)
            try:
                expired = await self.ledger.expire()
            except (LedgerUnavailable, LedgerNotReadyError) as error:
                # Not ready: the watchdog rebuilds the ledger; expiry resumes after that.
                log.debug("cannot expire reservations: %s", error)
                continue
            if expired:
                self.stats.expired += len(expired)
                log.info("expired %d reservations past their deadline: %s", len(expired), ", ".join(expired[:5]))

    async def _watchdog_loop(self) -> None:
        while True:
            await asyncio.sleep(self._watchdog_interval)
            try:
                ready = await self.ledger.is_ready()
                if not ready:
                    log.warning("ledger is not ready (Redis lost its data?); rebuilding from the apiserver mirror")
                    await self.rebuild()
            except (LedgerUnavailable, LedgerNotReadyError) as error:
                log.warning("ledger unavailable: %s", error)


@contextlib.contextmanager
def _logged_skip(kind: str, obj: Json) -> Any:
    try:
        yield
    except ResolverError as error:
        name = (obj.get("metadata") or {}).get("name")
        log.warning("%s %s ignored: %s", kind, name, error)
