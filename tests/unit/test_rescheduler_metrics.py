"""The rescheduler's metrics: each plan counted by why it was made and how it ended, each pod evicted, and each
refusal by who refused (the ledger, an eviction, the rate limit), with the ledger's real scripts (fakeredis) and an
apiserver stand-in that evicts or refuses. And the resolver's readiness gauge, as its /readyz would answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import fakeredis

from hoss.kube.client import KubeError
from hoss.ledger.client import Ledger
from hoss.ledger.keys import READY_KEY
from hoss.model.objects import Json
from rescheduler.cluster import ClusterView
from rescheduler.execute import EvictionLimit, Executor
from rescheduler.metrics import ReschedulerMetrics
from rescheduler.plan import Move, Node, Plan, Pod, fragmentation
from resolver.settings import ResolverSettings
from resolver.state import WebhookState
from resolver.stats import publish_stats
from tests.waiting import until


class Apiserver:
    """Evicts pods (recording them) until `refuse` names one, whose eviction a PodDisruptionBudget refuses."""

    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.evicted: list[str] = []

    async def request(self, method: str, path: str, *, body: Any = None, params: Any = None,
                      content_type: str | None = None) -> Json:
        name = path.split("/")[-2]
        if method == "POST" and path.endswith("/eviction"):
            if name == self.refuse:
                raise KubeError("Cannot evict pod as it would violate the pod's disruption budget.", status=429)
            self.evicted.append(name)
            return {}
        if method == "GET" and path.endswith("/pods"):
            return {"items": []}  # the executor looks for the moved pods' replacements: none yet
        raise AssertionError(f"unexpected call {method} {path}")


def raw(name: str) -> Json:
    return {"metadata": {"name": name, "namespace": "ns", "uid": name}}


def plan(*moves: tuple[str, str, str]) -> tuple[Plan, ClusterView]:
    """Moves (pod, from, to) of pods asking 1 cpu, for the periodic pass."""
    pods = [Pod(key=f"ns/{name}", uid=name, node=source, request={"cpu": 1000, "pods": 1}, owner=f"rs-{name}")
            for name, source, _target in moves]
    made = Plan(reason="fragmentation", before=fragmentation([]), after=fragmentation([]),
                moves=tuple(Move(pod=pod, source=source, target=target)
                            for pod, (_name, source, target) in zip(pods, moves, strict=True)))
    view = ClusterView(nodes=[Node(name=n, alloc={"cpu": 4000, "pods": 110}, used={}) for n in ("n1", "n2")],
                       placed=pods, pending=[], allowed={}, raw={pod.uid: raw(pod.uid) for pod in pods}, gated=set())
    return made, view


def executor(apiserver: Apiserver, ledger: Ledger, metrics: ReschedulerMetrics, *, per_minute: int = 10) -> Executor:
    return Executor(apiserver, ledger, limit=EvictionLimit(per_minute), hold_seconds=60,  # type: ignore[arg-type]
                    outcome_timeout_seconds=0.1, metrics=metrics)


def value(metrics: ReschedulerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_plan_whose_room_the_ledger_cannot_hold_is_refused_by_the_ledger(ledger: Ledger) -> None:
    metrics = ReschedulerMetrics()
    record = await executor(Apiserver(), ledger, metrics).run(*plan(("a", "n1", "gone-node")))
    assert record.outcome == "refused"
    assert value(metrics, "hoss_rescheduler_plans_total", reason="fragmentation", outcome="refused") == 1
    assert value(metrics, "hoss_rescheduler_refusals_total", by="ledger") == 1
    assert value(metrics, "hoss_rescheduler_evictions_total") == 0


async def test_an_eviction_a_budget_refuses_stops_the_plan_after_the_evictions_made(ledger: Ledger) -> None:
    metrics = ReschedulerMetrics()
    apiserver = Apiserver(refuse="b")
    record = await executor(apiserver, ledger, metrics).run(*plan(("a", "n1", "n2"), ("b", "n1", "n2")))
    assert record.outcome == "eviction refused" and apiserver.evicted == ["a"]
    assert value(metrics, "hoss_rescheduler_evictions_total") == 1
    assert value(metrics, "hoss_rescheduler_refusals_total", by="eviction") == 1
    assert value(metrics, "hoss_rescheduler_plans_total", reason="fragmentation", outcome="eviction refused") == 1


async def test_a_plan_over_the_eviction_rate_waits_and_says_so(ledger: Ledger) -> None:
    metrics = ReschedulerMetrics()
    record = await executor(Apiserver(), ledger, metrics, per_minute=1).run(
        *plan(("a", "n1", "n2"), ("b", "n1", "n2")))
    assert record.outcome == "rate limited"
    assert value(metrics, "hoss_rescheduler_refusals_total", by="rate_limit") == 1
    assert value(metrics, "hoss_rescheduler_refusals_total", by="ledger") == 0  # every reason shows, at 0


async def test_a_plan_carried_out_counts_its_evictions_and_its_outcome(ledger: Ledger) -> None:
    metrics = ReschedulerMetrics()
    apiserver = Apiserver()
    record = await executor(apiserver, ledger, metrics).run(*plan(("a", "n1", "n2")))
    # Nobody claims the held room within the test's outcome timeout.
    assert record.outcome == "timed out" and apiserver.evicted == ["a"]
    assert value(metrics, "hoss_rescheduler_evictions_total") == 1
    assert value(metrics, "hoss_rescheduler_plans_total", reason="fragmentation", outcome="timed out") == 1
    assert sum(value(metrics, "hoss_rescheduler_refusals_total", by=by) for by in
               ("ledger", "eviction", "rate_limit")) == 0


async def test_the_resolver_shows_it_is_ready_only_while_the_ledger_is(
    fake_redis: fakeredis.FakeAsyncRedis, ledger: Ledger, tmp_path: Path
) -> None:
    state = WebhookState(settings=ResolverSettings(tls_cert_file=str(tmp_path / "c"), tls_key_file=str(tmp_path / "k")),
                         ledger=ledger)

    def ready() -> float | None:
        return state.registry.get_sample_value("hoss_resolver_ready")

    assert ready() == 0
    publishing = asyncio.create_task(publish_stats(state, fake_redis, instance="r1", interval=0.05))
    try:
        await until(lambda: (ready() == 1, f"hoss_resolver_ready {ready()}"), timeout=10, what="the ready ledger")
        await fake_redis.delete(READY_KEY)  # the ledger is being rebuilt: reviews are denied
        await until(lambda: (ready() == 0, f"hoss_resolver_ready {ready()}"), timeout=10, what="the gauge to drop")
    finally:
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)


def test_every_metric_of_the_rescheduler_has_its_own_registry() -> None:
    """Two reschedulers in one process (a test, `hoss reschedule` beside the service) do not share counters."""
    first, second = ReschedulerMetrics(), ReschedulerMetrics()
    first.evictions.inc()
    assert second.registry.get_sample_value("hoss_rescheduler_evictions_total") == 0
