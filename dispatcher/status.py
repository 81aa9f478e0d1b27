"""The system status the dispatcher serves on /status, and its Prometheus metrics.

The /status document is a pydantic model (`SystemStatus`, schema version in its ``version`` field) built by a
pure function from plain inputs (workers, the dispatched map, the ledger snapshot, the resolvers' stats hashes);
the service gathers those inputs and serves the result. A missing input (Redis unreachable) leaves its section
empty and says why in ``redis``; /status never fails because a dependency did.

Resolver instances publish their counters to Redis hashes ``{hoss}:resolver:<instance>`` (fields ``verdicts``:
JSON object reason -> count, ``recent_denials``: JSON list of denials, ``updated_unix``), which expire when the
resolver stops; the dispatcher sums them.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from dispatcher.queue import PREFIX, WorkerInfo
from resolver.ledger import LedgerSnapshot

log = logging.getLogger(__name__)

STATUS_VERSION: Literal[1] = 1
RESOLVER_STATS_MATCH = f"{PREFIX}:resolver:*"
"""SCAN pattern of the resolvers' stats hashes."""
RECENT_DENIALS = 20
"""How many of the newest denials /status shows."""
RATE_WINDOW_SECONDS = 60.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class WorkerStatus(_Model):
    id: str
    policies: list[str]
    alive: bool
    """False: registered but its heartbeat expired; its work is moved on the leader's next reclaim."""
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
    since: float
    """Unix time at which the pod started waiting for a worker that serves its policy."""


class QueueStatus(_Model):
    pending_total: int
    """Unbound hoss pods the dispatcher's watch sees."""
    undispatched: int
    """Pending pods no worker has been sent (waiting for a worker, or about to be sent)."""
    waiting_for_worker: list[WaitingPod]
    """Pending pods whose policy no live worker serves, oldest first."""


class ThroughputStatus(_Model):
    bound_per_second_1m: float
    """Dispatched pods that left the pending set bound to a node, per second over the last minute."""
    dispatched_total: int
    """Pods this replica sent to workers since it started."""
    bound_total: int
    """Dispatched pods this replica saw bound since it started."""


class ResourceTotal(_Model):
    alloc: int
    """Sum of allocatable over the ledger's nodes, in base units (milli-CPU, bytes, counts)."""
    used: int
    """Sum of requested (bound + assumed) over the ledger's nodes, in base units."""


class LedgerStatus(_Model):
    ready: bool
    epoch: str | None
    nodes: int
    assumed: int
    """Reservations not yet bound, over all nodes."""
    bound: int
    """Bound entries, over all nodes."""
    resources: dict[str, ResourceTotal]


class Denial(_Model):
    model_config = ConfigDict(extra="ignore")

    at: float
    pod: str
    node: str
    username: str
    reason: str
    message: str


class ResolverInstance(_Model):
    instance: str
    updated_unix: float | None


class ResolverStatus(_Model):
    instances: list[ResolverInstance]
    verdicts: dict[str, int]
    """Verdict counts by reason, summed over the resolver instances."""
    recent_denials: list[Denial]
    """Newest first, at most 20, over all instances."""


class SystemStatus(_Model):
    """The whole system as the dispatcher sees it: GET /status."""

    version: Literal[1] = STATUS_VERSION
    """Schema version; bumped on any incompatible change."""
    leader: bool
    """This replica holds the Lease and dispatches; a follower serves /status but does not dispatch."""
    identity: str
    leader_identity: str | None
    """The Lease holder as this replica last saw it ("" when released, None when unknown)."""
    redis: str
    """"ok", or "unreachable: <error>" (then workers, ledger and resolver are empty or null)."""
    workers: list[WorkerStatus]
    queues: QueueStatus
    throughput: ThroughputStatus
    conflicts: int
    """Ledger conflicts the live workers report (sum of their "conflicts" counters)."""
    ledger: LedgerStatus | None
    resolver: ResolverStatus | None


class BoundRate:
    """Counts dispatched and bound pods, and the bound rate over a sliding minute."""

    def __init__(self, *, window_seconds: float = RATE_WINDOW_SECONDS) -> None:
        self.window_seconds = window_seconds
        self.dispatched_total = 0
        self.bound_total = 0
        self._bound_at: collections.deque[float] = collections.deque()

    def dispatched(self, count: int = 1) -> None:
        self.dispatched_total += count

    def bound(self, now: float) -> None:
        self.bound_total += 1
        self._bound_at.append(now)
        self._prune(now)

    def per_second(self, now: float) -> float:
        self._prune(now)
        return len(self._bound_at) / self.window_seconds

    def view(self, now: float) -> ThroughputStatus:
        return ThroughputStatus(
            bound_per_second_1m=round(self.per_second(now), 3),
            dispatched_total=self.dispatched_total,
            bound_total=self.bound_total,
        )

    def _prune(self, now: float) -> None:
        while self._bound_at and self._bound_at[0] <= now - self.window_seconds:
            self._bound_at.popleft()


def worker_statuses(
    live: Sequence[WorkerInfo], dead: Collection[str], *, dispatched: Mapping[str, str], now_unix: float
) -> list[WorkerStatus]:
    """Live workers and registered-but-dead ones, by id, with what the dispatched map assigns each."""
    outstanding = collections.Counter(dispatched.values())
    rows = [
        WorkerStatus(
            id=w.id, policies=list(w.policies), alive=True, queue_depth=w.queue_depth, in_flight=w.in_flight,
            outstanding=outstanding[w.id], heartbeat_age_seconds=round(max(now_unix - w.heartbeat_unix, 0.0), 3),
            counters=dict(w.counters),
        )
        for w in live
    ]
    rows += [
        WorkerStatus(
            id=worker_id, policies=[], alive=False, queue_depth=0, in_flight=0, outstanding=outstanding[worker_id],
            heartbeat_age_seconds=None, counters={},
        )
        for worker_id in dead
    ]
    return sorted(rows, key=lambda row: row.id)


def summarize_ledger(snapshot: LedgerSnapshot) -> LedgerStatus:
    totals: dict[str, ResourceTotal] = {}
    for node in snapshot.nodes.values():
        for resource in {*node.alloc, *node.used}:
            total = totals.setdefault(resource, ResourceTotal(alloc=0, used=0))
            total.alloc += node.alloc.get(resource, 0)
            total.used += node.used.get(resource, 0)
    return LedgerStatus(
        ready=snapshot.ready,
        epoch=snapshot.epoch,
        nodes=len(snapshot.nodes),
        assumed=sum(node.assumed for node in snapshot.nodes.values()),
        bound=sum(node.bound for node in snapshot.nodes.values()),
        resources=dict(sorted(totals.items())),
    )


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
        instances.append(ResolverInstance(instance=instance, updated_unix=updated))
    denials.sort(key=lambda denial: denial.at, reverse=True)
    return ResolverStatus(
        instances=instances, verdicts=dict(sorted(verdicts.items())), recent_denials=denials[:RECENT_DENIALS]
    )


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
    dispatched: Mapping[str, str] | None = None,
    snapshot: LedgerSnapshot | None = None,
    resolver_stats: Mapping[str, Mapping[str, str]] | None = None,
    now_unix: float | None = None,
) -> SystemStatus:
    """The /status document from what the service gathered. Pure (``now_unix`` defaults to the clock)."""
    now = time.time() if now_unix is None else now_unix
    return SystemStatus(
        leader=leader,
        identity=identity,
        leader_identity=leader_identity,
        redis="ok" if redis_error is None else f"unreachable: {redis_error}",
        workers=worker_statuses(live, dead, dispatched=dispatched or {}, now_unix=now),
        queues=queues,
        throughput=throughput,
        conflicts=sum(w.counters.get("conflicts", 0) for w in live),
        ledger=None if snapshot is None else summarize_ledger(snapshot),
        resolver=None if resolver_stats is None else merge_resolver_stats(resolver_stats),
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

