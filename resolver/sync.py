"""Keep the ledger true to the apiserver: nodes' allocatable, bound pods, and releases.

Two informers (nodes, pods) mirror the cluster in memory and apply each change to the ledger: a node's
allocatable and labels, a pod that got spec.nodeName becomes a bound entry, a pod deleted or finished releases
its entry. Assumed entries past their deadline are expired on a timer. A watchdog notices a ledger that is not
ready (Redis restarted empty or was flushed: the ready key and epoch are gone) and rebuilds it from the mirror,
which the informers keep equal to the apiserver; until then the ledger answers "not ready" and the webhook denies.

The pod informer watches bound pods only (field selector ``spec.nodeName!=``): a pending pod holds nothing in
the ledger but its reservation. A third informer keeps the pending pods of other schedulers (not hoss's, by
``spec.schedulerName``) in an index, so the webhook judges a foreign scheduler's binding without a GET of the pod;
hoss's own pending pods never reach the resolver (their bindings carry a reservation).

Pod events are queued by uid (the latest event of a pod wins) and applied in
bursts: what gathers within POD_FLUSH_LINGER_SECONDS goes to the mirror and then to the ledger in one
``release_many`` and one ``bind_many`` call (per POD_WRITE_BATCH pods), so the watch never waits on Redis.

Invariant: the in-memory mirror and the ledger are changed under one lock, so a rebuild never interleaves with
an event and no change is lost between a snapshot and the rebuild.

Admitted entries (the webhook allowed a binding or a pod created on a node) are checked by GET of the pod
(`verify_admitted`): the entry is dropped only on proof that the write never happened (the pod is gone or bound
elsewhere, or it is unbound once the write is surely over) and otherwise stays counted until the pod shows up
bound. A periodic audit compares the ledger's bound entries and nodes with the mirror and rebuilds on drift, and
the watchdog notices a Redis that came back from an older copy (another epoch, or a stamp that went back).
A node deleted from the apiserver keeps the entries of the pods that still name it, as a rebuild would.

The pure parts live apart: the mirror's data (pods, nodes, Reservations) in resolver/mirror.py, the audit's
comparison in resolver/drift.py, the verdict on an admitted entry in resolver/admitted.py. What stays here is
`LedgerSync`, the I/O around them. It stays whole, over 500 lines, because its informer handlers, batched pod
flush, rebuild, watchdog, verify and audit share one lock, one mirror and one "ledger stale" flag: the invariant
above holds only if every writer of the mirror and the ledger takes that lock, which a reader checks here, in one
class.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence, Set
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from hoss.errors import HossError, LedgerNotReadyError, LedgerUnavailable, NodeSpecError
from hoss.kube.client import (
    InformerHandlers,
    KubeError,
    raise_if_cancelled,
    request_json,
    run_crd_informer,
    run_informer,
)
from hoss.kube.events import node_event, post_event, reservation_event
from hoss.ledger.arguments import BoundPod, Placement
from hoss.ledger.client import Ledger
from hoss.ledger.keys import RESERVATION_PREFIX
from hoss.ledger.results import Overcommit, ReservationRefused
from hoss.model import reservations
from hoss.model.dra import DeviceClasses, without_dra
from hoss.model.objects import Json
from hoss.model.resources import NODE_RESERVATION_ANNOTATION, node_reservation
from resolver.admitted import admitted_verdict
from resolver.drift import ledger_drift
from resolver.mirror import (
    RESERVATION_REFUSED,
    TERMINAL_PHASES,
    NodeRecord,
    PodIndex,
    PodInfo,
    node_record,
    parse_pod,
    refusal_message,
    reservation_entry,
    same_entry,
)
from resolver.quotas import QuotaMirror, keep_status, watch_quotas

log = logging.getLogger(__name__)

BOUND_PODS_SELECTOR = "spec.nodeName!="
"""The pod informer's field selector: only bound pods matter to the ledger (a pending pod holds nothing until
a binding the webhook judged, and the rebuild needs only bound pods)."""
POD_WRITE_BATCH = 256
"""Most pods written to the ledger in one script call (bind_many / release_many)."""
POD_FLUSH_LINGER_SECONDS = 0.1
"""How long pod events may gather before they are written: the bound state of a pod the webhook already holds
resources for lags its binding by at most this much, and a burst costs one script call instead of many."""


def foreign_pending_selector(scheduler_names: Sequence[str]) -> str:
    """The field selector of the foreign pending pods informer: unbound, and scheduled by none of hoss's names."""
    return ",".join(["spec.nodeName=", *(f"spec.schedulerName!={name}" for name in scheduler_names)])


VERIFY_BATCH = 64
"""Most admitted entries checked per round of the verify loop."""
VERIFY_RETRY_SECONDS = 2.0
"""An admitted entry not settled by a check is checked again this much later."""


@dataclass
class SyncStats:
    rebuilds: int = 0
    last_rebuild_unix: float = 0.0
    node_events: int = 0
    pod_events: int = 0
    expired: int = 0
    malformed_pods: int = 0
    overcommits: int = 0
    """bound pods the sync recorded on a node without room for them (each logged as a warning)"""
    admitted_checked: int = 0
    admitted_dropped: int = 0
    resizes_checked: int = 0
    """admitted entries dropped on proof that their write failed or the pod is gone"""
    audits: int = 0
    audit_drift: int = 0
    """ledger entries, nodes or used totals the audit found unequal to the apiserver or to the entries (and
    repaired by a rebuild)"""
    stale_ledger: int = 0
    """times Redis came back with an older copy of the ledger (another epoch, or a stamp that went back)"""
    pod_flushes: int = 0
    """batches of pod events applied to the mirror and the ledger together"""
    ledger_pod_writes: int = 0
    """bind_many / release_many calls"""
    reservations_refused: int = 0
    """Reservations marked Available on a node without room for them (each told by a Warning event)"""


class LedgerSync:
    """Runs the informers, the expiry timer and the rebuild watchdog for one resolver process."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        api: client.ApiClient,
        expire_interval_seconds: float = 1.0,
        watchdog_interval_seconds: float = 2.0,
        pod_flush_linger_seconds: float = POD_FLUSH_LINGER_SECONDS,
        verify_interval_seconds: float = 1.0,
        write_timeout_seconds: float = 60.0,
        audit_interval_seconds: float = 60.0,
        hoss_scheduler_names: Sequence[str] = ("hoss",),
        device_classes: DeviceClasses | None = None,
    ) -> None:
        self.ledger = ledger
        self.device_classes = device_classes if device_classes is not None else DeviceClasses()
        """the extended resources DeviceClasses map (kept by the resolver's informer): a bound pod's entry leaves out
        those its node has none of, as the webhook does (`hoss.model.dra`)"""
        self.api = api
        self.core: Any = client.CoreV1Api(api)
        self.quotas = QuotaMirror(ledger)
        """the cluster's ElasticQuotas, written to the ledger as they change and whole before every rebuild"""
        self.custom: Any = client.CustomObjectsApi(api)
        self.reservations: dict[str, PodInfo] = {}
        """Available Reservations by uid: entries 'Reservation/<name>' holding their room
        (hoss/model/reservations.py)"""
        self._reservations_listed = asyncio.Event()
        self.pods = PodIndex()
        self.pending = PodIndex()
        """unbound pods of other schedulers (requests and uid), for the webhook's judgement of their bindings"""
        self._pending_selector = foreign_pending_selector(hoss_scheduler_names)
        self.nodes: dict[str, NodeRecord] = {}
        self.stats = SyncStats()
        self.synced = asyncio.Event()
        self._expire_interval = expire_interval_seconds
        self._watchdog_interval = watchdog_interval_seconds
        self._pod_flush_linger = pod_flush_linger_seconds
        self._lock = asyncio.Lock()
        self._nodes_listed = asyncio.Event()
        self._pods_listed = asyncio.Event()
        self._pod_changes: dict[str, PodInfo | None] = {}
        """uid -> latest view (None: deleted or finished) of pod events not yet applied; a later event of a uid
        replaces the earlier"""
        self._pods_changed = asyncio.Event()
        self._ledger_stale = False
        """a pod write failed (Redis unreachable): the watchdog rebuilds the ledger from the mirror"""
        self._verify_interval = verify_interval_seconds
        self._write_timeout_ms = round(write_timeout_seconds * 1000)
        self._audit_interval = audit_interval_seconds
        self._epoch: str | None = None
        self._stamp: int | None = None
        self._bad_reservations: dict[str, object] = {}
        """node -> the malformed reservation annotation already warned about"""
        self._refused: dict[str, str] = {}
        """uid -> '<node>/<resource>' of the Available Reservations the ledger refused room (told once per value)"""
        self._background: set[asyncio.Future[None]] = set()
        """the epoch this sync last rebuilt, and the last stamp it read (see Ledger.tick)"""

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
                    field_selector=BOUND_PODS_SELECTOR,
                )
            )
            group.create_task(
                run_informer(
                    "foreign pending pods",
                    self.core.list_pod_for_all_namespaces,
                    InformerHandlers(on_list=self._on_pending_list, on_event=self._on_pending_event),
                    field_selector=self._pending_selector,
                )
            )
            group.create_task(self._pod_flush_loop())
            group.create_task(watch_quotas(self.api, self.quotas))
            group.create_task(self._watch_reservations())
            await self._nodes_listed.wait()
            await self._pods_listed.wait()
            await self.quotas.listed.wait()
            await self._reservations_listed.wait()
            await self.rebuild()
            group.create_task(keep_status(self.api, self.quotas))
            group.create_task(self._expire_loop())
            group.create_task(self._watchdog_loop())
            group.create_task(self._verify_loop())
            group.create_task(self._audit_loop())

    async def rebuild(self) -> None:
        """Replace the ledger's contents with the mirror of the apiserver; the ledger is ready afterwards."""
        async with self._lock:
            nodes = [(name, alloc, labels, spec) for name, (alloc, labels, spec) in self.nodes.items()]
            self._stamp = (await self.ledger.tick())[1]  # the rebuild leaves the stamp as it is
            if self.quotas.listed.is_set():
                # before the rebuild marks the ledger ready, so a Redis that lost its data enforces them at once
                await self.ledger.set_quotas(self.quotas.quotas(), replace=True)
            bound = self.bound()
            rebuilt = await self.ledger.rebuild(nodes=nodes, bound=bound)
            epoch = self._epoch = rebuilt.epoch
            self._note_refusals(rebuilt.refused, checked=[p.uid for p in bound if p.uid in self.reservations])
        self.stats.rebuilds += 1
        self.stats.last_rebuild_unix = time.time()
        self.synced.set()
        log.info("ledger rebuilt: %d nodes, %d bound pods and Reservations, epoch %s", len(nodes), len(self.bound()),
                 epoch)

    def bound(self) -> list[BoundPod]:
        """What the ledger must hold as bound: the bound pods and the Available Reservations."""
        return [*map(self._counted, self.pods.bound()),
                *(BoundPod(uid=r.uid, pod=r.key, node=r.node, request=r.request, meta=r.meta)
                  for r in self.reservations.values() if r.node)]

    def _counted(self, placement: Placement) -> Placement:
        """``placement`` as the ledger counts it: without the extended resources left to DRA on its node."""
        dra = self.device_classes.names
        if dra.isdisjoint(placement.request):
            return placement
        record = self.nodes.get(placement.node)
        return dataclasses.replace(placement, request=without_dra(placement.request, dra=dra,
                                                                  allocatable=record[0] if record else {}))

    async def recount(self, changed: Set[str]) -> None:
        """DeviceClasses came or went, mapping ``changed``: rewrite the entries of the bound pods that ask for one of
        them, counted by the new mapping (`bind_many` changes an entry's request in place)."""
        async with self._lock:
            if not self.synced.is_set() or self._ledger_stale:
                return  # the (next) rebuild counts them so
            pods = [p for p in self.pods.bound() if not changed.isdisjoint(p.request)]
            for i in range(0, len(pods), POD_WRITE_BATCH):
                await self._apply_pods(self._bind(pods[i:i + POD_WRITE_BATCH]))

    # --- Reservations ------------------------------------------------------------------------------------

    async def _watch_reservations(self, *, recheck_seconds: float = 60.0) -> None:
        """Mirror the Available Reservations when their CRD is installed (checked again now and then when not)."""
        call = functools.partial(self.custom.list_cluster_custom_object, *reservations.API)

        async def missing(_crd_absent: bool) -> None:
            self._reservations_listed.set()  # none to hold

        await run_crd_informer("reservations", call, InformerHandlers(on_list=self._on_reservation_list,
                                                                       on_event=self._on_reservation_event),
                               kind="Reservations", recheck_seconds=recheck_seconds, on_missing=missing,
                               synced=self._reservations_listed)

    @staticmethod
    def _reservation_view(obj: Json) -> tuple[str, PodInfo | None]:
        """uid, and the entry holding the Reservation's room while it is Available and not expired (else None)."""
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        try:
            return uid, reservation_entry(obj, now_unix=time.time())
        except HossError as error:
            log.warning("Reservation %s ignored: %s", (obj.get("metadata") or {}).get("name"), error)
            return uid, None

    async def _on_reservation_list(self, items: list[Json]) -> None:
        async with self._lock:
            self.reservations = {uid: info for uid, info in map(self._reservation_view, items) if info is not None}
        if self.synced.is_set():
            await self.rebuild()

    async def _on_reservation_event(self, kind: str, obj: Json) -> None:
        uid, info = self._reservation_view(obj)
        if kind == "DELETED":
            info = None
        async with self._lock:
            previous = self.reservations.pop(uid, None)
            if info is not None:
                self.reservations[uid] = info
            if not self.synced.is_set() or previous == info:
                return
            if info is None:
                self._refused.pop(uid, None)
                await self._apply(self.ledger.release_many([uid]))
            else:
                await self._apply(self._bind([BoundPod(uid=uid, pod=info.key, node=info.node or "",
                                                       request=info.request, meta=info.meta)]))

    # --- nodes -------------------------------------------------------------------------------------------

    def _check_reservation(self, name: str, node: Json) -> None:
        """Warn (log and a Warning event on the node, once per value) about a malformed node reservation
        annotation; `node_allocatable` ignores it, so the node keeps its full allocatable."""
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_RESERVATION_ANNOTATION)
        try:
            node_reservation(node)
        except NodeSpecError as error:
            if self._bad_reservations.get(name) != raw:
                self._bad_reservations[name] = raw
                log.warning("node %s: %s", name, error)
                self._spawn(post_event(self.core, node_event(name=name, uid=str((node.get("metadata") or {})
                                                                                .get("uid", "")),
                                                            reason="InvalidNodeReservation", message=str(error),
                                                            component="hoss-resolver")))
            return
        self._bad_reservations.pop(name, None)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _on_node_list(self, items: list[Json]) -> None:
        async with self._lock:
            self.nodes.clear()
            for node in items:
                with _logged_skip("node", node):
                    name, record = node_record(node)
                    self.nodes[name] = record
                    self._check_reservation(name, node)
        if self.synced.is_set():
            await self.rebuild()

    async def _on_node_event(self, kind: str, node: Json) -> None:
        self.stats.node_events += 1
        with _logged_skip("node", node):
            name, record = node_record(node)
            async with self._lock:
                if kind == "DELETED":
                    self.nodes.pop(name, None)
                    self._bad_reservations.pop(name, None)
                    if self.synced.is_set():
                        await self._apply(self.ledger.remove_node(name))
                        # As the rebuild does: pods that still name the node stay counted on it (registered
                        # without allocatable, so nothing more is admitted there) until they go; a node
                        # re-created under the name finds them.
                        standing = [p for p in self.bound() if p.node == name]
                        if standing:
                            log.warning("node %s deleted while %d pods still name it; they stay counted", name,
                                        len(standing))
                            await self._apply(self._bind(standing))
                    return
                previous = self.nodes.get(name)
                self.nodes[name] = record
                self._check_reservation(name, node)
                if self.synced.is_set() and previous != record:
                    alloc, labels, spec = record
                    await self._apply(self.ledger.sync_node(node=name, allocatable=alloc, labels=labels, spec=spec))

    # --- pods --------------------------------------------------------------------------------------------

    async def _on_pod_list(self, items: list[Json]) -> None:
        async with self._lock:
            # The list supersedes every event received before it, applied or not.
            self._pod_changes.clear()
            self.pods.clear()
            for pod in items:
                info = self._parse(pod)
                if info is not None and not info.terminal:
                    self.pods.put(info)
        if self.synced.is_set():
            await self.rebuild()

    async def _on_pending_list(self, items: list[Json]) -> None:
        self.pending.clear()
        for pod in items:
            await self._on_pending_event("ADDED", pod)

    async def _on_pending_event(self, kind: str, pod: Json) -> None:
        """A foreign scheduler's pending pod: kept (its request and uid) until it leaves the selector (bound,
        deleted). A view is recomputed only when the spec changed (a new metadata.generation)."""
        metadata = pod.get("metadata") or {}
        uid = metadata.get("uid")
        if not isinstance(uid, str) or not uid:
            return
        if kind == "DELETED" or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            self.pending.drop(uid)
            return
        known = self.pending.by_uid.get(uid)
        if known is not None and known.generation is not None and known.generation == metadata.get("generation"):
            return
        try:
            self.pending.put(parse_pod(pod))
        except HossError as error:
            self.pending.drop(uid)  # judged by GET, which reports the bad field
            log.debug("pending pod %s/%s not indexed: %s", metadata.get("namespace"), metadata.get("name"), error)

    def _parse(self, pod: Json) -> PodInfo | None:
        uid = (pod.get("metadata") or {}).get("uid")
        known = (self._pod_changes.get(uid) or self.pods.by_uid.get(uid)) if isinstance(uid, str) else None
        try:
            return parse_pod(pod, known=known)
        except HossError as error:
            self.stats.malformed_pods += 1
            metadata = pod.get("metadata") or {}
            log.warning("pod %s/%s ignored: %s", metadata.get("namespace"), metadata.get("name"), error)
            return None

    async def _on_pod_event(self, kind: str, pod: Json) -> None:
        """Queue the change; `flush_pods` applies what has queued up to the mirror and the ledger together. The
        watch never waits for Redis, and a burst of events costs a few script calls instead of one per pod."""
        self.stats.pod_events += 1
        metadata = pod.get("metadata") or {}
        uid = metadata.get("uid")
        if not isinstance(uid, str) or not uid:
            self.stats.malformed_pods += 1
            log.warning("pod %s/%s ignored: metadata.uid missing", metadata.get("namespace"), metadata.get("name"))
            return
        if kind == "DELETED" or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            self._pod_changes[uid] = None  # gone: only its uid matters, its request need not be computed
            self._pods_changed.set()
            return
        if same_entry(self._pod_changes.get(uid) or self.pods.by_uid.get(uid), pod):
            return  # a status update (most events): nothing the mirror or the ledger keeps has changed
        info = self._parse(pod)
        if info is None:
            return
        self._pod_changes[uid] = info
        self._pods_changed.set()

    async def _pod_flush_loop(self) -> None:
        while True:
            await self._pods_changed.wait()
            if self._pod_flush_linger > 0 and len(self._pod_changes) < POD_WRITE_BATCH:
                await asyncio.sleep(self._pod_flush_linger)
            await self.flush_pods()
            raise_if_cancelled()

    async def flush_pods(self) -> None:
        """Apply the queued pod changes: the mirror, then the ledger (releases, then bindings, each in calls of up
        to POD_WRITE_BATCH pods), all under the lock, so a rebuild sees either none of them or all of them."""
        async with self._lock:
            self._pods_changed.clear()
            changes, self._pod_changes = self._pod_changes, {}
            if not changes:
                return
            releases, binds = self.pods.apply(changes)
            self.stats.pod_flushes += 1
            if not self.synced.is_set() or self._ledger_stale:
                return  # the (next) rebuild writes the mirror, these changes included
            writes: list[Callable[[], Awaitable[object]]] = [
                *(functools.partial(self.ledger.release_many, releases[i:i + POD_WRITE_BATCH])
                  for i in range(0, len(releases), POD_WRITE_BATCH)),
                *(functools.partial(self._bind, binds[i:i + POD_WRITE_BATCH])
                  for i in range(0, len(binds), POD_WRITE_BATCH)),
            ]
            for write in writes:
                if self._ledger_stale:
                    break
                await self._apply_pods(write())

    async def _bind(self, placements: list[Placement]) -> None:
        """bind_many, counting and logging every overcommit the apiserver's truth caused (never silent), and
        keeping the Reservations it refused room."""
        outcomes = await self.ledger.bind_many([self._counted(p) for p in placements])
        for over in outcomes:
            if isinstance(over, Overcommit):
                self.stats.overcommits += 1
                log.warning("overcommit: %s is bound to node %s, which has no room for it (%s)", over.pod,
                            over.node, over.what)
        self._note_refusals([r for r in outcomes if isinstance(r, ReservationRefused)],
                            checked=[p.uid for p in placements if p.uid in self.reservations])

    def _note_refusals(self, refused: Sequence[ReservationRefused], *, checked: Sequence[str]) -> None:
        """The Reservations among `checked` that the ledger refused room hold none (the audit does not expect their
        entries; each audit tries them again); each is told why by a Warning event, once per node and resource.
        The others of `checked` hold room."""
        still = {refusal.uid for refusal in refused}
        for uid in checked:
            if uid not in still:
                self._refused.pop(uid, None)
        for refusal in refused:
            told = f"{refusal.node}/{refusal.resource}"
            if self._refused.get(refusal.uid) != told:
                message = refusal_message(refusal)
                log.warning("%s", message)
                self.stats.reservations_refused += 1
                self._spawn(post_event(self.core, reservation_event(
                    refusal.pod.removeprefix(RESERVATION_PREFIX), refusal.uid, reason=RESERVATION_REFUSED,
                    message=message, component="hoss-resolver", warning=True)))
            self._refused[refusal.uid] = told

    async def _apply_pods(self, change: Awaitable[object]) -> None:
        """One batched pod write. Not ready: skipped, the watchdog's rebuild writes the mirror. Unreachable: the
        ledger is marked stale, later writes are skipped, and the watchdog rebuilds once Redis answers."""
        self.stats.ledger_pod_writes += 1
        try:
            await change
        except LedgerNotReadyError:
            log.debug("ledger not ready; the rebuild will carry these pod changes")
        except LedgerUnavailable as error:
            self._ledger_stale = True
            log.warning("cannot write pod changes to the ledger (%s); rebuilding once Redis answers", error)

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
            raise_if_cancelled()
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
            raise_if_cancelled()
            await asyncio.sleep(self._watchdog_interval)
            stale = self._ledger_stale
            try:
                if stale:
                    log.warning("pod changes could not be written; rebuilding the ledger from the apiserver mirror")
                elif not await self.ledger.check_fence():
                    log.warning("ledger is not ready (Redis lost its data, or writes a resolver made); rebuilding "
                                "from the apiserver mirror")
                elif (why := await self._older_copy()) is not None:
                    self.stats.stale_ledger += 1
                    log.warning("Redis holds an older copy of the ledger (%s); rebuilding from the apiserver mirror",
                                why)
                    await self.ledger.count("stale_ledger", 1, why)
                else:
                    continue
                self._ledger_stale = False
                await self.rebuild()
            except (LedgerUnavailable, LedgerNotReadyError) as error:
                self._ledger_stale = self._ledger_stale or stale
                log.warning("ledger unavailable: %s", error)


    async def _older_copy(self) -> str | None:
        """Why Redis holds another copy of the ledger than the one this sync keeps, or None. Every tick bumps the
        stamp; a Redis restarted from a snapshot or failed over to a lagging replica answers another epoch or a
        stamp that is not the next one."""
        async with self._lock:
            epoch, stamp = await self.ledger.tick()
            expected, self._stamp = self._stamp, stamp
            if self._epoch is not None and epoch != self._epoch:
                return f"epoch {epoch}, rebuilt as {self._epoch}"
            if expected is not None and stamp != expected + 1:
                return f"stamp {stamp} after {expected}"
            return None

    async def _verify_loop(self) -> None:
        while True:
            raise_if_cancelled()
            await asyncio.sleep(self._verify_interval)
            try:
                await self.verify_admitted()
                await self.verify_resized()
            except (LedgerUnavailable, LedgerNotReadyError) as error:
                log.debug("cannot check admitted entries: %s", error)

    async def verify_admitted(self) -> int:
        """Check the admitted entries that are due: GET each pod and drop the entry on proof its write failed.
        Returns how many were dropped."""
        batch = await self.ledger.verify_due(limit=VERIFY_BATCH, retry_seconds=VERIFY_RETRY_SECONDS)
        dropped = 0
        for entry in batch.entries:
            namespace, _, name = entry.pod.partition("/")
            try:
                pod: Json | None = await request_json(self.core.read_namespaced_pod, name, namespace,
                                                      _request_timeout=10)
            except KubeError as error:
                if error.status != 404:
                    log.warning("cannot check admitted %s: %s", entry.pod, error)
                    continue
                pod = None
            except (OSError, TimeoutError) as error:
                log.warning("cannot check admitted %s: %s", entry.pod, error)
                continue
            self.stats.admitted_checked += 1
            verdict = admitted_verdict(entry, pod, now_ms=batch.now_ms, write_timeout_ms=self._write_timeout_ms)
            if verdict != "keep" and await self.ledger.drop_admitted(entry):
                dropped += 1
                self.stats.admitted_dropped += 1
                log.info("admitted %s of %s on %s dropped: %s", entry.via, entry.pod, entry.node, verdict)
        return dropped

    async def verify_resized(self) -> int:
        """Set back the entries a resize grew from a review nobody authenticated, once their check is due: each bound
        pod's entry takes its request as this sync's mirror of the apiserver has it, so a resize the apiserver never
        made holds nothing after that (a resize it made is in the mirror by then, and stays). Returns how many were
        checked."""
        due = set(await self.ledger.resized_due(limit=VERIFY_BATCH))
        if not due:
            return 0
        async with self._lock:
            if not self.synced.is_set() or self._ledger_stale:
                return 0  # the rebuild writes every entry from the mirror
            pods = [pod for pod in self.pods.bound() if pod.uid in due]
            if pods:
                await self._apply_pods(self._bind(pods))
        self.stats.resizes_checked += len(pods)
        log.info("entries grown by unauthenticated resizes set to their pods' requests: %s",
                 ", ".join(pod.pod for pod in pods[:5]) or "none bound")
        return len(pods)

    async def _audit_loop(self) -> None:
        while True:
            raise_if_cancelled()
            await asyncio.sleep(self._audit_interval)
            try:
                await self.audit()
            except (LedgerUnavailable, LedgerNotReadyError) as error:
                log.warning("cannot audit the ledger: %s", error)

    async def audit(self) -> list[str]:
        """Compare the ledger's nodes and bound entries with the mirror of the apiserver, and each node's used totals
        with the sums of its entries; on drift, count it (``{hoss}:stats`` audit_drift, /metrics, /status), log a
        warning and rebuild (which recomputes every used total). Returns what differed. Without drift, the
        Reservations refused room try again (room may have freed since)."""
        async with self._lock:
            if not self.synced.is_set() or self._ledger_stale or self._pod_changes:
                return []  # changes in flight: the next round compares
            snapshot = await self.ledger.snapshot()
            entries = await self.ledger.entries()
            bound = self.bound()
            drift = ledger_drift(nodes=self.nodes, snapshot=snapshot, entries=entries,
                                 expected={p.uid: p for p in bound if p.uid not in self._refused},
                                 reservations=self.reservations)
            drift.extend(await self.ledger.used_drift())  # each node's used totals against its entries
            drift.extend(await self.ledger.quota_drift())  # elastic quotas' used totals against their entries
            self.stats.audits += 1
            if not drift and self._refused:
                await self._apply(self._bind([p for p in bound if p.uid in self._refused]))
        if drift:
            self.stats.audit_drift += len(drift)
            log.warning("ledger audit: %d differences from the apiserver, rebuilding: %s", len(drift),
                        "; ".join(drift[:5]))
            await self.ledger.count("audit_drift", len(drift), "; ".join(drift[:5]))
            await self.rebuild()
        return drift


@contextlib.contextmanager
def _logged_skip(kind: str, obj: Json) -> Any:
    try:
        yield
    except HossError as error:
        name = (obj.get("metadata") or {}).get("name")
        log.warning("%s %s ignored: %s", kind, name, error)
