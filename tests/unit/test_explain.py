"""The per-node explanation of `hoss why` (hoss/framework/explain.py): each node under the first filter that rejects
it, as the worker counts it, with the filter's figures; classes of nodes; score parts that add up to the worker's
totals."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hoss.framework.cycle import FilterResult, Profile, evaluate, run_filters
from hoss.framework.explain import NodeVerdict, classes, explain_filters, score_parts
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import HostPort, PlacedPod
from hoss.framework.podterms import parse_terms
from hoss.framework.profiles import load_profiles
from tests.kube_objects import CPU_NODE, Json, raw_node, raw_pod, table

POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"
TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
SMALL = {"cpu": "4", "memory": "16Gi", "pods": "110"}


def default_profile() -> Profile:
    profiles, default = load_profiles(POLICIES)
    return profiles[default]


def by_node(verdicts: Sequence[NodeVerdict]) -> dict[str, NodeVerdict]:
    return {verdict.node: verdict for verdict in verdicts}


def text(verdict: NodeVerdict) -> str:
    assert verdict.figures is not None, verdict
    return verdict.figures.text


def use(nodes: NodeTable, node: str, **amounts: int) -> None:
    nodes.add_used(node, amounts)


def mixed_cluster() -> NodeTable:
    """One node per way to fail the default profile's filters, and one that fits."""
    return table(
        raw_node("cordoned", unschedulable=True),
        raw_node("tainted", taints=[TAINT, {"key": "other", "value": "", "effect": "NoExecute"}]),
        raw_node("elsewhere", labels={"zone": "b"}),
        raw_node("small", SMALL, labels={"zone": "a"}),
        raw_node("fits", labels={"zone": "a"}),
    )


def zone_a_pod(cpu: str = "8") -> PodView:
    return parse_pod(raw_pod("web", {"cpu": cpu, "memory": "1Gi"}, node_selector={"zone": "a"}))


def test_every_node_is_under_the_first_filter_that_rejects_it_as_the_worker_counts_it() -> None:
    nodes = mixed_cluster()
    pod = zone_a_pod()
    profile = default_profile()
    explained = explain_filters(profile.filters, pod, nodes)
    verdicts = by_node(explained.verdicts)
    assert {name: v.filter for name, v in verdicts.items()} == {
        "cordoned": "NodeUnschedulable", "tainted": "TaintToleration", "elsewhere": "NodeAffinity",
        "small": "NodeResourcesFit", "fits": ""}
    feasible, counts = run_filters(profile.filters, pod, nodes)
    assert np.array_equal(explained.feasible, feasible)
    per_reason: dict[str, int] = {}
    for verdict in explained.verdicts:
        for reason in verdict.reasons:
            per_reason[reason] = per_reason.get(reason, 0) + 1
    assert per_reason == counts  # the same reasons, on the same nodes, as the worker's FailedScheduling message


def test_resource_figures_give_asked_against_free_and_allocatable() -> None:
    nodes = table(raw_node("n1", SMALL))
    use(nodes, "n1", cpu=3000, memory=15 << 30)
    pod = parse_pod(raw_pod("web", {"cpu": "2", "memory": "2Gi"}))
    verdict = explain_filters(default_profile().filters, pod, nodes).verdicts[0]
    assert verdict.reasons == ("Insufficient cpu", "Insufficient memory")
    assert text(verdict) == "cpu: asked 2, free 1 of 4; memory: asked 2Gi, free 1Gi of 16Gi"
    assert verdict.figures is not None
    assert verdict.figures.values["cpu"] == {"asked": 2000, "free": 1000, "allocatable": 4000}


def test_a_pod_too_big_for_any_node_and_a_full_node_are_classes_apart_and_the_freest_node_is_named() -> None:
    nodes = table(*(raw_node(f"n{i}", SMALL) for i in range(3)), raw_node("big", CPU_NODE))
    use(nodes, "n0", cpu=4000)
    use(nodes, "n1", cpu=2000)
    use(nodes, "n2", cpu=3000)
    use(nodes, "big", cpu=31_000)
    pod = parse_pod(raw_pod("web", {"cpu": "3", "memory": "1Gi"}))
    found = classes(explain_filters(default_profile().filters, pod, nodes).verdicts)
    assert [(c.group, c.nodes, c.closest.node) for c in found] == [
        ("cpu: asked 3, allocatable 4", ["n0", "n1", "n2"], "n1"),
        ("cpu: asked 3, allocatable 32", ["big"], "big"),
    ]
    assert text(found[0].closest) == "cpu: asked 3, free 2 of 4"


def test_gpu_pod_figures_show_gpu_nodes_full_and_cpu_nodes_without_gpus() -> None:
    gpu = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    nodes = table(raw_node("cpu-0"), raw_node("gpu-0", gpu))
    use(nodes, "gpu-0", **{"nvidia.com/gpu": 7})
    pod = parse_pod(raw_pod("train", {"cpu": "1", "nvidia.com/gpu": "2"}))
    verdicts = by_node(explain_filters(default_profile().filters, pod, nodes).verdicts)
    assert text(verdicts["gpu-0"]) == "nvidia.com/gpu: asked 2, free 1 of 8"
    assert text(verdicts["cpu-0"]) == "nvidia.com/gpu: asked 2, free 0 of 0"


def test_taint_figures_name_the_first_untolerated_taint_in_full() -> None:
    verdict = by_node(explain_filters(default_profile().filters, zone_a_pod("1"), mixed_cluster()).verdicts)["tainted"]
    assert verdict.reasons == ("node(s) had untolerated taint {dedicated: gpu}",)
    assert text(verdict) == "taint dedicated=gpu:NoSchedule not tolerated"
    tolerant = parse_pod(raw_pod("web", tolerations=[{"key": "dedicated", "operator": "Exists"}]))
    again = by_node(explain_filters(default_profile().filters, tolerant, mixed_cluster()).verdicts)["tainted"]
    assert text(again) == "taint other:NoExecute not tolerated"


def test_affinity_figures_name_the_selector_entry_or_the_unmet_requirement_and_the_nodes_value() -> None:
    nodes = mixed_cluster()
    verdicts = by_node(explain_filters(default_profile().filters, zone_a_pod("1"), nodes).verdicts)
    assert text(verdicts["elsewhere"]) == "nodeSelector zone=a: node has zone=b"
    terms = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "c"]}]},
             {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["fits"]}]}]
    pod = parse_pod(raw_pod("web", terms=terms))
    verdict = by_node(explain_filters(default_profile().filters, pod, nodes).verdicts)["elsewhere"]
    assert text(verdict) == ("no required node-affinity term matches: term 0: zone In [a, c]: node has zone=b; "
                             "term 1: metadata.name In [fits]: node has name elsewhere")


def test_pool_figures_give_the_pods_pool_and_where_it_comes_from_against_the_nodes() -> None:
    nodes = table(raw_node("a-0", labels={"hoss.io/pool": "pool-a"}), raw_node("loose"),
                  raw_node("b-0", labels={"hoss.io/pool": "pool-b"}))
    pod = parse_pod(raw_pod("tenant", labels={"hoss.io/pool": "pool-b"}))
    verdicts = by_node(explain_filters(default_profile().filters, pod, nodes).verdicts)
    assert text(verdicts["a-0"]) == "pod's pool pool-b (pod label hoss.io/pool); node in pool pool-a"
    assert text(verdicts["loose"]) == "pod's pool pool-b (pod label hoss.io/pool); node in no pool"
    assert verdicts["b-0"].feasible


def test_spread_figures_give_the_domain_count_the_minimum_and_the_skew() -> None:
    nodes = table(*(raw_node(f"n{i}", labels={"zone": zone}) for i, zone in enumerate("aab")), raw_node("bare"))
    for i in range(3):
        nodes.place_pod(PlacedPod(uid=f"u{i}", node="n0", namespace="team", labels={"app": "web"}, ports=()))
    raw = raw_pod("web", labels={"app": "web"})
    raw["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable":
                                                 "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]
    verdicts = by_node(explain_filters(default_profile().filters, parse_pod(raw), nodes).verdicts)
    assert text(verdicts["n0"]) == "zone=a: 3 matching pod(s) + this pod - global minimum 0 = skew 4 > maxSkew 1"
    assert verdicts["n1"].figures == verdicts["n0"].figures  # one domain, one class
    assert text(verdicts["bare"]) == "zone (maxSkew 1): node has no label zone"
    assert verdicts["n2"].feasible


def test_port_figures_name_the_pod_holding_the_port() -> None:
    nodes = table(raw_node("n0"), raw_node("n1"))
    nodes.place_pod(PlacedPod(uid="u1", node="n0", namespace="team", labels={}, name="proxy",
                              ports=(HostPort("TCP", "0.0.0.0", 8080),)))
    raw = raw_pod("web")
    raw["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    verdicts = by_node(explain_filters(default_profile().filters, parse_pod(raw), nodes).verdicts)
    assert text(verdicts["n0"]) == "host port TCP/0.0.0.0/8080 held by team/proxy"
    assert verdicts["n1"].feasible


def test_anti_affinity_figures_name_a_pod_in_the_nodes_domain() -> None:
    nodes = table(raw_node("n0", labels={"zone": "a"}), raw_node("n1", labels={"zone": "a"}),
                  raw_node("n2", labels={"zone": "b"}))
    nodes.place_pod(PlacedPod(uid="u1", node="n0", namespace="team", labels={"app": "db"}, name="db-0", ports=()))
    raw = raw_pod("web")
    raw["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}}}]}}
    verdicts = by_node(explain_filters(default_profile().filters, parse_pod(raw), nodes).verdicts)
    assert text(verdicts["n1"]) == "team/db-0 (on n0) in the node's zone=a domain matches the pod's anti-affinity"
    assert verdicts["n2"].feasible


def test_existing_pods_anti_affinity_names_the_pod_that_keeps_this_one_out() -> None:
    nodes = table(raw_node("n0", labels={"zone": "a"}), raw_node("n1", labels={"zone": "b"}))
    anti = parse_terms([{"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "web"}}}],
                       field="anti", owner_namespace="team")
    nodes.place_pod(PlacedPod(uid="u1", node="n0", namespace="team", labels={}, name="loner", ports=(), anti=anti))
    verdicts = by_node(explain_filters(default_profile().filters, parse_pod(raw_pod("web", labels={"app": "web"})),
                                       nodes).verdicts)
    assert verdicts["n0"].reasons == ("node(s) didn't satisfy existing pods anti-affinity rules",)
    assert text(verdicts["n0"]) == "team/loner (on n0) keeps pods like this one out of zone=a (its anti-affinity)"


class Picky:
    """A custom filter without figures."""

    name = "Picky"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        return FilterResult(mask=np.array([name != "n0" for name in nodes.names]))


def test_a_filter_without_figures_or_reasons_is_reported_as_the_worker_counts_it() -> None:
    nodes = table(raw_node("n0"), raw_node("n1"))
    verdict = by_node(explain_filters([Picky()], parse_pod(raw_pod("web")), nodes).verdicts)["n0"]
    assert (verdict.filter, verdict.reasons, verdict.figures) == ("Picky", ("node(s) didn't pass Picky",), None)
    assert run_filters([Picky()], parse_pod(raw_pod("web")), nodes)[1] == {"node(s) didn't pass Picky": 1}


def test_score_parts_add_up_to_the_workers_total_on_the_feasible_nodes() -> None:
    nodes = table(*(raw_node(f"n{i}", labels={"zone": "a" if i % 2 else "b"}) for i in range(6)))
    for i in range(6):
        use(nodes, f"n{i}", cpu=1000 * i, memory=(i % 3) << 30)
    raw: Json = raw_pod("web", {"cpu": "1", "memory": "1Gi"}, labels={"app": "web"})
    raw["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}
    pod = parse_pod(raw)
    profile = default_profile()
    evaluation = evaluate(profile, pod, nodes)
    parts = score_parts(profile, pod, nodes, evaluation.feasible)
    assert {"NodeAffinity", "LeastAllocated"} <= parts.keys()
    total = sum(parts.values())
    assert np.allclose(np.asarray(total)[evaluation.feasible], evaluation.scores[evaluation.feasible])

