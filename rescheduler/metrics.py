"""The rescheduler's Prometheus metrics (served on /metrics): its rounds, the plans it made and how they ended, the
pods it evicted, what refused it, and the GPUs left stranded.

Counted where they happen (`rescheduler.service`, `rescheduler.execute`); each is a counter increment per plan or
eviction, nothing per pod of the cluster.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REFUSED_BY_LEDGER = "ledger"
"""The ledger refused to hold the plan's room: it was taken meanwhile, its node is gone, or the pending pod was
placed."""
REFUSED_BY_EVICTION = "eviction"
"""The apiserver refused an eviction (a PodDisruptionBudget, or no answer)."""
REFUSED_BY_RATE_LIMIT = "rate_limit"
"""The plan's evictions would exceed ``--max-evictions-per-minute``: it waits for a later round."""
REFUSALS = (REFUSED_BY_LEDGER, REFUSED_BY_EVICTION, REFUSED_BY_RATE_LIMIT)


class ReschedulerMetrics:
    """The rescheduler's metrics, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.rounds = Counter("hoss_rescheduler_rounds", "Rounds this replica ran (while it leads)", registry=r)
        self.plans = Counter(
            "hoss_rescheduler_plans", "Plans made, by why (pending: for a pending GPU pod; fragmentation: the "
            "periodic pass) and how they ended (completed, timed out, replacement larger, refused, eviction refused, "
            "rate limited; dry run: only planned)", ["reason", "outcome"], registry=r)
        self.evictions = Counter("hoss_rescheduler_evictions", "Pods evicted to carry out plans", registry=r)
        self.refusals = Counter(
            "hoss_rescheduler_refusals", "Plans stopped by a refusal: by the ledger (the room could not be held), "
            "an eviction (the apiserver refused it, e.g. a PodDisruptionBudget) or the eviction rate limit",
            ["by"], registry=r)
        for by in REFUSALS:
            self.refusals.labels(by)
        self.stranded_gpus = Gauge(
            "hoss_rescheduler_stranded_gpus", "GPUs free on partly used GPU nodes at the last round", registry=r)
        self.whole_free_nodes = Gauge(
            "hoss_rescheduler_whole_free_gpu_nodes", "GPU nodes with every GPU free at the last round", registry=r)
        self.last_round = Gauge(
            "hoss_rescheduler_last_round_timestamp_seconds", "When the last round ended (Unix time; 0 before the "
            "first)", registry=r)
        self.leader = Gauge("hoss_rescheduler_leader", "1 while this replica holds the Lease and runs rounds",
                            registry=r)
