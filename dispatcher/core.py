"""The dispatch core: the `Dispatcher` (pending-pod views, leader rounds, gang holding, reclaim) and its roles.

A watch on unbound pods (field selector ``spec.nodeName=``) keeps `Dispatcher.pending`. The leader sends every
pending pod that is not in the dispatched map to the least-loaded live worker serving its policy (one
transaction writes the stream entry and the map), and every reclaim interval it takes the work of dead workers
back and sends it again. A pod whose policy no live worker serves waits, is retried every round, and gets a
``NoWorkerForPolicy`` event. Followers keep their watch and their view of Redis warm and take over on election.

Invariants:
- Only the leader writes the work queues and the dispatched map (workers acknowledge their own items).
- A pod is in at most one worker's stream at a time: it is sent again only after it left the dispatched map,
  because its worker died and was reclaimed, because the map named a worker that no longer exists, or because
  its worker acknowledged it and the pod still looks pending ``informer_lag_seconds`` later (the watch may lag
  the binding; a worker hands back only what it cannot parse, so repeats back off exponentially).
- A dispatched uid leaves the map when its pod leaves the pending set (bound or deleted), or after
  ``informer_lag_seconds`` of not being pending at all (e.g. deleted while no leader watched).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson
from kubernetes_asyncio import client
from redis.exceptions import RedisError

from dispatcher import dependencies
from dispatcher.gangs import (
    GangCounts,
    GangKey,
    PodGroupSpec,
    count_members,
    gang_of,
    gang_state,
    member_selector,
    podgroup_phase,
)
from dispatcher.intake import (
    PendingPod,
    dispatch_order,
    item_uids,
    left_by_deletion,
    namespace_labels,
    parse_pending_pod,
    plan_work_items,
    pod_uid,
    single_item,
    with_namespaces,
)
from dispatcher.leader import LeaderElector
from dispatcher.metrics import DispatcherMetrics
from dispatcher.routing import choose_worker
from dispatcher.settings import DispatcherSettings
from dispatcher.spreading import SelectorSources
from dispatcher.status import GangStatus, PendingStatus, QueueStatus, ThroughputStatus, WaitingPod
from dispatcher.statusviews import gang_view, pending_view
from dispatcher.throughput import BoundRate
from hoss.errors import LedgerUnavailable, PodSpecError
from hoss.kube.client import InformerHandlers, KubeError, request_json
from hoss.kube.events import pod_event, post_event, reservation_event, set_unschedulable, unschedulable_condition
from hoss.kube.rest import STRATEGIC_MERGE_PATCH
from hoss.model import compact, reservations
from hoss.model.objects import Json
from hoss.model.reservations import Reservation
from hoss.queue import BOUND_PREFIX, GangMember, WorkerInfo, WorkItem, WorkQueue

log = logging.getLogger(__name__)

COMPONENT = "hoss-dispatcher"
NO_WORKER_REASON = "NoWorkerForPolicy"
GANG_WAITING_REASON = "GangIncomplete"
GANG_TIMEOUT_REASON = "GangTimeout"
HANDBACK_BACKOFF_MAX_SECONDS = 300.0
GANG_QUIET_ROUNDS = 5
"""A gang with no pending member is counted until its counts stood still this many rounds (members start)."""
FRESH_BEATS_SECONDS = 0.1
"""How old the workers' heartbeats may be when the dispatcher is about to pass over a busier worker (engaging one
with less outstanding); older ones are read again first, so they are read at most this often."""
PLACED_PATIENCE = 10
"""A pod its worker bound but our watch still shows pending is sent again after this many informer lags."""
STATUS_TIMEOUT_SECONDS = 5.0


class Assignments(dict[str, str]):
    """pod uid -> worker id, with a running count of uids per worker (no recount per dispatch)."""

    def __init__(self, initial: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        for uid, worker in (initial or {}).items():
            self[uid] = worker

    def __setitem__(self, uid: str, worker: str) -> None:
        previous = self.get(uid)
        if previous is not None:
            self.counts[previous] -= 1
        super().__setitem__(uid, worker)
        self.counts[worker] += 1

    def __delitem__(self, uid: str) -> None:
        self.counts[self[uid]] -= 1
        super().__delitem__(uid)

    def pop(self, uid: str, default: Any = None) -> Any:
        if uid in self:
            self.counts[self[uid]] -= 1
        return super().pop(uid, default)


def worker_loads(workers: Sequence[WorkerInfo], dispatched: Mapping[str, str]) -> dict[str, int]:
    """Outstanding uids per live worker as the dispatched map counts them (0 for a worker with none)."""
    counts = dispatched.counts if isinstance(dispatched, Assignments) else collections.Counter(dispatched.values())
    return {worker.id: counts[worker.id] for worker in workers}


def no_worker_message(policy: str, *, what: str = "pod") -> str:
    return f"no live hoss worker serves policy {policy!r}; the {what} waits until one does"


def waits_for(pod: PendingPod) -> str:
    """What waits: a pod, or the Reservation a pending 'pod' stands for (`reservations.as_pod`)."""
    return "Reservation" if reservations.ANNOTATION in pod.annotations else "pod"


def handback_delay(handbacks: int, *, lag_seconds: float) -> float:
    """How long a pod its worker acknowledged while it still looks pending waits before it is sent again."""
    if handbacks <= 0:
        return 0.0
    return float(min(lag_seconds * 2 ** (handbacks - 1), HANDBACK_BACKOFF_MAX_SECONDS))



async def write_reservation_status(api: Any, name: str, patch: Json, *, what: str) -> bool:
    """Merge-patch a Reservation's status; False (logged, naming ``what`` was written) when the apiserver refused
    it."""
    custom: Any = client.CustomObjectsApi(api)
    group, version, plural = reservations.API
    try:
        await request_json(custom.patch_cluster_custom_object_status, group, version, plural, name, patch,
                           _content_type="application/merge-patch+json", _request_timeout=STATUS_TIMEOUT_SECONDS * 2)
    except KubeError as error:
        log.warning("cannot write %s of Reservation %s: %s", what, name, error)
        return False
    return True


class Notifier(Protocol):
    """Tells a pod's owner why it waits, or why it failed."""

    async def waiting(self, pod: PendingPod, *, reason: str, message: str) -> None: ...

    async def failed(self, pod: PendingPod, *, reason: str, message: str) -> bool:
        """Set the pod's phase Failed with the reason; False when that could not be written."""
        ...


class KubeNotifier:
    """A Warning event and PodScheduled=False, as ``kubectl describe pod`` shows them; for a Reservation, a Warning
    event on it and a Scheduled=False condition in its status. Best effort."""

    def __init__(self, core: Any) -> None:
        self.core = core

    async def waiting(self, pod: PendingPod, *, reason: str, message: str) -> None:
        name = pod.annotations.get(reservations.ANNOTATION)
        if name:
            await post_event(self.core, reservation_event(name, pod.uid, reason=reason, message=message,
                                                           component=COMPONENT, warning=True))
            await write_reservation_status(self.core.api_client, name, reservations.no_worker_status(message),
                                           what="the status")
            return
        event = pod_event(
            namespace=pod.namespace, name=pod.name, uid=pod.uid, reason=reason, message=message,
            component=COMPONENT,
        )
        await post_event(self.core, event)
        await set_unschedulable(self.core, namespace=pod.namespace, name=pod.name, message=message, reason=reason)

    async def failed(self, pod: PendingPod, *, reason: str, message: str) -> bool:
        """status.phase Failed with the reason and message (and PodScheduled=False), then a Warning event."""
        patch = unschedulable_condition(message, reason=reason)
        patch["status"].update({"phase": "Failed", "reason": reason, "message": message[:1024]})
        try:
            await request_json(self.core.patch_namespaced_pod_status, pod.name, pod.namespace, patch,
                               _content_type=STRATEGIC_MERGE_PATCH)
        except KubeError as error:
            if error.status != 404:  # gone already: nothing to fail
                log.warning("cannot fail pod %s: %s", pod.key, error)
                return False
            return True
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("cannot fail pod %s: %s", pod.key, error)
            return False
        await post_event(self.core, pod_event(namespace=pod.namespace, name=pod.name, uid=pod.uid, reason=reason,
                                              message=message, component=COMPONENT))
        return True


@dataclass
class Waiting:
    """A pending pod that no live worker serves."""

    pod: str
    policy: str
    since_unix: float
    notified_at: float | None = None
    """Monotonic time of the last notice."""
    reason: str = NO_WORKER_REASON
    message: str = ""
    """What the notice says; empty means the no-worker message for ``policy``."""


@dataclass
class TickReport:
    """What one leader round did."""

    dead_workers: list[str] = field(default_factory=list)
    reclaimed: int = 0
    """Pod uids taken back from dead workers."""
    dispatched: int = 0
    """Pod uids sent to workers."""
    waiting: int = 0
    """Pods waiting for a worker after the round."""


def _always_leader() -> bool:
    return True


SPREAD_SOURCE_KINDS = ("service", "rc", "rs", "ss")
"""What the default spread selector is made of (`dispatcher.spreading`)."""


class Dispatcher:
    """The intake (informer handlers), the leader's rounds and the follower's read-only refresh.

    One task runs `lead` or `follow` at a time; the informer's handlers run in another task and only touch the
    in-memory views, so no lock is needed (every method here runs between awaits of the one event loop).
    """

    def __init__(
        self,
        *,
        queue: WorkQueue,
        settings: DispatcherSettings,
        notifier: Notifier | None = None,
        metrics: DispatcherMetrics | None = None,
        rng: random.Random | None = None,
        is_leader: Callable[[], bool] = _always_leader,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.queue = queue
        self.settings = settings
        self.notifier = notifier
        self.metrics = metrics if metrics is not None else DispatcherMetrics()
        self.rate = BoundRate()
        self.synced = asyncio.Event()
        """Set once the pending-pod watch has listed."""
        self.pending: dict[str, PendingPod] = {}
        self.namespaces: dict[str, dict[str, str]] | None = None
        """Labels by namespace (None until the namespace watch listed, or without one): they resolve pods'
        namespaceSelectors into their compact forms."""
        self.namespaces_synced = asyncio.Event()
        self.spread_sources = SelectorSources()
        """Services' and controllers' selectors: the default spread selector of each pod's compact form."""
        self.spread_synced = {kind: asyncio.Event() for kind in SPREAD_SOURCE_KINDS}
        self.dispatched: Assignments = Assignments()
        """pod uid -> worker id, this replica's copy of the Redis map."""
        self.waiting: dict[str, Waiting] = {}
        self.podgroups: dict[GangKey, PodGroupSpec] = {}
        self.reservations: dict[str, Reservation] = {}
        self.jobs: dict[str, dict[str, dependencies.JobState]] = {}
        """Jobs by namespace and name, for pods with ``hoss.io/depends-on`` (dispatcher/jobs.py)."""
        self.podgroup_states: dict[str, dict[str, dependencies.JobState]] = {}
        """PodGroups by namespace and name, for ``hoss.io/depends-on: podgroup/NAME`` (dispatcher/podgroups.py)."""
        self._failing: dict[str, asyncio.Task[None]] = {}
        """Pods being failed, or failed, because a dependency failed (``failed_dependency: fail``), by uid, until
        the pod watch drops them."""
        """Koordinator Reservations by uid (dispatcher/reservations.py): a Pending one is placed like a pod (it sits
        in `pending` under its uid); an Available one is offered to the pending pods it owns (`_with_hints`)."""
        # Members already bound count toward a gang's min-available (scheduler-plugins' Coscheduling). The pending
        # watch never sees bound pods, so the leader counts them by listing the gang's members by label, only for
        # gangs that changed (a member appeared or left the pending set; `gangs_dirty`), every few seconds
        # (`refresh_gangs`): one apiserver list, served from its watch cache, per active gang, off the dispatch
        # path. The same list gives the PodGroup's status (scheduled, running). The alternatives cost more or
        # know less: the ledger's entries carry no labels, and a counter kept by the workers misses members that
        # another scheduler bound or that were deleted since.
        self.gang_counts: dict[GangKey, tuple[float, GangCounts]] = {}
        """Bound and running members by gang, with the time they were counted."""
        self.gangs_dirty: dict[GangKey, float] = {}
        """Gangs to count again, with when they last changed."""
        self._gang_selectors: dict[GangKey, str] = {}
        self._gang_quiet: dict[GangKey, int] = {}
        self._podgroup_status: dict[GangKey, Json] = {}
        self._gang_since: dict[GangKey, float] = {}
        """scheduler-plugins PodGroups by namespace/name (empty when the CRD is not installed)."""
        self.workers: list[WorkerInfo] = []
        """Live workers as of the last round."""
        self._beats_read_at = -math.inf
        """When `workers` was last read from their heartbeats (``clock``)."""
        self.redis_error: str | None = None
        self._rng = rng if rng is not None else random.Random()
        self._is_leader = is_leader
        self._clock = clock
        self._wall = wall
        self._fresh: dict[str, None] = {}  # uids that became pending since the last dispatch, in arrival order
        self._changed: dict[str, None] = {}  # dispatched uids whose compact form changed since it was sent
        self._placed_since: dict[str, float] = {}  # uids bound by a worker but still pending here, since when
        self._wakeup = asyncio.Event()
        self._gone: set[str] = set()  # dispatched uids whose pods left the pending set, to forget in Redis
        self._absent_since: dict[str, float] = {}  # dispatched uids not seen pending, since when
        self._handed_back: dict[str, tuple[float, int]] = {}  # uid -> (when, how many times) acknowledged early
        self._attempts: dict[str, int] = {}
        self._progress: dict[str, tuple[float, int]] = {}  # worker id -> (started_unix, progress) last seen
        self._sent_since: dict[str, float] = {}  # worker id -> first send since its progress last moved
        self._sends: dict[str, collections.deque[tuple[float, int]]] = {}  # worker id -> (unix time, pods) sent
        self._notices: asyncio.Task[None] | None = None
        m = self.metrics
        m.pending.set_function(lambda: len(self.pending))
        m.undispatched.set_function(self.undispatched_count)
        m.waiting.set_function(lambda: len(self.waiting))
        m.live_workers.set_function(lambda: len(self.workers))

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
        """Namespace labels changed (of `name`, or of any): recompute the compact forms that read them (pods of
        that namespace, pods with namespaceSelectors), resend those already dispatched and dispatch the others
        now, as their inter-pod terms may now hold elsewhere."""
        assert self.namespaces is not None
        for uid, pod in list(self.pending.items()):
            if name is not None and pod.namespace != name and '"selected"' not in pod.compact:
                continue
            updated = with_namespaces(pod, self.namespaces)
            if updated is pod:
                continue
            self.pending[uid] = updated
            if uid in self.dispatched:
                self._changed[uid] = None
            elif not updated.gated:
                self._handed_back.pop(uid, None)
                self._fresh[uid] = None
            self._wakeup.set()

    def _observe(self, raw: Json) -> str | None:
        """Apply one pod's current state; the uid when it is (still) pending and ours."""
        try:
            uid = pod_uid(raw)
            pod = parse_pending_pod(
                raw, scheduler_names=self.settings.scheduler_names, default_policy=self.settings.default_policy,
                seen_at=self._clock(), namespaces=self.namespaces, sources=self.spread_sources,
            )
        except PodSpecError as error:
            name = (raw.get("metadata") or {}).get("name", "?")
            log.warning("ignoring malformed pod %s: %s", name, error)
            return None
        if pod is None:
            self._drop(uid, deleted=left_by_deletion(raw))
            return None
        known = self.pending.get(uid)
        if known is None:
            self.pending[uid] = pod
            self._gang_changed(pod)
            self._absent_since.pop(uid, None)
            if uid not in self.dispatched:
                self._fresh[uid] = None
                self._wakeup.set()
        elif (updated := dataclasses.replace(pod, seen_at=known.seen_at)) != known:
            self.pending[uid] = updated  # labels, annotations or the PodScheduled condition changed
            if known.gated and not updated.gated and uid not in self.dispatched:
                self._fresh[uid] = None  # its last scheduling gate was removed: dispatch it now
                self._wakeup.set()
            if updated.digest != known.digest and uid in self.dispatched:
                self._changed[uid] = None  # the worker holds an older version: send the new one behind it
                self._wakeup.set()
        return uid

    def _drop(self, uid: str, *, deleted: bool) -> None:
        """The pod left the pending set: bound, deleted or finished."""
        left = self.pending.pop(uid, None)
        if left is not None:
            self._gang_changed(left)
        self._fresh.pop(uid, None)
        self._changed.pop(uid, None)
        self.waiting.pop(uid, None)
        self._attempts.pop(uid, None)
        failing = self._failing.get(uid)
        if failing is not None and failing.done():
            del self._failing[uid]
        handed_back = self._handed_back.pop(uid, None)
        was_dispatched = self.dispatched.pop(uid, None) is not None
        if was_dispatched:
            self._gone.add(uid)
        if (was_dispatched or handed_back is not None) and not deleted:
            self.rate.bound(self._clock())
            self.metrics.bound.inc()

    # -- views ----------------------------------------------------------------------------------------------

    def undispatched_count(self, dispatched: Mapping[str, str] | None = None) -> int:
        assigned = self.dispatched if dispatched is None else dispatched
        return sum(1 for uid in self.pending if uid not in assigned)

    def throughput(self) -> ThroughputStatus:
        return self.rate.view(self._clock(), now_unix=self._wall())

    def pending_status(self, dispatched: Mapping[str, str] | None = None) -> PendingStatus:
        """The oldest pending pods and why each waits (``dispatched``: Redis's map, else this replica's copy)."""
        waiting = {
            uid: (w.reason, w.message or no_worker_message(w.policy)) for uid, w in self.waiting.items()
        }
        return pending_view(
            self.pending.values(), dispatched=self.dispatched if dispatched is None else dispatched,
            waiting=waiting, now_unix=self._wall(), now_monotonic=self._clock(),
        )

    def gang_status(self, dispatched: Mapping[str, str] | None = None) -> list[GangStatus]:
        return gang_view(
            self.pending.values(), dispatched=self.dispatched if dispatched is None else dispatched,
            podgroups=self.podgroups,
        )

    def queue_status(self, dispatched: Mapping[str, str] | None = None) -> QueueStatus:
        rows = sorted(
            (WaitingPod(pod=w.pod, policy=w.policy, since=round(w.since_unix, 3)) for w in self.waiting.values()),
            key=lambda row: (row.since, row.pod),
        )
        return QueueStatus(
            pending_total=len(self.pending),
            undispatched=self.undispatched_count(dispatched),
            waiting_for_worker=rows,
        )

    # -- leader -------------------------------------------------------------------------------------------

    async def lead(self) -> None:
        """Dispatch and reclaim until cancelled: a full round every reclaim interval, new pods as they come."""
        await self.synced.wait()
        log.info("leading: %d pending pods to look at", len(self.pending))
        try:
            await self._lead_rounds()
        finally:
            if self._notices is not None:
                self._notices.cancel()

    async def _lead_rounds(self) -> None:
        interval = self.settings.reclaim_interval_seconds
        while True:
            await self._guarded(self.tick())
            deadline = self._clock() + interval
            while (remaining := deadline - self._clock()) > 0:
                try:
                    async with asyncio.timeout(remaining):
                        await self._wakeup.wait()
                except TimeoutError:
                    break
                self._wakeup.clear()
                # While Redis is down, new pods wait for the next full round, which also notices the recovery.
                if self.redis_error is None:
                    await self._guarded(self.dispatch_pending(fresh_only=True))

    async def tick(self) -> TickReport:
        """One leader round: reclaim dead workers' work, resync the dispatched map, send every pod that needs a
        worker, and tell pods that wait why."""
        report = await self.reclaim_step()
        await self._flush_gone()
        await self._sync_dispatched(leader=True)
        report.dispatched += await self.dispatch_pending()
        report.waiting = len(self.waiting)
        self._notify_waiting()
        return report

    async def reclaim_step(self) -> TickReport:
        """Refresh the live workers; take every unfinished item of each dead worker back and send its pods to
        live workers serving their policy (those no live worker serves wait)."""
        live, dead = await self.queue.workers()
        stalled = self._take_beats(live)
        report = TickReport(dead_workers=sorted(dead | stalled))
        reclaimed: dict[str, None] = {}
        for worker_id in report.dead_workers:
            if not self._is_leader():
                break
            items = await self.queue.reclaim(worker_id)
            uids = list(dict.fromkeys(
                [uid for item in items for uid in item_uids(item)]
                + [uid for uid, owner in self.dispatched.items() if owner == worker_id]
            ))
            # Until they are sent again these pods belong to nobody: a leader that dies right here leaves them
            # undispatched in Redis (its successor sends them), never assigned to a worker that is gone.
            await self.queue.forget(uids)
            for uid in uids:
                self.dispatched.pop(uid, None)
                self._attempts[uid] = self._attempts.get(uid, 0) + 1
                reclaimed[uid] = None
            still_pending = sum(1 for uid in uids if uid in self.pending)
            log.warning(
                "worker %s %s: took back %d items (%d pods still pending)", worker_id,
                f"heartbeats but read nothing for {self.settings.stall_seconds:.0f}s" if worker_id in stalled
                else "stopped heartbeating", len(items), still_pending,
            )
            self._progress.pop(worker_id, None)
            self._sent_since.pop(worker_id, None)
            self.metrics.dead_workers.inc()
            self.metrics.reclaimed_pods.inc(len(uids))
        report.reclaimed = len(reclaimed)
        pods = [self.pending[uid] for uid in reclaimed if uid in self.pending]
        report.dispatched = await self._send(sorted(pods, key=dispatch_order))
        return report

    def _take_beats(self, live: Sequence[WorkerInfo]) -> set[str]:
        """Route to the ``live`` workers that are neither stalled nor unhealthy; the stalled ones are returned."""
        stalled = self._stalled(live)
        self.workers = [w for w in live if w.id not in stalled and not w.unhealthy]
        self._note_beats(live)
        self._beats_read_at = self._clock()
        return stalled

    async def _look_again(self) -> bool:
        """Read the workers' heartbeats again before passing over a busier worker or parking a pod no listed
        worker serves, unless they were read within FRESH_BEATS_SECONDS: the view is up to a round old, and a
        worker that started deciding since (its first beat with a rate comes right after its first batch) may well
        keep up, as a worker that started since may serve the pod. True when they were read."""
        if self._clock() - self._beats_read_at < FRESH_BEATS_SECONDS:
            return False
        live, _dead = await self.queue.workers()
        self._take_beats(live)
        return True

    def _note_beats(self, live: Sequence[WorkerInfo]) -> None:
        """Forget the sends that every live worker's heartbeat already counts (and those of workers gone)."""
        beats = {worker.id: worker.heartbeat_unix for worker in live}
        for worker_id in list(self._sends):
            sends = self._sends[worker_id]
            if worker_id not in beats:
                del self._sends[worker_id]
                continue
            while sends and sends[0][0] <= beats[worker_id]:
                sends.popleft()

    def backlog(self) -> dict[str, int]:
        """Each live worker's pods waiting for a decision, as far as the dispatcher can tell: those its last
        heartbeat called ready plus those sent since, less what it decides at its ``decide_rate`` in the time
        since that beat (dispatcher/routing.py)."""
        now = self._wall()
        backlog = {}
        for worker in self.workers:
            since = sum(n for when, n in self._sends.get(worker.id, ()) if when > worker.heartbeat_unix)
            decided = worker.decide_rate * max(0.0, now - worker.heartbeat_unix)
            backlog[worker.id] = max(0, round(worker.ready + since - decided))
        return backlog

    def _stalled(self, live: Sequence[WorkerInfo]) -> set[str]:
        """Live workers that were sent work ``stall_seconds`` ago and have not read or decided anything since
        (their heartbeat's progress counter stood still): a loop of theirs is stuck."""
        now = self._clock()
        stalled: set[str] = set()
        for worker in live:
            seen = (worker.started_unix, worker.progress)
            if self._progress.get(worker.id) != seen:
                self._progress[worker.id] = seen
                self._sent_since.pop(worker.id, None)
                continue
            since = self._sent_since.get(worker.id)
            if since is not None and now - since >= self.settings.stall_seconds:
                stalled.add(worker.id)
        return stalled

    async def dispatch_pending(self, *, fresh_only: bool = False) -> int:
        """Send the pending pods that need a worker (only those new since the last call, with ``fresh_only``)."""
        await self._resend_changed()
        candidates = list(self._fresh) if fresh_only else list(self.pending)
        self._fresh.clear()
        now = self._clock()
        pods = [self.pending[uid] for uid in candidates if self._needs_worker(uid, now)]
        return await self._send(sorted(pods, key=dispatch_order))

    async def _resend_changed(self) -> None:
        """Queue the new version of every dispatched pod that changed, behind the old one on the same worker
        (the old one then reserves nothing: the ledger calls it stale). Gang members are left to their item:
        their bindings carry the uid, and the gang is re-sent whole if it fails."""
        changed, self._changed = self._changed, {}
        for uid in changed:
            pod, worker = self.pending.get(uid), self.dispatched.get(uid)
            if pod is None or worker is None or self._gang(pod) is not None:
                continue
            item = self._with_hints(single_item(pod, attempt=self._attempts.get(uid, 0)))
            if await self.queue.resend_changed(worker, item):
                log.info("pod %s changed while queued on worker %s: its new version follows", pod.key, worker)

    def _needs_worker(self, uid: str, now: float) -> bool:
        if uid not in self.pending or uid in self.dispatched or self.pending[uid].gated:
            return False
        handed_back = self._handed_back.get(uid)
        if handed_back is None:
            return True
        when, count = handed_back
        return now - when >= handback_delay(count, lag_seconds=self.settings.informer_lag_seconds)

    async def _send(self, pods: Sequence[PendingPod]) -> int:
        pods = [pod for pod in pods if not self._waits_for_jobs(pod)]
        if not pods:
            return 0
        singles, gang_items = self._plan_gangs(pods)
        by_uid = {pod.uid: pod for pod in pods}
        for pod in singles:
            by_uid.setdefault(pod.uid, pod)  # members of a started gang that were not in this batch
        for item in gang_items:
            for member in item.members:
                by_uid.setdefault(member.uid, self.pending[member.uid])
        loads = worker_loads(self.workers, self.dispatched)
        backlog = self.backlog()
        sent = 0
        batch: list[tuple[str, WorkItem]] = []

        def choose(policy: str) -> WorkerInfo | None:
            return choose_worker(self.workers, policy, loads=loads, rng=self._rng,
                                 pack_depth=self.settings.pack_depth, backlog=backlog)

        for item in [*map(self._with_hints, plan_work_items(singles, attempts=self._attempts)), *gang_items]:
            uids = item_uids(item)
            worker = choose(item.policy)
            if ((worker is None or any(count > loads.get(worker.id, 0) for count in loads.values()))
                    and await self._look_again()):
                backlog = self.backlog()
                for worker_id, assigned in batch:  # chosen in this burst, not sent yet
                    backlog[worker_id] = backlog.get(worker_id, 0) + len(item_uids(assigned))
                worker = choose(item.policy)
            if worker is None:
                for uid in uids:
                    self._wait(by_uid[uid])
                continue
            batch.append((worker.id, item))
            loads[worker.id] = loads.get(worker.id, 0) + len(uids)
            backlog[worker.id] = backlog.get(worker.id, 0) + len(uids)
        if not self._is_leader():
            log.info("no longer leader: stopped dispatching")
            return 0
        # One transaction per burst, in chunks so that a huge backlog does not make one giant reply.
        for start in range(0, len(batch), 500):
            await self.queue.enqueue_many(batch[start:start + 500])
        now, wall = self._clock(), self._wall()
        for worker_id, item in batch:
            self._sends.setdefault(worker_id, collections.deque()).append((wall, len(item_uids(item))))
            self._sent_since.setdefault(worker_id, now)
            uids = item_uids(item)
            for uid in uids:
                self.dispatched[uid] = worker_id
                self.waiting.pop(uid, None)
                self.metrics.dispatch_latency.observe(max(now - by_uid[uid].seen_at, 0.0))
            self.rate.dispatched(len(uids))
            self.metrics.dispatched.labels(item.policy).inc(len(uids))
            log.debug("dispatched %s (policy %s, attempt %d) to worker %s", item.key, item.policy, item.attempt,
                      worker_id)
            sent += len(uids)
        return sent

    def _waits_for_jobs(self, pod: PendingPod) -> bool:
        """True (and the pod told why, or failed) when its ``hoss.io/depends-on`` Jobs and PodGroups do not allow
        it yet (dispatcher/dependencies.py)."""
        annotation = pod.annotations.get(dependencies.ANNOTATION)
        if annotation is None:
            return False
        own = next((str(r.get("name")) for r in pod.owner_references if r.get("kind") == "Job"), None)
        blocked = dependencies.verdict(annotation, own_job=own, jobs=self.jobs.get(pod.namespace, {}),
                                       podgroups=self.podgroup_states.get(pod.namespace, {}))
        if blocked is None:
            return False
        reason, message = blocked
        if reason == dependencies.FAILED:
            if self.settings.failed_dependency == "fail" and self.notifier is not None:
                self._fail(pod, reason, f"{message}; the pod is failed (its Job counts the failure)")
                return True
            message += "; the pod waits (re-create the dependency to retry)"
        self._wait(pod, reason=reason, message=message)
        return True

    def _fail(self, pod: PendingPod, reason: str, message: str) -> None:
        """Set the pod Failed in the background, once; the pod watch then drops it (a terminal phase)."""
        if pod.uid in self._failing or self.notifier is None:
            return
        self.waiting.pop(pod.uid, None)
        log.info("pod %s fails: %s", pod.key, message)
        notifier = self.notifier

        async def fail() -> None:
            written = False
            try:
                written = await notifier.failed(pod, reason=reason, message=message)
            finally:
                if not written:  # looked at again next round; once written, kept until the pod watch drops it
                    self._failing.pop(pod.uid, None)
        self._failing[pod.uid] = asyncio.get_running_loop().create_task(fail(), name=f"fail-{pod.uid}")

    def on_job(self, namespace: str, name: str, state: dependencies.JobState | None, *, kind: str = "job") -> None:
        """A Job (or, ``kind="podgroup"``, a PodGroup) changed (None: deleted): the pending pods of its namespace
        that depend on Jobs or PodGroups are looked at again at once."""
        known = self.podgroup_states if kind == "podgroup" else self.jobs
        states = known.setdefault(namespace, {})
        if state is None:
            states.pop(name, None)
        else:
            states[name] = state
        for uid, pod in self.pending.items():
            if pod.namespace == namespace and dependencies.ANNOTATION in pod.annotations \
                    and uid not in self.dispatched:
                self._fresh[uid] = None
                self._wakeup.set()

    def on_reservation_gone(self, uid: str) -> None:
        """A Reservation left Pending (placed, used, failed) or was deleted: it is no longer placed as a pod."""
        if uid in self.pending:
            self._drop(uid, deleted=False)

    def _with_hints(self, item: WorkItem) -> WorkItem:
        """The item, its compact pod carrying the Available Reservations that own the pod (`reservations.HINTS`):
        the worker prefers their nodes and takes their room. Not for gangs yet."""
        pod = self.pending.get(item.uid)
        if pod is None or not any(r.available for r in self.reservations.values()) or item.uid in self.reservations:
            return item
        metadata = {"uid": pod.uid, "namespace": pod.namespace, "name": pod.name, "labels": dict(pod.labels),
                    "ownerReferences": list(pod.owner_references)}
        owning = [r for r in self.reservations.values() if r.available and reservations.owns(r, {"metadata": metadata})]
        if not owning:
            return item
        form = orjson.loads(item.pod)
        form[reservations.HINTS] = reservations.hints(owning)
        encoded = compact.encode(form)
        # A version of its own: sent again when a Reservation becomes Available, it makes the worker's older copy
        # stale, as a changed pod does.
        return dataclasses.replace(item, pod=encoded.decode(), digest=compact.digest(encoded))

    def on_reservation_available(self, reservation: Reservation) -> None:
        """A Reservation became Available: its owners already sent to a worker (which may be backing off with
        nothing else fitting) are sent again with it, behind their old version (`_resend_changed`)."""
        for uid, pod in self.pending.items():
            if uid in self.dispatched and uid not in self.reservations and self._gang(pod) is None:
                metadata = {"uid": pod.uid, "namespace": pod.namespace, "name": pod.name, "labels": dict(pod.labels),
                            "ownerReferences": list(pod.owner_references)}
                if reservations.owns(reservation, {"metadata": metadata}):
                    self._changed[uid] = None
                    self._wakeup.set()

    def wake(self) -> None:
        """Something changed that may let waiting pods go (e.g. a PodGroup appeared)."""
        self._wakeup.set()

    def _gang(self, pod: PendingPod) -> GangKey | None:
        return gang_of(pod.namespace, pod.labels, pod.annotations)

    def _gang_changed(self, pod: PendingPod) -> None:
        """A member of a gang appeared or left the pending set: count the gang's members again."""
        if not (pod.labels or pod.annotations):
            return
        key = self._gang(pod)
        if key is None:
            return
        self.gangs_dirty[key] = self._clock()
        self._gang_quiet.pop(key, None)
        selector = member_selector(pod.labels, pod.annotations)
        if selector is not None:
            self._gang_selectors[key] = selector

    def _bound_members(self, key: GangKey) -> int | None:
        """Members of the gang bound, when counted since the gang last changed (else None: not known yet)."""
        counted = self.gang_counts.get(key)
        if counted is None or counted[0] < self.gangs_dirty.get(key, 0.0):
            return None
        return counted[1].bound

    async def refresh_gangs(
        self, list_members: Callable[[str, str], Awaitable[list[Json]]],
        write_status: Callable[[GangKey, Json], Awaitable[None]] | None = None,
    ) -> None:
        """Count the members of every gang that changed (bound, running), write its PodGroup's status (phase
        Pending/Scheduled/Running, scheduled, running) when that changed, and wake the rounds when a count did. A
        gang is counted until it has no pending member and its counts stood still for a few rounds."""
        pending_gangs = {key for pod in self.pending.values() if (key := self._gang(pod)) is not None}
        for key in sorted(self.gangs_dirty):
            selector = self._gang_selectors.get(key)
            if selector is None:
                self.gangs_dirty.pop(key, None)
                continue
            counted_at = self._clock()
            try:
                counts = count_members(await list_members(key.namespace, selector))
            except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
                log.warning("cannot count the members of gang %s: %s", key, error)
                continue
            previous = self.gang_counts.get(key)
            self.gang_counts[key] = (counted_at, counts)
            changed = previous is None or previous[1] != counts
            if changed:
                self.wake()
            group = self.podgroups.get(key)
            if group is not None and write_status is not None:
                status: Json = {"phase": podgroup_phase(group.min_member, counts), "scheduled": counts.bound,
                                "running": counts.running}
                if self._podgroup_status.get(key) != status:
                    try:
                        await write_status(key, status)
                    except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
                        log.warning("cannot write the status of PodGroup %s: %s", key, error)
                    else:
                        self._podgroup_status[key] = status
            quiet = 0 if changed else self._gang_quiet.get(key, 0) + 1
            self._gang_quiet[key] = quiet
            if key not in pending_gangs and quiet >= GANG_QUIET_ROUNDS:
                self.forget_gang(key)

    def forget_gang(self, key: GangKey) -> None:
        """Drop what we keep about a gang that settled (a new member counts it again, within a refresh)."""
        for table in (self.gangs_dirty, self._gang_quiet, self.gang_counts, self._gang_selectors,
                      self._podgroup_status):
            table.pop(key, None)

    def prune_gangs(self, *, older_than: float) -> None:
        """As follower, forget gangs that changed long ago and have no pending member (the leader counts them)."""
        pending_gangs = {key for pod in self.pending.values() if (key := self._gang(pod)) is not None}
        now = self._clock()
        for key, since in list(self.gangs_dirty.items()):
            if key not in pending_gangs and now - since >= older_than:
                self.forget_gang(key)

    def _plan_gangs(self, pods: Sequence[PendingPod]) -> tuple[list[PendingPod], list[WorkItem]]:
        """Pods outside gangs, and one item per gang that has min-available members pending; the members of a
        gang that is not complete wait, with the reason on each of them."""
        singles = [pod for pod in pods if self._gang(pod) is None]
        keys = sorted({key for pod in pods if (key := self._gang(pod)) is not None})
        items: list[WorkItem] = []
        for key in keys:
            members = sorted(
                (p for p in self.pending.values()
                 if self._gang(p) == key and p.uid not in self.dispatched and not p.gated),  # gated: not yet
                key=lambda p: p.name,
            )
            bound = self._bound_members(key)
            state = gang_state(key, [m.labels for m in members], podgroups=self.podgroups, bound=bound or 0)
            if bound is not None and state.started:
                # The gang has started: extra and replacement members go out one by one, on the gang's policy.
                self._gang_since.pop(key, None)
                singles += members
                continue
            if not state.ready:
                if bound is None:
                    self.gangs_dirty.setdefault(key, self._clock())  # count its bound members; that wakes us
                since = self._gang_since.setdefault(key, self._clock())
                reason, message = GANG_WAITING_REASON, state.waiting_message()
                group = self.podgroups.get(key)
                if group is not None and group.timeout_seconds is not None:
                    waited = self._clock() - since
                    if waited >= group.timeout_seconds:
                        reason = GANG_TIMEOUT_REASON
                        message = (f"gang {key} timed out: waited {waited:.0f}s (scheduleTimeoutSeconds "
                                   f"{group.timeout_seconds:.0f}); {message}")
                for member in members:
                    self._wait(member, reason=reason, message=message)
                continue
            self._gang_since.pop(key, None)
            first = members[0]
            items.append(WorkItem(
                uid=first.uid, namespace=first.namespace, name=first.name, policy=first.policy, gang=str(key),
                members=tuple(GangMember(uid=m.uid, namespace=m.namespace, name=m.name, pod=m.compact,
                                         digest=m.digest) for m in members),
                min_available=state.still_needed, attempt=self._attempts.get(first.uid, 0),
            ))
        return singles, items

    def _wait(self, pod: PendingPod, *, reason: str = NO_WORKER_REASON, message: str = "") -> None:
        waiting = self.waiting.get(pod.uid)
        if waiting is None:
            self.waiting[pod.uid] = Waiting(pod=pod.key, policy=pod.policy, since_unix=self._wall(), reason=reason,
                                            message=message)
            log.info("%s %s waits: %s", waits_for(pod), pod.key,
                     message or no_worker_message(pod.policy, what=waits_for(pod)))
        else:
            if (waiting.reason, waiting.message) != (reason, message):
                waiting.notified_at = None  # the reason changed: say so at once
            waiting.policy, waiting.reason, waiting.message = pod.policy, reason, message

    async def drain_notices(self) -> None:
        """Wait for the NoWorkerForPolicy notices started by the last round."""
        if self._notices is not None:
            await asyncio.gather(self._notices, return_exceptions=True)

    def _notify_waiting(self) -> None:
        """Start the notices that are due, in the background: a slow apiserver must not hold up dispatching."""
        if self.notifier is None or (self._notices is not None and not self._notices.done()):
            return
        now = self._clock()
        interval = self.settings.no_worker_event_interval_seconds
        due = [
            (self.pending[uid], waiting)
            for uid, waiting in self.waiting.items()
            if uid in self.pending
            and (waiting.notified_at is None or now - waiting.notified_at >= interval)
        ]
        if not due:
            return
        pods = []
        for pod, waiting in due:
            waiting.notified_at = now
            pods.append(pod)
        self._notices = asyncio.create_task(self._send_notices(self.notifier, pods), name="no-worker-notices")

    async def _send_notices(self, notifier: Notifier, pods: Sequence[PendingPod]) -> None:
        notes = [self.waiting.get(pod.uid) for pod in pods]
        await asyncio.gather(*(
            notifier.waiting(pod, reason=note.reason if note else NO_WORKER_REASON,
                             message=(note.message if note and note.message
                                      else no_worker_message(pod.policy, what=waits_for(pod))))
            for pod, note in zip(pods, notes, strict=True)
        ))
        self.metrics.no_worker_events.inc(len(pods))

    async def _flush_gone(self) -> None:
        if not self._gone:
            return
        uids = sorted(self._gone)
        await self.queue.mark_gone(uids)
        self._gone.difference_update(uids)
        for uid in uids:
            self.dispatched.pop(uid, None)

    async def _sync_dispatched(self, *, leader: bool) -> None:
        """Replace the in-memory map with Redis's; as leader, also forget entries that name no live worker and
        entries whose pod has not been pending for ``informer_lag_seconds``."""
        current = await self.queue.dispatched()
        now = self._clock()
        for uid in self.dispatched:
            if uid not in current and uid in self.pending:
                # Acknowledged by its worker while still pending: bound just now (our watch lags) or handed back.
                _when, count = self._handed_back.get(uid, (now, 0))
                self._handed_back[uid] = (now, count + 1)
                self._attempts[uid] = self._attempts.get(uid, 0) + 1
        if leader:
            live = {worker.id for worker in self.workers}
            lag = self.settings.informer_lag_seconds
            # Pods a worker bound stay in the map until our watch sees them bound (it may lag under load): never
            # sent again meanwhile. One still pending long after that is forgotten, and so sent again (the ledger
            # then answers that it is bound, if it is).
            placed = {uid for uid, owner in current.items() if owner.startswith(BOUND_PREFIX)}
            self._placed_since = {uid: self._placed_since.get(uid, now) for uid in placed if uid in self.pending}
            overdue = [uid for uid, since in self._placed_since.items()
                       if now - since >= PLACED_PATIENCE * lag]
            forget = [uid for uid, owner in current.items() if owner not in live and uid not in placed] + overdue
            absent = [uid for uid in current
                      if uid not in self.pending and (current[uid] in live or uid in placed)]
            self._absent_since = {uid: self._absent_since.get(uid, now) for uid in absent}
            stale = [uid for uid, since in self._absent_since.items() if now - since >= lag]
            forget += stale
            if forget:
                await self.queue.forget(forget)
                log.info("forgot %d dispatched entries (%d naming no live worker, %d not pending for %.0fs)",
                         len(forget), len(forget) - len(stale), len(stale), lag)
                for uid in forget:
                    current.pop(uid, None)
                    self._absent_since.pop(uid, None)
        self.dispatched = Assignments(current)

    # -- follower -----------------------------------------------------------------------------------------

    async def follow(self) -> None:
        """Keep the view of workers and the dispatched map current without writing anything, until cancelled."""
        while True:
            await self._guarded(self.observe())
            await asyncio.sleep(self.settings.reclaim_interval_seconds)

    async def observe(self) -> None:
        live, _dead = await self.queue.workers()
        self.workers = live
        await self._sync_dispatched(leader=False)
        # The leader does these from its own watch; a replica that takes over starts with a full round.
        self._fresh.clear()
        self._gone.clear()
        self.waiting.clear()

    async def _guarded(self, step: Awaitable[object]) -> bool:
        """Run one step; a Redis failure pauses (logged once per outage) instead of stopping the dispatcher."""
        try:
            await step
        except (LedgerUnavailable, RedisError) as error:
            if self.redis_error is None:
                log.warning("Redis unreachable; dispatching paused until it answers: %s", error)
            self.redis_error = str(error) or type(error).__name__
            self.metrics.redis_errors.inc()
            return False
        if self.redis_error is not None:
            log.info("Redis answers again; dispatching resumed")
            self.redis_error = None
        return True


async def cancel_and_wait(*tasks: asyncio.Task[Any], retry_seconds: float = 0.1) -> None:
    """Cancel `tasks` and wait until each has ended, cancelling again while one runs on.

    Cancelling once is not enough: redis-py's asyncio client can swallow a cancellation that arrives while it
    sets up a connection, and the task then carries on (e.g. a deposed leader's round).
    """
    running = {task for task in tasks if not task.done()}
    while running:
        for task in running:
            task.cancel()
        _ended, running = await asyncio.wait(running, timeout=retry_seconds)
    await asyncio.gather(*tasks, return_exceptions=True)  # collect outcomes so none is reported as never retrieved


async def run_roles(dispatcher: Dispatcher, elector: LeaderElector) -> None:
    """Run `Dispatcher.lead` while this replica leads and `Dispatcher.follow` otherwise, switching at once."""
    while True:
        leading = elector.is_leader
        role = asyncio.create_task(dispatcher.lead() if leading else dispatcher.follow(),
                                   name="lead" if leading else "follow")
        change = asyncio.create_task((elector.following if leading else elector.leading).wait())
        try:
            done, _pending = await asyncio.wait({role, change}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(role, change)
        if role in done:
            role.result()  # a role only ends by crashing: let the service see it
