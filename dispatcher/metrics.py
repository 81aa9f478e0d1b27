"""The dispatcher's Prometheus metrics (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
        self.rounds = Counter(
            "hoss_dispatcher_rounds_total",
            "Rounds completed, by role: the leader's full rounds (reclaim, resync, dispatch), the follower's refreshes",
            ["role"], registry=r,
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
