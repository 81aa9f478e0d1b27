"""What a worker counts: pods by outcome (its heartbeat and /status carry them), and its Prometheus metrics.

Where a series means what kube-scheduler's does, it has kube-scheduler's name, labels and buckets (k8s.io/kubernetes
v1.36 pkg/scheduler/metrics): a scheduler operator's dashboards and alerts read hoss's workers as they read
kube-scheduler. Where hoss measures something else, the name starts with ``hoss_`` (README's metrics table says how
each is measured). The per-pod cost is a few dictionary operations and one histogram observation per attempt;
plugin timings are taken on one evaluation in ten (kube-scheduler's ``pluginMetricsSamplePercent``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hoss.reload import reload_counter

COUNTERS = ("bound", "conflicts", "denied", "unschedulable", "malformed", "retries", "gone", "stale", "errors")
"""The outcomes every worker reports, even at 0; others (``reserved``, ``bound:<policy>``) appear when they occur."""

SCHEDULED: Final = "scheduled"
UNSCHEDULABLE: Final = "unschedulable"
ERROR: Final = "error"
"""kube-scheduler's attempt results: placed and bound; fits nowhere; anything else that sends the pod back to try
again (a lost ledger race, a binding refused, the ledger unavailable, a plugin that raised)."""
SUCCESS_STATUS: Final = "Success"
ERROR_STATUS: Final = "Error"
"""kube-scheduler's framework status codes, as its metrics label them."""
QUEUES = ("active", "backoff", "unschedulable")
"""kube-scheduler's pending-pod queues a worker has (gated pods never reach a worker: the dispatcher holds them)."""
PLUGIN_SAMPLE_PERCENT = 10
"""kube-scheduler's pluginMetricsSamplePercent: plugin durations are taken on this share of evaluations."""
MAX_ATTEMPTS_LABEL = 15
"""kube-scheduler caps the ``attempts`` label of the end-to-end duration at 15 (``15+``)."""


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """Prometheus's ExponentialBuckets, as kube-scheduler declares its histograms."""
    return tuple(start * factor ** i for i in range(count))


def attempts_label(attempts: int) -> str:
    """The ``attempts`` label kube-scheduler gives the end-to-end duration: the count, or ``15+``."""
    return f"{MAX_ATTEMPTS_LABEL}+" if attempts >= MAX_ATTEMPTS_LABEL else str(attempts)


class PendingCollector(Collector):
    """scheduler_pending_pods{queue}: the pods this worker holds, by kube-scheduler's queue, read when scraped."""

    def __init__(self, source: Callable[[], Mapping[str, int]]) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "scheduler_pending_pods", "Number of pending pods, by the queue type. 'active' means pods read and waiting "
            "for a decision; 'backoff' means pods waiting out a backoff after an error or a lost ledger race; "
            "'unschedulable' means pods that fit nowhere, tried again after their backoff or once a node gains room",
            labels=["queue"])
        counts = self.source()
        for queue in QUEUES:
            family.add_metric([queue], counts.get(queue, 0))
        yield family


class SchedulerMetrics:
    """kube-scheduler's metrics as a worker measures them, and the per-plugin durations (``hoss_``: one vectorised
    call over every node, where kube-scheduler times one node)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.attempt_duration = Histogram(
            "scheduler_scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
            ["result", "profile"], buckets=exponential_buckets(0.001, 2, 15), registry=r)
        self.attempts = Counter(
            "scheduler_schedule_attempts", "Number of attempts to schedule pods, by the result. 'unschedulable' means "
            "a pod could not be scheduled, while 'error' means the attempt failed for another reason",
            ["result", "profile"], registry=r)
        self.sli_duration = Histogram(
            "scheduler_pod_scheduling_sli_duration_seconds",
            "E2e latency for a pod being scheduled, from the time the pod enters the scheduling queue (the dispatcher "
            "sees it pending and ungated) and might involve multiple scheduling attempts",
            ["attempts"], buckets=exponential_buckets(0.01, 2, 20), registry=r)
        self.pod_attempts = Histogram(
            "scheduler_pod_scheduling_attempts", "Number of attempts to successfully schedule a pod",
            buckets=exponential_buckets(1, 2, 5), registry=r)
        self.extension_point = Histogram(
            "scheduler_framework_extension_point_duration_seconds",
            "Latency for running all plugins of a specific extension point (Bind: posting the binding)",
            ["extension_point", "status", "profile"], buckets=exponential_buckets(0.0001, 2, 12), registry=r)
        self.plugin_duration = Histogram(
            "hoss_plugin_execution_duration_seconds",
            f"Duration of one plugin call over every node at an extension point (sampled: "
            f"{PLUGIN_SAMPLE_PERCENT}% of evaluations)",
            ["plugin", "extension_point", "status"], buckets=exponential_buckets(0.00001, 2, 16), registry=r)
        self.preemption_attempts = Counter(
            "scheduler_preemption_attempts", "Total preemption attempts in the cluster till now", registry=r)
        self.preemption_victims = Histogram(
            "scheduler_preemption_victims", "Number of selected preemption victims",
            buckets=exponential_buckets(1, 2, 7), registry=r)
        self._attempt_children: dict[tuple[str, str], tuple[Histogram, Counter]] = {}
        self._plugin_children: dict[tuple[str, str, str], Histogram] = {}
        self._point_children: dict[tuple[str, str, str], Histogram] = {}
        self._sli_children: dict[int, Histogram] = {}

    def attempt(self, result: str, profile: str, seconds: float, *, pods: int = 1) -> None:
        """`pods` attempts (a gang's members are tried together) ended with `result` after `seconds`."""
        key = (result, profile)
        children = self._attempt_children.get(key)
        if children is None:
            children = self._attempt_children[key] = (self.attempt_duration.labels(result, profile),
                                                      self.attempts.labels(result, profile))
        duration, count = children
        for _ in range(pods):
            duration.observe(seconds)
        count.inc(pods)

    def scheduled(self, attempts: int, seconds: float, *, pods: int = 1) -> None:
        """`pods` were bound after `attempts` attempts, `seconds` after they entered the scheduling queue."""
        child = self._sli_children.get(attempts)
        if child is None:
            child = self._sli_children[attempts] = self.sli_duration.labels(attempts_label(attempts))
        for _ in range(pods):
            child.observe(seconds)

    def plugin(self, plugin: str, extension_point: str, status: str, seconds: float) -> None:
        key = (plugin, extension_point, status)
        child = self._plugin_children.get(key)
        if child is None:
            child = self._plugin_children[key] = self.plugin_duration.labels(plugin, extension_point, status)
        child.observe(seconds)

    def point(self, extension_point: str, status: str, profile: str, seconds: float) -> None:
        key = (extension_point, status, profile)
        child = self._point_children.get(key)
        if child is None:
            child = self._point_children[key] = self.extension_point.labels(extension_point, status, profile)
        child.observe(seconds)


class Tally:
    """The worker's counters by outcome and its metrics registry (/metrics)."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.registry = CollectorRegistry()
        self.pods = Counter("hoss_worker_pods", "Pods handled by outcome", ["outcome"], registry=self.registry)
        self.queue = Gauge("hoss_worker_queue_depth", "Work items waiting", registry=self.registry)
        self.decisions = Counter("hoss_worker_decisions", "Pod decisions by kind (full pass or shared with an earlier "
                                 "pod of the same signature)", ["kind"], registry=self.registry)
        self.last_heartbeat = Gauge(
            "hoss_worker_last_heartbeat_timestamp_seconds", "When this worker last wrote its heartbeat to Redis "
            "(Unix time; 0 before the first): the dispatcher routes only to workers whose heartbeat lives",
            registry=self.registry)
        self.scheduler = SchedulerMetrics(self.registry)
        self.config_reloads = reload_counter(self.registry, "worker")

    def count(self, outcome: str, n: int = 1) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + n
        self.pods.labels(outcome).inc(n)

    def bound_by(self, policy: str) -> None:
        """One more pod of `policy` bound (a counter without a metric of its own)."""
        self.counters[f"bound:{policy}"] = self.counters.get(f"bound:{policy}", 0) + 1
