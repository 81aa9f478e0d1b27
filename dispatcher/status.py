"""The system status the dispatcher serves on /status (and its schema on /status/schema), and its Prometheus metrics.

The /status document is a pydantic model (`SystemStatus`, schema version in its ``version`` field) built by pure
functions from plain inputs (workers, the dispatched map, the ledger snapshot, the resolvers' stats hashes, the
pending pods); the service gathers those inputs and serves the result. A missing input (Redis unreachable) leaves
its section empty and says why in ``redis``; /status never fails because a dependency did.

Compatibility: within one ``version`` fields are only ever added, each with a default, so a reader must ignore
fields it does not know (these models do) and a newer reader still accepts an older document. Version 1 gained
``nodes``, ``gpu``, ``pools``, ``pending``, ``gangs`` and ``throughput.history`` for the operator dashboard.

Resolver instances publish their counters to Redis hashes ``{hoss}:resolver:<instance>`` (fields ``verdicts``:
JSON object reason -> count, ``recent_denials``: JSON list of denials, ``review_p50_ms`` and ``review_p99_ms``:
their review latency, ``updated_unix``), which expire when the resolver stops; the dispatcher sums them.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from dispatcher.gangs import GangKey, PodGroupSpec, gang_of, gang_state
from hoss.ledger.client import LedgerSnapshot, NodeSnapshot, QuotaReport
from hoss.model.resources import gpu_spread
from hoss.queue import PREFIX, WorkerInfo

log = logging.getLogger(__name__)

STATUS_VERSION: Literal[1] = 1
RESOLVER_STATS_MATCH = f"{PREFIX}:resolver:*"
"""SCAN pattern of the resolvers' stats hashes."""
RECENT_DENIALS = 20
"""How many of the newest denials /status shows."""
RATE_WINDOW_SECONDS = 60.0
HISTORY_SECONDS = 600.0
"""How far back ``throughput.history`` reaches."""
HISTORY_INTERVAL_SECONDS = 5.0
"""Width of one ``throughput.history`` sample."""
PENDING_SHOWN = 200
"""How many pending pods (the oldest) and gangs /status lists; the totals count all of them."""
GPU_RESOURCE = "nvidia.com/gpu"
POOL_LABEL = "hoss.io/pool"
WAITING_FOR_WORKER = "waiting for a worker"


class _Model(BaseModel):
    # Readers ignore fields they do not know: within one version, fields are only ever added.
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)


class WorkerStatus(_Model):
    id: str
    """The worker's id (its --id)."""
    policies: list[str]
    """Policy profiles the worker serves."""
    alive: bool
    """False: registered but its heartbeat expired; its work is moved on the leader's next reclaim."""
    routed: bool | None = None
    """True: on the leader's routing list, so new pods go to it. An alive worker is off the list when it stalled,
    reports an unhealthy loop, or started after the list was last read (new pods make the leader read it again).
    None on a dispatcher that is not the leader (it routes nothing)."""
    queue_depth: int
    """Items the worker holds and has not started, from its heartbeat."""
    in_flight: int
    """Pods the worker is scheduling or binding, from its heartbeat."""
    outstanding: int
    """Pod uids the dispatched map assigns to this worker (sent, not yet acknowledged)."""
    heartbeat_age_seconds: float | None
    """Seconds since its last heartbeat; None when the heartbeat is gone."""
    counters: dict[str, int]
    """The worker's own counters from its heartbeat (e.g. bound, conflicts)."""


class WaitingPod(_Model):
    pod: str
    """namespace/name"""
    policy: str
    """The pod's policy profile (label hoss.io/policy, else the default)."""
    since: float
    """Unix time at which the pod started waiting for a worker that serves its policy."""


class QueueStatus(_Model):
    pending_total: int
    """Unbound hoss pods the dispatcher's watch sees."""
    undispatched: int
    """Pending pods no worker has been sent (waiting for a worker, or about to be sent)."""
    waiting_for_worker: list[WaitingPod]
    """Pending pods whose policy no live worker serves, oldest first."""


class ThroughputSample(_Model):
    at: float
    """Unix time at which the sample's interval ends."""
    bound_per_second: float
    """Pods this replica saw bound during the interval, per second."""


class ThroughputStatus(_Model):
    bound_per_second_1m: float
    """Dispatched pods that left the pending set bound to a node, per second over the last minute."""
    dispatched_total: int
    """Pods this replica sent to workers since it started."""
    bound_total: int
    """Dispatched pods this replica saw bound since it started."""
    history_interval_seconds: float = HISTORY_INTERVAL_SECONDS
    """Width of one sample of ``history``."""
    history: list[ThroughputSample] = Field(default_factory=list)
    """Bound pods per second in consecutive intervals over the last ten minutes (since this replica started, if
    later), oldest first; the interval still running is left out."""


class ResourceTotal(_Model):
    alloc: int
    """Sum of allocatable over the nodes counted, in base units (milli-CPU, bytes, counts)."""
    used: int
    """Sum of requested (bound + assumed) over the nodes counted, in base units."""


class LedgerStatus(_Model):
    ready: bool
    """The ledger has been rebuilt from the apiserver and is kept in sync; until then bindings are denied."""
    epoch: str | None
    """Id of the last rebuild of the ledger."""
    nodes: int
    """Nodes in the ledger."""
    assumed: int
    """Reservations not yet bound, over all nodes."""
    bound: int
    """Bound entries, over all nodes."""
    resources: dict[str, ResourceTotal]
    """Per resource, over all nodes."""


class NodeStatus(_Model):
    name: str
    pool: str | None
    """The node's hoss.io/pool label; None when it has none."""
    alloc: dict[str, int]
    """Allocatable per resource, in base units (milli-CPU, bytes, counts)."""
    used: dict[str, int]
    """Requested (bound + assumed) per resource, in base units."""
    assumed: int
    """Reservations on the node not yet bound."""
    bound: int
    """Bound pod entries on the node."""


class GpuStatus(_Model):
    """GPU fragmentation at a glance, over the nodes with allocatable GPUs."""

    resource: str = GPU_RESOURCE
    """The extended resource counted."""
    gpu_nodes: int
    """Nodes with allocatable GPUs."""
    fully_free_nodes: int
    """GPU nodes with no GPU in use."""
    partly_used_nodes: int
    """GPU nodes with some but not all GPUs in use."""
    full_nodes: int
    """GPU nodes with every GPU in use."""
    gpus: int
    """Allocatable GPUs over all nodes."""
    used_gpus: int
    """GPUs requested (bound + assumed) over all nodes."""
    stranded_gpus: int
    """Free GPUs on partly used nodes: they cannot take a pod that needs a whole node."""


class PoolStatus(_Model):
    name: str | None
    """The pool (hoss.io/pool label value); None for the nodes without the label."""
    nodes: int
    """Nodes in the pool."""
    resources: dict[str, ResourceTotal]
    """Per resource, over the pool's nodes."""


class QuotaStatus(_Model):
    """A namespace's elastic quota (scheduler-plugins ElasticQuota) and its use, from the ledger."""

    namespace: str
    min: dict[str, int]
    """spec.min in base units (milli-CPU, bytes, counts): guaranteed to the namespace."""
    max: dict[str, int]
    """spec.max in base units; a resource missing is not limited."""
    used: dict[str, int]
    """What the namespace's pods hold in the ledger (reserved, admitted and bound), in base units."""
    borrowed: dict[str, int]
    """used above min, per resource the quota names: what the namespace borrows of others' idle guarantee."""


class PendingPodStatus(_Model):
    pod: str
    """namespace/name"""
    policy: str
    """The pod's policy profile."""
    since: float
    """Unix time since which the pod waits (its creation; when the dispatcher first saw it, if unknown)."""
    gang: str | None
    """namespace/name of the pod's gang (pod group), if it belongs to one."""
    worker: str | None
    """The worker the pod is dispatched to (sent, not yet acknowledged); None when no worker holds it."""
    reason: str
    """Why the pod waits, in one word: the reason of its PodScheduled=False condition (e.g. Unschedulable,
    NoWorkerForPolicy), else Dispatched or WaitingForWorker."""
    message: str
    """Why the pod waits, for people: the message of its PodScheduled=False condition, else
    "dispatched to <worker>" or "waiting for a worker"."""


class PendingStatus(_Model):
    total: int = 0
    """Unbound hoss pods the dispatcher's watch sees."""
    pods: list[PendingPodStatus] = Field(default_factory=list)
    """The oldest pending pods (at most 200), oldest first."""


class GangStatus(_Model):
    gang: str
    """namespace/name of the pod group."""
    pending: int
    """Members pending."""
    dispatched: int
    """Pending members sent to a worker."""
    min_available: int | None
    """Members the gang needs before any is scheduled (its PodGroup's minMember, else the min-available label);
    None while a PodGroup the gang names has not been seen."""


class Denial(_Model):
    at: float
    """Unix time of the verdict."""
    pod: str
    """namespace/name of the pod whose binding was denied."""
    node: str
    """The node the binding named."""
    username: str
    """Who posted the binding."""
    reason: str
    """The verdict's reason (e.g. conflict, held-elsewhere, ledger-not-ready)."""
    message: str
    """The message the binding's author got."""


class ResolverInstance(_Model):
    instance: str
    """The resolver replica's name."""
    updated_unix: float | None
    """Unix time of its last published stats."""
    review_p50_ms: float | None = None
    """Median time this replica took to judge a binding, over its last 2048 reviews (None: none yet)."""
    review_p99_ms: float | None = None
    """99th percentile of the time this replica took to judge a binding, over its last 2048 reviews."""


class ResolverStatus(_Model):
    instances: list[ResolverInstance]
    verdicts: dict[str, int]
    """Verdict counts by reason, summed over the resolver instances."""
    recent_denials: list[Denial]
    """Newest first, at most 20, over all instances."""


class SystemStatus(_Model):
    """The whole system as the dispatcher sees it: GET /status (schema: GET /status/schema)."""

    version: Literal[1] = STATUS_VERSION
    """Schema version; bumped on any incompatible change (fields are only added within a version)."""
    leader: bool
    """This replica holds the Lease and dispatches; a follower serves /status but does not dispatch."""
    identity: str
    """This replica's identity in the Lease."""
    generated_unix: float | None = None
    """Unix time at which this document was built (ages in it are relative to this, not the reader's clock)."""
    leader_identity: str | None
    """The Lease holder as this replica last saw it ("" when released, None when unknown)."""
    redis: str
    """"ok", or "unreachable: <error>" (then workers, ledger and resolver are empty or null)."""
    workers: list[WorkerStatus]
    """Live and dead-but-registered workers, by id."""
    queues: QueueStatus
    throughput: ThroughputStatus
    conflicts: int
    """Ledger conflicts the live workers report (sum of their "conflicts" counters)."""
    ledger: LedgerStatus | None
    """Ledger totals; None when Redis is unreachable."""
    resolver: ResolverStatus | None
    """The resolvers' verdicts; None when Redis is unreachable."""
    nodes: list[NodeStatus] = Field(default_factory=list)
    """Every node in the ledger, by name; empty when Redis is unreachable."""
    gpu: GpuStatus | None = None
    """GPU fragmentation from the ledger; None when Redis is unreachable."""
    pools: list[PoolStatus] = Field(default_factory=list)
    """Node pools by name (nodes without a pool last); empty when Redis is unreachable."""
    pending: PendingStatus = Field(default_factory=PendingStatus)
    """Pending pods and why each waits."""
    gangs: list[GangStatus] = Field(default_factory=list)
    """Gangs among the pending pods, by name (at most 200)."""
    rescheduler: dict[str, Any] | None = None
    """What the hoss-rescheduler leader last published (``{hoss}:resched:status``): ``plans`` (newest first: reason,
    pending pod and its node, ``moves`` with pod, gpus, from, to, fragmentation ``before`` and ``after``,
    ``outcome`` and ``detail``), ``rounds``, ``evictions``, ``fragmentation``, ``published`` (unix); None when no
    rescheduler runs."""
    quotas: list[QuotaStatus] = Field(default_factory=list)
    """Elastic quotas by namespace, with use and borrowing; empty when there are none or Redis is unreachable."""


class BoundRate:
    """Counts dispatched and bound pods, the bound rate over a sliding minute, and its recent history.

    Times are monotonic (the dispatcher's clock); `view` converts the history to unix time. The history is a ring
    of per-interval counts (intervals aligned on the clock, only those with binds stored), so it costs nothing
    between binds and needs no sampling task.
    """

    def __init__(
        self,
        *,
        window_seconds: float = RATE_WINDOW_SECONDS,
        history_seconds: float = HISTORY_SECONDS,
        interval_seconds: float = HISTORY_INTERVAL_SECONDS,
    ) -> None:
        self.window_seconds = window_seconds
        self.interval_seconds = interval_seconds
        self.dispatched_total = 0
        self.bound_total = 0
        self._bound_at: collections.deque[float] = collections.deque()
        self._intervals = max(1, round(history_seconds / interval_seconds))
        # [interval index, pods bound in it], oldest first; one more than shown, for the interval still running.
        self._counts: collections.deque[list[int]] = collections.deque(maxlen=self._intervals + 1)
        self._first_interval: int | None = None

    def dispatched(self, count: int = 1) -> None:
        self.dispatched_total += count

    def bound(self, now: float) -> None:
        self.bound_total += 1
        self._bound_at.append(now)
        self._prune(now)
        index = self._interval(now)
        if self._counts and self._counts[-1][0] == index:
            self._counts[-1][1] += 1
        else:
            self._counts.append([index, 1])

    def per_second(self, now: float) -> float:
        self._prune(now)
        return len(self._bound_at) / self.window_seconds

    def history(self, now: float, *, now_unix: float) -> list[ThroughputSample]:
        """Bound per second in every finished interval of the history window since the first call or bind."""
        current = self._interval(now)
        started = current if self._first_interval is None else self._first_interval
        first = max(current - self._intervals, started)
        counts = {index: count for index, count in self._counts}
        return [
            ThroughputSample(
                at=round(now_unix - (now - (index + 1) * self.interval_seconds), 3),
                bound_per_second=round(counts.get(index, 0) / self.interval_seconds, 3),
            )
            for index in range(first, current)
        ]

    def view(self, now: float, *, now_unix: float | None = None) -> ThroughputStatus:
        """The counters and rates at monotonic time `now` (``now_unix``, the wall clock then, defaults to it)."""
        return ThroughputStatus(
            bound_per_second_1m=round(self.per_second(now), 3),
            dispatched_total=self.dispatched_total,
            bound_total=self.bound_total,
            history_interval_seconds=self.interval_seconds,
            history=self.history(now, now_unix=time.time() if now_unix is None else now_unix),
        )

    def _interval(self, now: float) -> int:
        index = int(now // self.interval_seconds)
        if self._first_interval is None or index < self._first_interval:
            self._first_interval = index
        return index

    def _prune(self, now: float) -> None:
        while self._bound_at and self._bound_at[0] <= now - self.window_seconds:
            self._bound_at.popleft()


def worker_statuses(
    live: Sequence[WorkerInfo], dead: Collection[str], *, dispatched: Mapping[str, str], now_unix: float,
    routed: Collection[str] | None = None,
) -> list[WorkerStatus]:
    """Live workers and registered-but-dead ones, by id, with what the dispatched map assigns each; ``routed``:
    the ids on the leader's routing list (None when this dispatcher is not the leader)."""
    outstanding = collections.Counter(dispatched.values())
    rows = [
        WorkerStatus(
            id=w.id, policies=list(w.policies), alive=True, routed=None if routed is None else w.id in routed,
            queue_depth=w.queue_depth, in_flight=w.in_flight,
            outstanding=outstanding[w.id], heartbeat_age_seconds=round(max(now_unix - w.heartbeat_unix, 0.0), 3),
            counters=dict(w.counters),
        )
        for w in live
    ]
    rows += [
        WorkerStatus(
            id=worker_id, policies=[], alive=False, routed=None if routed is None else False, queue_depth=0,
            in_flight=0, outstanding=outstanding[worker_id], heartbeat_age_seconds=None, counters={},
        )
        for worker_id in dead
    ]
    return sorted(rows, key=lambda row: row.id)


def sum_resources(nodes: Iterable[NodeSnapshot]) -> dict[str, ResourceTotal]:
    """Allocatable and used per resource over `nodes`, by resource name."""
    totals: dict[str, ResourceTotal] = {}
    for node in nodes:
        for resource in {*node.alloc, *node.used}:
            total = totals.setdefault(resource, ResourceTotal(alloc=0, used=0))
            total.alloc += node.alloc.get(resource, 0)
            total.used += node.used.get(resource, 0)
    return dict(sorted(totals.items()))


def summarize_ledger(snapshot: LedgerSnapshot) -> LedgerStatus:
    return LedgerStatus(
        ready=snapshot.ready,
        epoch=snapshot.epoch,
        nodes=len(snapshot.nodes),
        assumed=sum(node.assumed for node in snapshot.nodes.values()),
        bound=sum(node.bound for node in snapshot.nodes.values()),
        resources=sum_resources(snapshot.nodes.values()),
    )


def pool_of(node: NodeSnapshot) -> str | None:
    """The node's pool: its hoss.io/pool label; None when absent or empty."""
    return node.labels.get(POOL_LABEL) or None


def node_statuses(snapshot: LedgerSnapshot) -> list[NodeStatus]:
    """Every node of the snapshot, by name."""
    return [
        NodeStatus(
            name=name, pool=pool_of(node), alloc=dict(sorted(node.alloc.items())),
            used=dict(sorted(node.used.items())), assumed=node.assumed, bound=node.bound,
        )
        for name, node in sorted(snapshot.nodes.items())
    ]


def gpu_fragmentation(snapshot: LedgerSnapshot, *, resource: str = GPU_RESOURCE) -> GpuStatus:
    """How the GPUs are spread: nodes fully free, partly used and full, and the GPUs stranded on partly used
    nodes. A node counts as a GPU node when it has allocatable `resource`; one overcommitted counts as full."""
    spread = gpu_spread(
        (node.alloc.get(resource, 0), node.used.get(resource, 0)) for node in snapshot.nodes.values()
    )
    return GpuStatus(resource=resource, **dataclasses.asdict(spread))


def pool_statuses(snapshot: LedgerSnapshot) -> list[PoolStatus]:
    """Per pool (hoss.io/pool label) its node count and resource totals; named pools by name, then no pool."""
    members: dict[str | None, list[NodeSnapshot]] = collections.defaultdict(list)
    for node in snapshot.nodes.values():
        members[pool_of(node)].append(node)
    return [
        PoolStatus(name=pool, nodes=len(nodes), resources=sum_resources(nodes))
        for pool, nodes in sorted(members.items(), key=lambda item: (item[0] is None, item[0] or ""))
    ]


class PendingPodView(Protocol):
    """What /status reads of a pending pod (the dispatcher's `PendingPod`)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def policy(self) -> str: ...
    @property
    def seen_at(self) -> float:
        """Monotonic time the dispatcher first saw the pod pending."""
    @property
    def created_unix(self) -> float | None: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def unschedulable_reason(self) -> str | None: ...
    @property
    def unschedulable_message(self) -> str | None: ...


def pending_pod_status(
    pod: PendingPodView,
    *,
    worker: str | None,
    waiting: tuple[str, str] | None = None,
    now_unix: float,
    now_monotonic: float,
) -> PendingPodStatus:
    """One pending pod and why it waits. The dispatcher's own reason for holding it back (``waiting``: reason,
    message) is the freshest; else its PodScheduled=False condition (a worker or the dispatcher wrote it); else
    whether a worker holds it."""
    since = pod.created_unix if pod.created_unix is not None else now_unix - (now_monotonic - pod.seen_at)
    if waiting is not None:
        reason, message = waiting
    elif pod.unschedulable_reason or pod.unschedulable_message:
        reason = pod.unschedulable_reason or "Unschedulable"
        message = pod.unschedulable_message or reason
    elif worker is not None:
        reason, message = "Dispatched", f"dispatched to {worker}"
    else:
        reason, message = "WaitingForWorker", WAITING_FOR_WORKER
    gang = gang_of(pod.namespace, pod.labels, pod.annotations)
    return PendingPodStatus(
        pod=pod.key, policy=pod.policy, since=round(since, 3), gang=None if gang is None else str(gang),
        worker=worker, reason=reason, message=message,
    )


def pending_view(
    pods: Collection[PendingPodView],
    *,
    dispatched: Mapping[str, str],
    waiting: Mapping[str, tuple[str, str]],
    now_unix: float,
    now_monotonic: float,
    limit: int = PENDING_SHOWN,
) -> PendingStatus:
    """The `limit` oldest pending pods (by the time they wait since, then name) with their reasons, and the total.

    ``dispatched`` maps pod uid -> worker; ``waiting`` maps the uid of a pod the dispatcher holds back -> (reason,
    message)."""
    rows = [
        pending_pod_status(
            pod, worker=dispatched.get(pod.uid), waiting=waiting.get(pod.uid), now_unix=now_unix,
            now_monotonic=now_monotonic,
        )
        for pod in pods
    ]
    return PendingStatus(total=len(rows), pods=heapq.nsmallest(limit, rows, key=lambda row: (row.since, row.pod)))


def gang_view(
    pods: Iterable[PendingPodView],
    *,
    dispatched: Mapping[str, str],
    podgroups: Mapping[GangKey, PodGroupSpec],
    limit: int = PENDING_SHOWN,
) -> list[GangStatus]:
    """The gangs among the pending pods, by name (the first `limit`): members pending, how many of them a worker
    holds, and how many the gang needs (as the dispatcher decides it, from its PodGroup or labels)."""
    members: dict[GangKey, list[PendingPodView]] = collections.defaultdict(list)
    for pod in pods:
        key = gang_of(pod.namespace, pod.labels, pod.annotations)
        if key is not None:
            members[key].append(pod)
    rows = []
    for key in sorted(members)[:limit]:
        state = gang_state(key, [pod.labels for pod in members[key]], podgroups=podgroups)
        rows.append(GangStatus(
            gang=str(key), pending=state.pending, dispatched=sum(pod.uid in dispatched for pod in members[key]),
            min_available=state.min_available,
        ))
    return rows


_VERDICTS = TypeAdapter(dict[str, int])
_DENIALS = TypeAdapter(list[Denial])


def merge_resolver_stats(stats: Mapping[str, Mapping[str, str]]) -> ResolverStatus:
    """Sum the verdicts of every resolver instance (instance -> its stats hash) and keep the newest denials.

    A field that does not parse is left out of the sum and logged; it never hides the other instances.
    """
    verdicts: collections.Counter[str] = collections.Counter()
    denials: list[Denial] = []
    instances: list[ResolverInstance] = []
    for instance, fields in sorted(stats.items()):
        try:
            verdicts.update(_VERDICTS.validate_json(fields.get("verdicts") or "{}"))
        except ValidationError as error:
            log.warning("resolver %s: unreadable verdicts field: %s", instance, error)
        try:
            denials += _DENIALS.validate_json(fields.get("recent_denials") or "[]")
        except ValidationError as error:
            log.warning("resolver %s: unreadable recent_denials field: %s", instance, error)
        try:
            updated: float | None = float(fields["updated_unix"]) if fields.get("updated_unix") else None
        except ValueError:
            log.warning("resolver %s: unreadable updated_unix %r", instance, fields.get("updated_unix"))
            updated = None
        instances.append(ResolverInstance(
            instance=instance, updated_unix=updated,
            review_p50_ms=_optional_float(fields, "review_p50_ms", instance),
            review_p99_ms=_optional_float(fields, "review_p99_ms", instance),
        ))
    denials.sort(key=lambda denial: denial.at, reverse=True)
    return ResolverStatus(
        instances=instances, verdicts=dict(sorted(verdicts.items())), recent_denials=denials[:RECENT_DENIALS]
    )


def _optional_float(fields: Mapping[str, str], name: str, instance: str) -> float | None:
    raw = fields.get(name)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        log.warning("resolver %s: unreadable %s %r", instance, name, raw)
        return None


def resolver_instance(key: str) -> str:
    """``{hoss}:resolver:<instance>`` -> ``<instance>``."""
    return key.removeprefix(RESOLVER_STATS_MATCH.removesuffix("*"))


def build_status(
    *,
    identity: str,
    leader: bool,
    leader_identity: str | None,
    redis_error: str | None,
    queues: QueueStatus,
    throughput: ThroughputStatus,
    live: Sequence[WorkerInfo] = (),
    dead: Collection[str] = (),
    routed: Collection[str] | None = None,
    dispatched: Mapping[str, str] | None = None,
    snapshot: LedgerSnapshot | None = None,
    resolver_stats: Mapping[str, Mapping[str, str]] | None = None,
    pending: PendingStatus | None = None,
    gangs: Sequence[GangStatus] = (),
    rescheduler: Mapping[str, Any] | None = None,
    quotas: QuotaReport | None = None,
    now_unix: float | None = None,
) -> SystemStatus:
    """The /status document from what the service gathered. Pure (``now_unix`` defaults to the clock)."""
    now = time.time() if now_unix is None else now_unix
    return SystemStatus(
        leader=leader,
        identity=identity,
        leader_identity=leader_identity,
        generated_unix=round(now, 3),
        redis="ok" if redis_error is None else f"unreachable: {redis_error}",
        workers=worker_statuses(live, dead, dispatched=dispatched or {}, now_unix=now, routed=routed),
        queues=queues,
        throughput=throughput,
        conflicts=sum(w.counters.get("conflicts", 0) for w in live),
        ledger=None if snapshot is None else summarize_ledger(snapshot),
        resolver=None if resolver_stats is None else merge_resolver_stats(resolver_stats),
        nodes=[] if snapshot is None else node_statuses(snapshot),
        gpu=None if snapshot is None else gpu_fragmentation(snapshot),
        pools=[] if snapshot is None else pool_statuses(snapshot),
        pending=pending if pending is not None else PendingStatus(total=queues.pending_total),
        gangs=list(gangs),
        rescheduler=None if rescheduler is None else dict(rescheduler),
        quotas=[] if quotas is None else [
            QuotaStatus(namespace=use.quota.namespace, min=dict(use.quota.min), max=dict(use.quota.max),
                        used=dict(use.used), borrowed=use.borrowed)
            for use in quotas.quotas
        ],
    )


class DispatcherMetrics:
    """The dispatcher's Prometheus metrics, in their own registry (served on /metrics)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.dispatched = Counter(
            "hoss_dispatcher_pods_dispatched_total", "Pods sent to a worker, by policy", ["policy"], registry=r
        )
        self.bound = Counter("hoss_dispatcher_pods_bound_total", "Dispatched pods seen bound to a node", registry=r)
        self.reclaimed_pods = Counter(
            "hoss_dispatcher_pods_reclaimed_total", "Pods taken back from dead workers", registry=r
        )
        self.dead_workers = Counter(
            "hoss_dispatcher_workers_reclaimed_total", "Dead workers whose work was taken back", registry=r
        )
        self.no_worker_events = Counter(
            "hoss_dispatcher_no_worker_events_total", "NoWorkerForPolicy events recorded on pods", registry=r
        )
        self.redis_errors = Counter(
            "hoss_dispatcher_redis_errors_total", "Dispatcher rounds that failed because Redis did", registry=r
        )
        self.dispatch_latency = Histogram(
            "hoss_dispatcher_dispatch_latency_seconds",
            "Time from first seeing a pending pod to sending it to a worker",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0),
            registry=r,
        )
        self.pending = Gauge("hoss_dispatcher_pending_pods", "Unbound hoss pods the watch sees", registry=r)
        self.undispatched = Gauge(
            "hoss_dispatcher_undispatched_pods", "Pending pods not sent to any worker", registry=r
        )
        self.waiting = Gauge(
            "hoss_dispatcher_waiting_for_worker_pods", "Pending pods whose policy no live worker serves", registry=r
        )
        self.live_workers = Gauge("hoss_dispatcher_live_workers", "Workers with a current heartbeat", registry=r)
        self.leader = Gauge("hoss_dispatcher_leader", "1 while this replica holds the Lease", registry=r)

