"""The dispatcher's view of the cluster, as its watches keep it: the pending pods (with the book of what was sent,
dispatcher/pending.py), namespaces' labels, the default spread selectors' sources, PodGroups, Reservations and Jobs;
the informer handlers that keep it, and the /status views read from it.

No Redis and no apiserver writes: `Dispatcher` (dispatcher/core.py), which acts on the view in its rounds, extends
it. The handlers run in the informers' tasks and only change memory, between awaits of the one event loop, so the
rounds need no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from dispatcher import dependencies
from dispatcher.gangbook import GangBook, gang_key
from dispatcher.gangs import GangKey, PodGroupSpec
from dispatcher.hints import owns
from dispatcher.intake import (
    PendingPod,
    left_by_deletion,
    namespace_labels,
    oldest_pending_age,
    parse_pending_pod,
    pod_uid,
)
from dispatcher.loads import Assignments
from dispatcher.metrics import DispatcherMetrics
from dispatcher.pending import PendingBook
from dispatcher.settings import DispatcherSettings
from dispatcher.spreading import SelectorSources
from dispatcher.status import GangStatus, PendingStatus, QueueStatus, ThroughputStatus
from dispatcher.statusviews import gang_view, pending_view
from dispatcher.throughput import BoundRate
from dispatcher.waiting import Waitlist
from hoss.errors import PodSpecError
from hoss.kube.client import InformerHandlers
from hoss.model.objects import Json, section
from hoss.model.reservations import RefusedReservation, Reservation
from hoss.model.resourceclaims import DeviceCatalog
from hoss.model.storage import StorageCatalog

log = logging.getLogger(__name__)

SPREAD_SOURCE_KINDS = ("service", "rc", "rs", "ss")
"""What the default spread selector is made of (`dispatcher.spreading`)."""


WAITING_CLAIMS = '"delayed":[{'
"""How a compact form with claims waiting for their first consumer reads (`hoss.model.storage.storage_context`)."""
ATTACH = '"attach":{'
"""How a compact form that counts CSI attach limits reads (`hoss.model.storage.attach_context`)."""


def storage_touches(kind: str, raw: Json) -> Callable[[PendingPod], bool]:
    """Which pending pods with volumes one changed storage object may concern (a cheap test of their compact
    forms, which may say yes too often, never no wrongly): a claim, the pods of its namespace that name it (its
    name, or a generic ephemeral volume's, is in the form once its context was computed); a PV, the pods whose
    claims wait for their first consumer (it may be a candidate now or no longer) or that name it (bound); a
    class, a CSIDriver or a capacity, the pods whose claims wait or that wait for a problem (a class not found); a
    CSINode, every pod with volumes (its attach limits may now count theirs); a VolumeAttachment, the pods whose
    form counts attach limits. A claim, PV or class also concerns the
    pods whose form counts attach limits (`ATTACH`: it lists every claim of the limited drivers)."""
    metadata = section(raw, "metadata")
    name = str(metadata.get("name") or "")
    if kind == "claims":
        namespace = str(metadata.get("namespace") or "default")
        return lambda pod: ATTACH in pod.compact or (pod.namespace == namespace and name in pod.compact)
    if kind == "volumes":
        return lambda pod: WAITING_CLAIMS in pod.compact or ATTACH in pod.compact or f'"{name}"' in pod.compact
    if kind == "csinodes":
        return lambda pod: True
    if kind == "attachments":
        return lambda pod: ATTACH in pod.compact
    return lambda pod: WAITING_CLAIMS in pod.compact or ATTACH in pod.compact or '"problem"' in pod.compact


class ClusterView:
    """What the watches tell the dispatcher, and the handlers that keep it."""

    def __init__(
        self,
        *,
        settings: DispatcherSettings,
        metrics: DispatcherMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = metrics if metrics is not None else DispatcherMetrics()
        self.rate = BoundRate()
        self.synced = asyncio.Event()
        """Set once the pending-pod watch has listed."""
        self.book = PendingBook()
        """The pending pods, the dispatched map and what is to be sent (`pending`, `dispatched`)."""
        self.namespaces: dict[str, dict[str, str]] | None = None
        """Labels by namespace (None until the namespace watch listed, or without one): they resolve pods'
        namespaceSelectors into their compact forms."""
        self.namespaces_synced = asyncio.Event()
        self.spread_sources = SelectorSources()
        """Services' and controllers' selectors: the default spread selector of each pod's compact form."""
        self.spread_synced = {kind: asyncio.Event() for kind in SPREAD_SOURCE_KINDS}
        self.storage = StorageCatalog()
        """Claims, PVs, StorageClasses, CSIDrivers, CSIStorageCapacities and CSINodes: what each pod's volumes
        need, in its compact form (`hoss.model.storage`)."""
        self.storage_synced = {kind: asyncio.Event() for kind in StorageCatalog.KINDS}
        self.devices = DeviceCatalog()
        """ResourceClaims, ResourceSlices and DeviceClasses: what each pod's ResourceClaims need, in its compact
        form (`hoss.model.resourceclaims`)."""
        self.devices_synced = {kind: asyncio.Event() for kind in DeviceCatalog.KINDS}
        self.waiting = Waitlist()
        self.gangs = GangBook()
        """What the leader remembers of gangs (dispatcher/gangbook.py)."""
        self.podgroups: dict[GangKey, PodGroupSpec] = {}
        """scheduler-plugins PodGroups by namespace/name (empty when the CRD is not installed)."""
        self.reservations: dict[str, Reservation] = {}
        self.refused_reservations: dict[str, RefusedReservation] = {}
        """Reservations hoss refuses (a field it cannot honour), by uid: the leader writes why on each, once per
        generation (dispatcher/reservations.py)."""
        """Koordinator Reservations by uid (dispatcher/reservations.py): a Pending one is placed like a pod (it sits
        in `pending` under its uid); an Available one is offered to the pending pods it owns (`_with_hints`)."""
        self.jobs: dict[str, dict[str, dependencies.JobState]] = {}
        """Jobs by namespace and name, for pods with ``hoss.io/depends-on`` (dispatcher/jobs.py)."""
        self.podgroup_states: dict[str, dict[str, dependencies.JobState]] = {}
        """PodGroups by namespace and name, for ``hoss.io/depends-on: podgroup/NAME`` (dispatcher/podgroups.py)."""
        self._failing: dict[str, asyncio.Task[None]] = {}
        """Pods being failed, or failed, because a dependency failed (``failed_dependency: fail``), by uid, until
        the pod watch drops them."""
        self._clock = clock
        self._wall = wall
        self._wakeup = asyncio.Event()
        """Set when something may let pods go: the leader's rounds then dispatch the fresh ones at once."""
        self.metrics.gated.set_function(lambda: sum(1 for pod in self.pending.values() if pod.gated))
        self.metrics.oldest_pending.set_function(
            lambda: oldest_pending_age(self.pending.values(), now_unix=self._wall()))

    @property
    def pending(self) -> dict[str, PendingPod]:
        """The pending pods by uid."""
        return self.book.pods

    @property
    def dispatched(self) -> Assignments:
        """pod uid -> worker id, this replica's copy of the Redis map."""
        return self.book.dispatched

    # -- intake (informer handlers) -------------------------------------------------------------------------

    def handlers(self) -> InformerHandlers:
        return InformerHandlers(on_list=self.on_list, on_event=self.on_event)

    async def on_list(self, items: list[Json]) -> None:
        listed: set[str] = set()
        for raw in items:
            uid = self._observe(raw)
            if uid is not None:
                listed.add(uid)
        for uid in [uid for uid in self.pending if uid not in listed and uid not in self.reservations]:
            self._drop(uid, deleted=False)
        log.info("pending-pod watch listed %d pods (%d to place)", len(items), len(self.pending))

    async def on_event(self, kind: str, raw: Json) -> None:
        if kind == "DELETED":
            try:
                uid = pod_uid(raw)
            except PodSpecError as error:
                log.warning("ignoring malformed pod in a DELETED event: %s", error)
                return
            self._drop(uid, deleted=left_by_deletion(raw))
        else:
            self._observe(raw)

    def spread_handlers(self, kind: str) -> InformerHandlers:
        """Handlers of the watch of Services (``service``) or of one controller kind (``rc``, ``rs``, ``ss``)."""

        async def on_list(items: list[Json]) -> None:
            self.spread_sources.replace(kind, items)
            self.spread_synced[kind].set()

        async def on_event(event: str, raw: Json) -> None:
            self.spread_sources.apply(kind, event, raw)

        return InformerHandlers(on_list=on_list, on_event=on_event)

    def storage_handlers(self, kind: str) -> InformerHandlers:
        """Handlers of the watch of one kind of storage object (`StorageCatalog.KINDS`): a change recomputes the
        storage needs of the pending pods with claims, which are then sent (again) when theirs changed."""

        async def on_list(items: list[Json]) -> None:
            self.storage.replace(kind, items)
            self.storage_synced[kind].set()
            self._storage_changed()

        async def on_event(event: str, raw: Json) -> None:
            self.storage.apply(kind, event, raw)
            self._storage_changed(storage_touches(kind, raw))

        return InformerHandlers(on_list=on_list, on_event=on_event)

    def device_handlers(self, kind: str) -> InformerHandlers:
        """Handlers of the watch of one kind of DRA object (`DeviceCatalog.KINDS`): a change recomputes what the
        ResourceClaims of the pending pods with any need, which are then sent (again) when theirs changed."""

        async def on_list(items: list[Json]) -> None:
            self.devices.replace(kind, items)
            self.devices_synced[kind].set()
            if self.book.devices_changed(self.devices):
                self._wakeup.set()

        async def on_event(event: str, raw: Json) -> None:
            self.devices.apply(kind, event, raw)
            if self.book.devices_changed(self.devices):
                self._wakeup.set()

        return InformerHandlers(on_list=on_list, on_event=on_event)

    def _storage_changed(self, touches: Callable[[PendingPod], bool] | None = None) -> None:
        if self.book.storage_changed(self.storage, touches=touches):
            self._wakeup.set()

    def namespace_handlers(self) -> InformerHandlers:
        return InformerHandlers(on_list=self.on_namespace_list, on_event=self.on_namespace_event)

    async def on_namespace_list(self, items: list[Json]) -> None:
        self.namespaces = dict(entry for entry in map(namespace_labels, items) if entry is not None)
        self._namespaces_changed(None)
        self.namespaces_synced.set()

    async def on_namespace_event(self, kind: str, raw: Json) -> None:
        entry = namespace_labels(raw)
        if entry is None or self.namespaces is None:
            return
        name, labels = entry
        if kind == "DELETED":
            changed = self.namespaces.pop(name, None) is not None
        else:
            changed = self.namespaces.get(name) != labels
            self.namespaces[name] = labels
        if changed:
            self._namespaces_changed(name)

    def _namespaces_changed(self, name: str | None) -> None:
        """Namespace labels changed (of `name`, or of any): the pods whose compact forms read them are resent or
        dispatched now (`PendingBook.relabel`)."""
        assert self.namespaces is not None
        if self.book.relabel(name, self.namespaces):
            self._wakeup.set()

    def _observe(self, raw: Json) -> str | None:
        """Apply one pod's current state; the uid when it is (still) pending and ours."""
        try:
            uid = pod_uid(raw)
            pod = parse_pending_pod(
                raw, scheduler_names=self.settings.scheduler_names, default_policy=self.settings.default_policy,
                seen_at=self._clock(), queued_unix=self._wall(), namespaces=self.namespaces,
                sources=self.spread_sources, storage=self.storage, devices=self.devices,
            )
        except PodSpecError as error:
            name = (raw.get("metadata") or {}).get("name", "?")
            log.warning("ignoring malformed pod %s: %s", name, error)
            return None
        if pod is None:
            self._drop(uid, deleted=left_by_deletion(raw))
            return None
        new, due = self.book.observe(pod)
        if new:
            self.gangs.changed(pod, now=self._clock())
        if due:
            self._wakeup.set()
        return uid

    def _drop(self, uid: str, *, deleted: bool) -> None:
        """The pod left the pending set: bound, deleted or finished."""
        left, placed = self.book.drop(uid)
        if left is not None:
            self.gangs.changed(left, now=self._clock())
        self.waiting.pop(uid, None)
        failing = self._failing.get(uid)
        if failing is not None and failing.done():
            del self._failing[uid]
        if placed and not deleted:
            self.rate.bound(self._clock())
            self.metrics.bound.inc()

    # -- views ----------------------------------------------------------------------------------------------

    def undispatched_count(self, dispatched: Mapping[str, str] | None = None) -> int:
        return self.book.undispatched(dispatched)

    def throughput(self) -> ThroughputStatus:
        return self.rate.view(self._clock(), now_unix=self._wall())

    def pending_status(self, dispatched: Mapping[str, str] | None = None) -> PendingStatus:
        """The oldest pending pods and why each waits (``dispatched``: Redis's map, else this replica's copy)."""
        return pending_view(
            self.pending.values(), dispatched=self.dispatched if dispatched is None else dispatched,
            waiting=self.waiting.reasons(), now_unix=self._wall(), now_monotonic=self._clock(),
        )

    def gang_status(self, dispatched: Mapping[str, str] | None = None) -> list[GangStatus]:
        return gang_view(
            self.pending.values(), dispatched=self.dispatched if dispatched is None else dispatched,
            podgroups=self.podgroups,
        )

    def queue_status(self, dispatched: Mapping[str, str] | None = None) -> QueueStatus:
        return QueueStatus(
            pending_total=len(self.pending),
            undispatched=self.undispatched_count(dispatched),
            waiting_for_worker=self.waiting.rows(),
        )

    # -- events of the other watches ------------------------------------------------------------------------

    def on_job(self, namespace: str, name: str, state: dependencies.JobState | None, *, kind: str = "job") -> None:
        """A Job (or, ``kind="podgroup"``, a PodGroup) changed (None: deleted): the pending pods of its namespace
        that depend on Jobs or PodGroups are looked at again at once."""
        known = self.podgroup_states if kind == "podgroup" else self.jobs
        states = known.setdefault(namespace, {})
        if state is None:
            states.pop(name, None)
        else:
            states[name] = state
        if self.book.look_again([uid for uid, pod in self.pending.items()
                                 if pod.namespace == namespace and dependencies.ANNOTATION in pod.annotations]):
            self._wakeup.set()

    def on_reservation_gone(self, uid: str) -> None:
        """A Reservation left Pending (placed, used, failed) or was deleted: it is no longer placed as a pod."""
        if uid in self.pending:
            self._drop(uid, deleted=False)

    def on_reservation_available(self, reservation: Reservation) -> None:
        """A Reservation became Available: its owners already sent to a worker (which may be backing off with
        nothing else fitting) are sent again with it, behind their old version (`_resend_changed`)."""
        owners = [uid for uid, pod in self.pending.items()
                  if uid in self.dispatched and uid not in self.reservations and gang_key(pod) is None
                  and owns(reservation, pod)]
        if self.book.resend(owners):
            self._wakeup.set()

    def wake(self) -> None:
        """Something changed that may let waiting pods go (e.g. a PodGroup appeared)."""
        self._wakeup.set()

    def _pending_gangs(self) -> set[GangKey]:
        return {key for pod in self.pending.values() if (key := gang_key(pod)) is not None}

    def prune_gangs(self, *, older_than: float) -> None:
        """As follower, forget gangs that changed long ago and have no pending member (the leader counts them)."""
        self.gangs.prune(self._pending_gangs(), now=self._clock(), older_than=older_than)
