"""Elastic-quota reclaim's victim choice (workers/preempt.py: reclaimable, reclaim_candidates) on the issue's A/B
example and hand-worked cases, on a real node table and the default profile of configs/policies.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from hoss.framework.budget import Budget
from hoss.framework.cycle import Profile
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import PlacedPod
from hoss.framework.podterms import label_selector
from hoss.framework.profiles import load_profiles
from hoss.ledger.arguments import ElasticQuota
from hoss.ledger.results import QuotaReport, QuotaUse
from tests.kube_objects import raw_node, raw_pod, table
from workers.victims import (
    Candidate,
    gang_reclaim_victims,
    keeps_quota_mins,
    pick,
    reclaim_candidates,
    reclaimable,
)

GPU = "nvidia.com/gpu"
GPU_NODE = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "2"}
POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"


@pytest.fixture(scope="module")
def profile() -> Profile:
    profiles, default = load_profiles(POLICIES)
    return profiles[default]


def place(nodes: NodeTable, ns: str, name: str, node: str, *, priority: int = 0, created: str) -> PlacedPod:
    pod = PlacedPod(uid=f"uid-{ns}-{name}", node=node, namespace=ns, labels={"app": ns}, ports=(), name=name,
                    priority=priority, request={GPU: 1, "pods": 1}, created=created)
    nodes.place_pod(pod)
    nodes.add_used(node, pod.request)
    return pod


def incoming(ns: str) -> PodView:
    raw = raw_pod("new", {GPU: "1"})
    raw["metadata"]["namespace"] = ns
    return parse_pod(raw)


def report(used: dict[str, int]) -> QuotaReport:
    quotas = {"a": ElasticQuota("a", {GPU: 4}, {GPU: 6}), "b": ElasticQuota("b", {GPU: 6}, {GPU: 8})}
    uses = [QuotaUse(quotas[ns], {GPU: used.get(ns, 0)}) for ns in sorted(quotas)]
    return QuotaReport(uses, {GPU: 10}, {GPU: sum(used.values())})


def a_runs_six_b_runs_four() -> NodeTable:
    """5 nodes of 2 GPUs: A's 6 pods (a0 oldest .. a5 newest) on g0-g2, B's 4 on g3-g4."""
    nodes = table(*(raw_node(f"g{i}", GPU_NODE) for i in range(5)))
    for i in range(6):
        place(nodes, "a", f"a{i}", f"g{i // 2}", created=f"2026-01-01T00:00:0{i}Z")
    for i in range(4):
        place(nodes, "b", f"b{i}", f"g{3 + i // 2}", created=f"2026-01-02T00:00:0{i}Z")
    return nodes


def test_b_within_its_min_reclaims_a_borrowed_pod_newest_first(profile: Profile) -> None:
    nodes = a_runs_six_b_runs_four()
    quotas = report({"a": 6, "b": 4})
    pod = incoming("b")
    assert reclaimable(pod, quotas) == ""
    chosen = pick(reclaim_candidates(profile, pod, nodes, [], quotas=quotas))
    assert chosen is not None
    assert [v.name for v in chosen.victims] == ["a5"] and chosen.node == "g2"
    # The second B pod, while a5 is leaving (and the first B pod will take its room): a4, never a victim twice.
    second = pick(reclaim_candidates(profile, pod, nodes, [], quotas=quotas, leaving=chosen.victims,
                                     coming={GPU: 1}))
    assert second is not None and [v.name for v in second.victims] == ["a4"]
    # A third: A is at its min once a5 and a4 go, so nothing more is taken from it.
    leaving = (*chosen.victims, *second.victims)
    assert reclaim_candidates(profile, pod, nodes, [], quotas=quotas, leaving=leaving, coming={GPU: 2}) == []


def test_lowest_priority_goes_first_whatever_its_age(profile: Profile) -> None:
    nodes = table(*(raw_node(f"g{i}", GPU_NODE) for i in range(5)))
    for i in range(6):
        place(nodes, "a", f"a{i}", f"g{i // 2}", priority=10 if i != 1 else 1, created=f"2026-01-01T00:00:0{i}Z")
    for i in range(4):
        place(nodes, "b", f"b{i}", f"g{3 + i // 2}", created=f"2026-01-02T00:00:0{i}Z")
    chosen = pick(reclaim_candidates(profile, incoming("b"), nodes, [], quotas=report({"a": 6, "b": 4})))
    assert chosen is not None and [v.name for v in chosen.victims] == ["a1"]


def test_a_budget_protects_a_pod_and_the_next_is_taken(profile: Profile) -> None:
    nodes = a_runs_six_b_runs_four()
    guard = Budget(namespace="a", name="pdb", selector=label_selector({"matchLabels": {"app": "a"}}, field="s"),
                   disruptions_allowed=1)
    found = reclaim_candidates(profile, incoming("b"), nodes, [guard], quotas=report({"a": 6, "b": 4}))
    # Only one eviction is allowed among A's pods: the newest (a5) takes it, the rest are protected.
    assert {tuple(v.name for v in c.victims) for c in found} == {("a5",)}


def test_a_tenant_above_its_min_or_without_quota_does_not_reclaim() -> None:
    quotas = report({"a": 4, "b": 6})
    assert "min 4" in reclaimable(incoming("a"), quotas)
    assert reclaimable(incoming("nobody"), quotas) == "namespace nobody has no elastic quota"


def test_no_victim_from_a_tenant_at_its_min(profile: Profile) -> None:
    nodes = table(*(raw_node(f"g{i}", GPU_NODE) for i in range(5)))
    for i in range(4):
        place(nodes, "a", f"a{i}", f"g{i // 2}", created=f"2026-01-01T00:00:0{i}Z")
    for i in range(6):
        place(nodes, "b", f"b{i}", f"g{2 + i // 2}", created=f"2026-01-02T00:00:0{i}Z")
    # Nodes full, both tenants at their min: a new B pod (above its min) may not reclaim, and no victim exists.
    quotas = report({"a": 4, "b": 6})
    assert reclaimable(incoming("b"), quotas) != ""
    assert reclaim_candidates(profile, incoming("b"), nodes, [], quotas=quotas) == []


def test_priority_preemption_keeps_every_tenant_at_its_min_and_a_borrower_to_its_own_pods() -> None:
    """CapacityScheduling's victims for a priority preemption: A at 6 borrows 2 of B's min; B at 4."""
    nodes = a_runs_six_b_runs_four()
    quotas = report({"a": 6, "b": 4})
    a_pods = {p.name: p for p in nodes.pods.values() if p.namespace == "a"}
    b_pods = {p.name: p for p in nodes.pods.values() if p.namespace == "b"}

    def on(*victims: PlacedPod) -> Candidate:
        return Candidate(node="g0", victims=victims, violations=0)

    # A new pod of A would borrow more: it may evict A's own pods only, never B's (B is below its min anyway).
    assert keeps_quota_mins(incoming("a"), on(a_pods["a5"]), quotas)
    assert not keeps_quota_mins(incoming("a"), on(b_pods["b0"]), quotas)
    # A pod of a namespace without quota may take A down to its min (4) but not below, and never B (at 4 < min 6).
    assert keeps_quota_mins(incoming("other"), on(a_pods["a5"], a_pods["a4"]), quotas)
    assert not keeps_quota_mins(incoming("other"), on(a_pods["a5"], a_pods["a4"], a_pods["a3"]), quotas)
    assert not keeps_quota_mins(incoming("other"), on(b_pods["b0"]), quotas)
    # B within its min (4 + 1 <= 6): A's borrowed pods are fair game, down to A's min.
    assert keeps_quota_mins(incoming("b"), on(a_pods["a5"], a_pods["a4"]), quotas)
    assert not keeps_quota_mins(incoming("b"), on(a_pods["a5"], a_pods["a4"], a_pods["a3"]), quotas)


def gang_of_b(count: int) -> list[PodView]:
    members = []
    for i in range(count):
        raw = raw_pod(f"g-{i}", {GPU: "1"})
        raw["metadata"]["namespace"] = "b"
        members.append(parse_pod(raw))
    return members


def test_a_gang_within_its_min_reclaims_for_all_its_members_at_once_or_not_at_all(profile: Profile) -> None:
    """B runs 4 of its min 6; a gang of 2 takes A's two newest borrowed pods, one per member; a gang of 3 would
    take B past its min, and a gang of 2 finds nothing when A is at its min: nothing is chosen then."""
    nodes = a_runs_six_b_runs_four()
    quotas = report({"a": 6, "b": 4})
    steps = gang_reclaim_victims(profile, gang_of_b(2), nodes, [], quotas=quotas)
    assert steps is not None
    assert sorted(v.name for step in steps for v in step.victims) == ["a4", "a5"]
    assert nodes.used_of("g2") == {GPU: 2, "pods": 2}, "the table is left as it was"
    at_min = report({"a": 4, "b": 4})
    assert gang_reclaim_victims(profile, gang_of_b(2), a_runs_six_b_runs_four(), [], quotas=at_min) is None
