"""The webhook's Prometheus metrics (``hoss_resolver_*``, ``hoss_ledger_*``, ``hoss_quota_*``) and the window of
recent review durations behind their p50 and p99.

Gauges read the webhook's state when scraped; a review's own cost here is a counter increment, a histogram
observation and one slot of the latency window.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import ClassVar, Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from hoss.ledger.results import QuotaReport
from hoss.model import admission
from resolver.settings import ResolverSettings
from resolver.tls import certificate_expiry


class SyncCounts(Protocol):
    """The sync's counters the gauges read (resolver.sync.SyncStats has them)."""

    admitted_dropped: int
    resizes_checked: int


class Syncing(Protocol):
    @property
    def stats(self) -> SyncCounts: ...


class Scraped(Protocol):
    """What the gauges read from the webhook's state when scraped (resolver.state.WebhookState has it)."""

    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def settings(self) -> ResolverSettings: ...
    @property
    def sync(self) -> Syncing | None: ...
    @property
    def review_latency(self) -> LatencyWindow: ...
    @property
    def ledger_stats(self) -> dict[str, str]: ...
    @property
    def pod_reads(self) -> int: ...
    @property
    def quota_report(self) -> QuotaReport | None: ...

LATENCY_WINDOW = 2048
"""How many recent reviews the p50/p99 latency is computed over."""
LEDGER_COUNTERS = {
    "overcommits": "Bound pods the sync recorded on a node that had no room for them (cluster-wide, since the "
                   "ledger was created)",
    "audit_drift": "Ledger entries or nodes the periodic audit found unequal to the apiserver, or used totals "
                   "unequal to the entries, and repaired",
    "stale_ledger": "Times Redis came back holding an older copy of the ledger (detected and rebuilt)",
}
"""The cluster-wide counters of the ledger's stats hash, shown as hoss_ledger_<name> and in /status."""


class LatencyWindow:
    """The durations of the last `size` reviews, for their p50 and p99 (nearest rank). Adding is O(1); the
    percentiles sort the window, which is only done when someone reads them (/metrics, /status, the stats hash)."""

    def __init__(self, size: int = LATENCY_WINDOW) -> None:
        self._values = [0.0] * size
        self._size = size
        self._next = 0

    def add(self, seconds: float) -> None:
        self._values[self._next % self._size] = seconds
        self._next += 1

    @property
    def count(self) -> int:
        """How many reviews the window holds (at most its size)."""
        return min(self._next, self._size)

    def quantiles(self, *qs: float) -> list[float]:
        """The `qs` quantiles (0 < q <= 1) of the window in seconds; NaN when it is empty."""
        n = self.count
        if n == 0:
            return [math.nan for _ in qs]
        ordered = sorted(self._values[:n])
        return [ordered[min(max(math.ceil(q * n) - 1, 0), n - 1)] for q in qs]

    def summary_ms(self) -> dict[str, float | int | None]:
        """``{p50, p99, count}`` in milliseconds (None while empty), as /status and the stats hash show it."""
        p50, p99 = self.quantiles(0.5, 0.99)
        return {
            "p50": None if math.isnan(p50) else round(p50 * 1000, 3),
            "p99": None if math.isnan(p99) else round(p99 * 1000, 3),
            "count": self.count,
        }


class QuotaCollector(Collector):
    """hoss_quota_{min,max,used,borrowed}{namespace,resource}: each elastic quota and its use (base units), from the
    ledger as `resolver.stats.publish_stats` last read it."""

    HELP: ClassVar[dict[str, str]] = {
        "min": "ElasticQuota spec.min (base units: milli-CPU, bytes, counts)",
        "max": "ElasticQuota spec.max (base units); a resource missing is not limited",
        "used": "What the namespace's pods hold in the ledger (reserved, admitted, bound), base units",
        "borrowed": "used above min, per resource the quota names (borrowed from others' idle guarantee)",
    }

    def __init__(self, state: Scraped) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {name: GaugeMetricFamily(f"hoss_quota_{name}", text, labels=["namespace", "resource"])
                    for name, text in self.HELP.items()}
        report = self.state.quota_report
        for use in report.quotas if report is not None else ():
            for name, vector in (("min", use.quota.min), ("max", use.quota.max), ("used", use.used),
                                 ("borrowed", use.borrowed)):
                for resource, amount in vector.items():
                    families[name].add_metric([use.quota.namespace, resource], amount)
        yield from families.values()


class WebhookMetrics:
    """Every metric of one webhook, registered in ``state.registry``: what reviews update (verdicts, durations,
    refusals) and the gauges that read ``state`` when scraped."""

    def __init__(self, state: Scraped) -> None:
        self._state = state
        registry = state.registry
        self._verdicts = Counter(
            "hoss_resolver_verdicts", "Binding verdicts by outcome and reason",
            ["allowed", "reason"], registry=registry,
        )
        self._verdict_children: dict[tuple[bool, str], Counter] = {}
        self._durations = Histogram(
            "hoss_resolver_review_duration_seconds", "Time to judge one AdmissionReview",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0), registry=registry,
        )
        self._refused = Counter(
            "hoss_resolver_refused_reviews", "Reviews refused before judging: no client certificate (401) or a"
            " client name not allowed (403)", ["code"], registry=registry,
        )
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            Gauge(
                f"hoss_resolver_review_latency_{name}_seconds",
                f"{name} of the time to judge one AdmissionReview, over the last {LATENCY_WINDOW} reviews",
                registry=registry,
            ).set_function(functools.partial(self._latency_quantile, q))
        Gauge(
            "hoss_resolver_sync_leader", "1 while this replica holds the Lease and runs the ledger sync",
            registry=registry,
        ).set_function(lambda: float(state.sync is not None))
        self._ready = Gauge(
            "hoss_resolver_ready", "1 while this replica is ready (its /readyz: the ledger is reachable and ready, "
            "so bindings are judged rather than denied), as checked every 2 s", registry=registry,
        )
        Gauge(
            "hoss_resolver_serving_certificate_expiry_timestamp_seconds",
            "When the serving certificate on disk expires (Unix time; NaN when unreadable): alert well before it",
            registry=registry,
        ).set_function(lambda: certificate_expiry(state.settings.tls_cert_file))
        for counter, what in LEDGER_COUNTERS.items():
            Gauge(f"hoss_ledger_{counter}", what, registry=registry).set_function(
                functools.partial(self._ledger_counter, counter)
            )
        registry.register(QuotaCollector(state))
        Gauge(
            "hoss_resolver_pod_reads", "Pods the webhook read from the apiserver to judge a binding (neither the"
            " index of bound pods nor that of other schedulers' pending pods held the pod)", registry=registry,
        ).set_function(lambda: float(state.pod_reads))
        Gauge(
            "hoss_resolver_admitted_dropped", "Admitted writes the sync dropped because the apiserver never showed"
            " them (refused after the webhook, or, with reviews not authenticated, forged); the sync leader only",
            registry=registry,
        ).set_function(lambda: float(state.sync.stats.admitted_dropped) if state.sync is not None else 0.0)
        Gauge(
            "hoss_resolver_resizes_set_back", "Entries grown by a resize from a review nobody authenticated that the"
            " sync set back to their pod's request when due; the sync leader only", registry=registry,
        ).set_function(lambda: float(state.sync.stats.resizes_checked) if state.sync is not None else 0.0)

    def _latency_quantile(self, q: float) -> float:
        return self._state.review_latency.quantiles(q)[0]

    def _ledger_counter(self, counter: str) -> float:
        try:
            return float(self._state.ledger_stats.get(counter, 0))
        except ValueError:
            return math.nan

    def count_verdict(self, verdict: admission.Verdict) -> None:
        key = (verdict.allowed, verdict.reason)
        child = self._verdict_children.get(key)
        if child is None:
            child = self._verdict_children[key] = self._verdicts.labels(str(verdict.allowed).lower(), verdict.reason)
        child.inc()

    def set_ready(self, ready: bool) -> None:
        """What this replica's last readiness check found (`resolver.stats.publish_stats`)."""
        self._ready.set(float(ready))

    def observe_review(self, seconds: float) -> None:
        self._durations.observe(seconds)

    def count_refusal(self, code: int) -> None:
        self._refused.labels(str(code)).inc()
