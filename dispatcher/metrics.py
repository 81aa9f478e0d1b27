"""The dispatcher's Prometheus metrics (served on /metrics).

The per-worker series (routing, backlog, heartbeat age) and the pending pods' ages are read from the dispatcher's
view when scraped, so dispatching pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

WorkerFigures = Mapping[str, Mapping[str, float]]
"""worker id -> its figures by `WorkersCollector.GAUGES` key and ``routed`` (pods sent to it, cumulative)."""


class WorkersCollector(Collector):
    """Per worker this replica routes to: the pods sent to it (hoss_dispatcher_pods_routed_total{worker}, while it
    lives), and the gauges of `GAUGES`, from `source` when scraped."""

    GAUGES: ClassVar[dict[str, tuple[str, str]]] = {
        "backlog": ("hoss_dispatcher_worker_backlog", "Pods waiting for the worker's decision as the dispatcher "
                    "estimates them (its heartbeat's ready count, plus pods sent since, less its decide rate): "
                    "the figure routing keeps under --pack-depth"),
        "assigned": ("hoss_dispatcher_worker_assigned_pods", "Pods the dispatched map holds for the worker (sent, "
                     "not yet seen bound or handed back)"),
        "heartbeat_age_seconds": ("hoss_dispatcher_worker_heartbeat_age_seconds", "Age of the worker's heartbeat "
                                  "as last read (the dispatcher takes a worker whose heartbeat expired for dead)"),
    }

    def __init__(self, source: Callable[[], WorkerFigures]) -> None:
        self.source = source

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        figures = self.source()
        routed = CounterMetricFamily("hoss_dispatcher_pods_routed", "Pods sent to each live worker routed to "
                                     "(by this replica, while it leads)", labels=["worker"])
        gauges = {key: GaugeMetricFamily(name, text, labels=["worker"]) for key, (name, text) in self.GAUGES.items()}
        for worker, values in sorted(figures.items()):
            routed.add_metric([worker], values.get("routed", 0.0))
            for key, family in gauges.items():
                family.add_metric([worker], values.get(key, 0.0))
        yield routed
        yield from gauges.values()


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
        self.fenced_writes = Counter(
            "hoss_dispatcher_fenced_writes_total", "Writes to the work queues Redis refused because a leader of a "
            "later term took over (this replica had lost the Lease)", registry=r
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
        self.gated = Gauge(
            "hoss_dispatcher_gated_pods", "Pending pods with scheduling gates (kube-scheduler's pending_pods"
            "{queue=\"gated\"}): never sent to a worker until their last gate goes", registry=r)
        self.oldest_pending = Gauge(
            "hoss_dispatcher_oldest_pending_pod_age_seconds", "Age (since creation) of the oldest pending pod without "
            "scheduling gates, 0 when there is none: pods waiting for a node, a worker, their gang or a dependency",
            registry=r)

    def track_workers(self, source: Callable[[], WorkerFigures]) -> None:
        """Serve the per-worker series from `source` (`WorkersCollector`)."""
        self.registry.register(WorkersCollector(source))
