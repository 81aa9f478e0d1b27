"""The sections of /status, built by pure functions from plain inputs, and `build_status`, which puts them together.

Inputs: the workers' heartbeats and the dispatched map, the ledger snapshot (nodes, GPU fragmentation, pools,
elastic quotas), the resolvers' stats (`dispatcher.resolverstats`), the pending pods and their gangs. No I/O: the
service (dispatcher/server.py) gathers the inputs and serves the document.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from dispatcher.gangs import GangKey, PodGroupSpec, gang_of, gang_state
from dispatcher.resolverstats import merge_resolver_stats
from dispatcher.status import (
    GPU_RESOURCE,
    GangStatus,
    GpuStatus,
    LedgerStatus,
    NodeStatus,
    PendingPodStatus,
    PendingStatus,
    PoolStatus,
    QueueStatus,
    QuotaStatus,
    ResourceTotal,
    SystemStatus,
    ThroughputStatus,
    WorkerStatus,
)
from hoss.ledger.results import LedgerSnapshot, NodeSnapshot, QuotaReport
from hoss.model.resources import gpu_spread
from hoss.queue import WorkerInfo

PENDING_SHOWN = 200
"""How many pending pods (the oldest) and gangs /status lists; the totals count all of them."""
POOL_LABEL = "hoss.io/pool"
WAITING_FOR_WORKER = "waiting for a worker"


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
    def scheduling_group(self) -> str | None: ...
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
    gang = gang_of(pod.namespace, pod.labels, pod.annotations, scheduling_group=pod.scheduling_group)
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
        key = gang_of(pod.namespace, pod.labels, pod.annotations, scheduling_group=pod.scheduling_group)
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
