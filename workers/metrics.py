"""What a worker counts: pods by outcome (its heartbeat and /status carry them), and its Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

COUNTERS = ("bound", "conflicts", "denied", "unschedulable", "malformed", "retries", "gone", "stale", "errors")
"""The outcomes every worker reports, even at 0; others (``reserved``, ``bound:<policy>``) appear when they occur."""


class Tally:
    """The worker's counters by outcome and its metrics registry (/metrics)."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.registry = CollectorRegistry()
        self.pods = Counter("hoss_worker_pods", "Pods handled by outcome", ["outcome"], registry=self.registry)
        self.queue = Gauge("hoss_worker_queue_depth", "Work items waiting", registry=self.registry)
        self.decisions = Counter("hoss_worker_decisions", "Pod decisions by kind (full pass or shared with an earlier "
                                 "pod of the same signature)", ["kind"], registry=self.registry)

    def count(self, outcome: str, n: int = 1) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + n
        self.pods.labels(outcome).inc(n)

    def bound_by(self, policy: str) -> None:
        """One more pod of `policy` bound (a counter without a metric of its own)."""
        self.counters[f"bound:{policy}"] = self.counters.get(f"bound:{policy}", 0) + 1
