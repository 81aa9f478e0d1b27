"""The system status the dispatcher serves on /status (and its schema on /status/schema): the document's models.

The /status document is a pydantic model (`SystemStatus`, schema version in its ``version`` field) built by pure
functions from plain inputs (`dispatcher.statusviews.build_status`); the service gathers those inputs and serves
the result. A missing input (Redis unreachable) leaves its section empty and says why in ``redis``; /status never
fails because a dependency did.

Compatibility: within one ``version`` fields are only ever added, each with a default, so a reader must ignore
fields it does not know (these models do) and a newer reader still accepts an older document. Version 1 gained
``nodes``, ``gpu``, ``pools``, ``pending``, ``gangs`` and ``throughput.history`` for the operator dashboard.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

STATUS_VERSION: Literal[1] = 1
HISTORY_INTERVAL_SECONDS = 5.0
"""Width of one ``throughput.history`` sample."""
GPU_RESOURCE = "nvidia.com/gpu"


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
