"""Each built-in plugin against small hand-built node tables, with kube-scheduler's reason texts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hoss.framework.cycle import FilterResult
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins import FILTERS, SCORES, load_registry
from hoss.framework.plugins.affinity import NodeAffinity
from hoss.framework.plugins.binpack import MostAllocated
from hoss.framework.plugins.fit import NodeResourcesFit
from hoss.framework.plugins.spread import LeastAllocated
from hoss.framework.plugins.taints import NodeUnschedulable, TaintToleration
from tests.kube_objects import CPU_NODE, GPU_NODE, Json, pod_view, raw_node, table

GPU = "nvidia.com/gpu"
Gi = 2**30


def passing(result: FilterResult, nodes: NodeTable) -> list[str]:
    return [name for name, ok in zip(nodes.names, result.mask, strict=True) if ok]


def marked(result: FilterResult, nodes: NodeTable) -> dict[str, list[str]]:
    return {
        reason: [name for name, hit in zip(nodes.names, mask, strict=True) if hit]
        for reason, mask in result.reasons.items()
    }


# --- NodeResourcesFit -------------------------------------------------------------------------------------------


def test_gpu_pod_fits_only_gpu_nodes_with_free_gpus() -> None:
    nodes = table(raw_node("cpu-1"), raw_node("gpu-1", GPU_NODE), raw_node("gpu-full", GPU_NODE))
    nodes.set_used("gpu-full", {GPU: 7, "pods": 3})
    pod = pod_view(requests={"cpu": "4", GPU: "2"})

    result = NodeResourcesFit().filter(pod, nodes)

    assert passing(result, nodes) == ["gpu-1"]
    assert marked(result, nodes) == {f"Insufficient {GPU}": ["cpu-1", "gpu-full"]}


def test_node_short_of_two_resources_carries_both_reasons() -> None:
    nodes = table(raw_node("small", {"cpu": "2", "memory": "4Gi", "pods": "110"}), raw_node("big"))
    pod = pod_view(requests={"cpu": "3", "memory": "8Gi"})

    result = NodeResourcesFit().filter(pod, nodes)

    assert passing(result, nodes) == ["big"]
    assert marked(result, nodes) == {"Insufficient cpu": ["small"], "Insufficient memory": ["small"]}


def test_hugepages_are_checked_like_any_resource() -> None:
    nodes = table(
        raw_node("huge", {**CPU_NODE, "hugepages-2Mi": "1Gi"}),
        raw_node("tight", {**CPU_NODE, "hugepages-2Mi": "256Mi"}),
        raw_node("none"),
    )
    pod = pod_view(requests={"cpu": "1", "hugepages-2Mi": "512Mi"})

    result = NodeResourcesFit().filter(pod, nodes)

    assert passing(result, nodes) == ["huge"]
    assert marked(result, nodes) == {"Insufficient hugepages-2Mi": ["tight", "none"]}


def test_full_pod_count_reads_too_many_pods() -> None:
    nodes = table(raw_node("busy", {**CPU_NODE, "pods": "2"}), raw_node("idle"))
    nodes.set_used("busy", {"pods": 2, "cpu": 100})

    result = NodeResourcesFit().filter(pod_view(), nodes)

    assert passing(result, nodes) == ["idle"]
    assert marked(result, nodes) == {"Too many pods": ["busy"]}


def test_fit_follows_usage_as_the_ledger_reports_it() -> None:
    nodes = table(raw_node("a", {"cpu": "4", "memory": "8Gi", "pods": "110"}))
    pod = pod_view(requests={"cpu": "2"})
    fit = NodeResourcesFit()

    nodes.set_used("a", {"cpu": 3000})
    assert passing(fit.filter(pod, nodes), nodes) == []
    nodes.sub_used("a", {"cpu": 1000})
    assert passing(fit.filter(pod, nodes), nodes) == ["a"]
    nodes.add_used("a", {"cpu": 1})
    assert passing(fit.filter(pod, nodes), nodes) == []


def test_pod_fits_exactly_the_remaining_room() -> None:
    nodes = table(raw_node("a", {"cpu": "4", "memory": "8Gi", "pods": "110"}))
    nodes.set_used("a", {"cpu": 2000, "memory": 6 * Gi, "pods": 5})

    result = NodeResourcesFit().filter(pod_view(requests={"cpu": "2", "memory": "2Gi"}), nodes)

    assert passing(result, nodes) == ["a"]


# --- NodeAffinity ------------------------------------------------------------------------------------------------


def zoned_nodes() -> NodeTable:
    return table(
        raw_node("a", labels={"zone": "a", "gen": "3", "ssd": ""}),
        raw_node("b", labels={"zone": "b", "gen": "5"}),
        raw_node("c", labels={"zone": "c", "gen": "latest"}),
        raw_node("bare"),
    )


def expression(key: str, operator: str, *values: str) -> Json:
    requirement: Json = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return requirement


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        (expression("zone", "In", "a", "c", "nowhere"), ["a", "c"]),
        (expression("zone", "NotIn", "a"), ["b", "c", "bare"]),
        (expression("ssd", "Exists"), ["a"]),
        (expression("ssd", "DoesNotExist"), ["b", "c", "bare"]),
        (expression("gen", "Gt", "3"), ["b"]),
        (expression("gen", "Lt", "4"), ["a"]),
        (expression("gen", "Gt", "-1"), ["a", "b"]),
        (expression("unknown-key", "In", "x"), []),
        (expression("unknown-key", "NotIn", "x"), ["a", "b", "c", "bare"]),
    ],
)
def test_match_expression_operators(requirement: Json, expected: list[str]) -> None:
    nodes = zoned_nodes()
    pod = pod_view(terms=[{"matchExpressions": [requirement]}])

    assert passing(NodeAffinity().filter(pod, nodes), nodes) == expected


def test_node_selector_needs_every_label() -> None:
    nodes = zoned_nodes()
    pod = pod_view(node_selector={"zone": "b", "gen": "5"})

    result = NodeAffinity().filter(pod, nodes)

    assert passing(result, nodes) == ["b"]
    assert marked(result, nodes) == {"node(s) didn't match Pod's node affinity/selector": ["a", "c", "bare"]}


def test_terms_are_ored_and_expressions_in_a_term_anded() -> None:
    nodes = zoned_nodes()
    pod = pod_view(
        terms=[
            {"matchExpressions": [expression("zone", "In", "a", "b"), expression("gen", "Gt", "4")]},
            {"matchExpressions": [expression("zone", "In", "c")]},
        ]
    )

    assert passing(NodeAffinity().filter(pod, nodes), nodes) == ["b", "c"]


def test_selector_and_affinity_must_both_hold() -> None:
    nodes = zoned_nodes()
    pod = pod_view(node_selector={"gen": "3"}, terms=[{"matchExpressions": [expression("zone", "In", "a", "b")]}])

    assert passing(NodeAffinity().filter(pod, nodes), nodes) == ["a"]


def test_empty_term_matches_no_node() -> None:
    nodes = zoned_nodes()

    assert passing(NodeAffinity().filter(pod_view(terms=[{}]), nodes), nodes) == []


@pytest.mark.parametrize(
    ("operator", "expected"),
    [("In", ["b", "bare"]), ("NotIn", ["a", "c"])],
)
def test_match_fields_on_node_name(operator: str, expected: list[str]) -> None:
    nodes = zoned_nodes()
    pod = pod_view(terms=[{"matchFields": [{"key": "metadata.name", "operator": operator, "values": ["b", "bare"]}]}])

    assert passing(NodeAffinity().filter(pod, nodes), nodes) == expected


def test_selector_sees_relabelled_and_removed_nodes() -> None:
    nodes = zoned_nodes()
    nodes.upsert_node(raw_node("a", labels={"zone": "b"}))
    nodes.remove_node("b")
    pod = pod_view(node_selector={"zone": "b"})

    assert passing(NodeAffinity().filter(pod, nodes), nodes) == ["a"]


# --- TaintToleration and NodeUnschedulable ----------------------------------------------------------------------

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
DRAINING = {"key": "draining", "effect": "NoExecute"}
SOFT = {"key": "spot", "value": "true", "effect": "PreferNoSchedule"}


def tainted_nodes() -> NodeTable:
    return table(
        raw_node("gpu", taints=[GPU_TAINT]),
        raw_node("draining", taints=[DRAINING, GPU_TAINT]),
        raw_node("spot", taints=[SOFT]),
        raw_node("clean"),
    )


def test_untolerated_taints_reject_with_the_first_taint_named() -> None:
    nodes = tainted_nodes()

    result = TaintToleration().filter(pod_view(), nodes)

    assert passing(result, nodes) == ["spot", "clean"]
    assert marked(result, nodes) == {
        "node(s) had untolerated taint {nvidia.com/gpu: present}": ["gpu"],
        "node(s) had untolerated taint {draining: }": ["draining"],
    }


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}, ["gpu"]),
        ({"key": "nvidia.com/gpu", "value": "present"}, ["gpu"]),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, ["gpu"]),
        ({"key": "nvidia.com/gpu", "value": "absent"}, []),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, []),
        ({"operator": "Exists"}, ["gpu", "draining"]),
        ({"operator": "Exists", "effect": "NoSchedule"}, ["gpu"]),
    ],
)
def test_tolerations(toleration: dict[str, str], expected: list[str]) -> None:
    nodes = tainted_nodes()

    result = TaintToleration().filter(pod_view(tolerations=[toleration]), nodes)

    assert passing(result, nodes) == [*expected, "spot", "clean"]


def test_tolerating_the_first_taint_reports_the_next_one() -> None:
    nodes = tainted_nodes()

    result = TaintToleration().filter(pod_view(tolerations=[{"key": "draining", "operator": "Exists"}]), nodes)

    assert marked(result, nodes) == {"node(s) had untolerated taint {nvidia.com/gpu: present}": ["gpu", "draining"]}


def test_cordoned_node_is_unschedulable_unless_tolerated() -> None:
    nodes = table(raw_node("cordoned", unschedulable=True), raw_node("open"))
    toleration = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}

    plain = NodeUnschedulable().filter(pod_view(), nodes)
    tolerant = NodeUnschedulable().filter(pod_view(tolerations=[toleration]), nodes)

    assert passing(plain, nodes) == ["open"]
    assert marked(plain, nodes) == {"node(s) were unschedulable": ["cordoned"]}
    assert passing(tolerant, nodes) == ["cordoned", "open"]


def test_uncordoned_node_becomes_schedulable() -> None:
    nodes = table(raw_node("n", unschedulable=True))
    nodes.upsert_node(raw_node("n"))

    assert passing(NodeUnschedulable().filter(pod_view(), nodes), nodes) == ["n"]


# --- LeastAllocated and MostAllocated ---------------------------------------------------------------------------


def scored(plugin: Any, pod_requests: dict[str, str], nodes: NodeTable) -> dict[str, float]:
    pod = pod_view(requests=pod_requests)
    feasible = np.ones(len(nodes), dtype=np.bool_)
    raw = plugin.score(pod, nodes, feasible)
    return {
        name: round(float(score), 6) for name, score in zip(nodes.names, plugin.normalize(raw, feasible), strict=True)
    }


def four_cpu_nodes() -> NodeTable:
    nodes = table(*(raw_node(name, {"cpu": "4", "memory": "16Gi", "pods": "110"}) for name in ("empty", "half")))
    nodes.set_used("half", {"cpu": 2000, "memory": 8 * Gi})
    return nodes


def test_least_allocated_is_the_share_left_free() -> None:
    # empty: cpu (4-1)/4 = 75, memory (16-4)/16 = 75; half: cpu (4-2-1)/4 = 25, memory (16-8-4)/16 = 25.
    scores = scored(LeastAllocated.from_args({}), {"cpu": "1", "memory": "4Gi"}, four_cpu_nodes())

    assert scores == {"empty": 75.0, "half": 25.0}


def test_most_allocated_is_the_share_in_use() -> None:
    scores = scored(MostAllocated.from_args({}), {"cpu": "1", "memory": "4Gi"}, four_cpu_nodes())

    assert scores == {"empty": 25.0, "half": 75.0}


def test_resource_weights_shape_the_average() -> None:
    # cpu weight 3: empty (3*25 + 1*0)/4 = 18.75 for a pod asking 1 cpu and no memory.
    scores = scored(MostAllocated.from_args({"resources": {"cpu": 3, "memory": 1}}), {"cpu": "1"}, four_cpu_nodes())

    assert scores["empty"] == 18.75


def test_gpus_count_only_for_pods_that_ask_for_them() -> None:
    nodes = table(raw_node("gpu", {"cpu": "10", "memory": "10Gi", "pods": "110", GPU: "8"}))
    nodes.set_used("gpu", {GPU: 6})
    binpack = MostAllocated.from_args({"resources": {"cpu": 1, GPU: 1}})

    # GPU pod: cpu 10%, gpu (6+2)/8 = 100% -> 55. CPU pod: GPUs are not its business -> cpu 10%.
    assert scored(binpack, {"cpu": "1", GPU: "2"}, nodes) == {"gpu": 55.0}
    assert scored(binpack, {"cpu": "1"}, nodes) == {"gpu": 10.0}


def test_resource_a_node_lacks_does_not_count_for_it() -> None:
    nodes = table(raw_node("gpu", {"cpu": "10", "memory": "10Gi", GPU: "4"}), raw_node("cpu", {"cpu": "10"}))
    spread = LeastAllocated.from_args({"resources": {"cpu": 1, GPU: 1}})

    # gpu node: cpu 80, gpu 75 -> 77.5; cpu node: only cpu counts -> 80.
    assert scored(spread, {"cpu": "2", GPU: "1"}, nodes) == {"gpu": 77.5, "cpu": 80.0}


def test_overfull_node_scores_the_extremes() -> None:
    nodes = table(raw_node("over", {"cpu": "2", "memory": "2Gi"}))
    nodes.set_used("over", {"cpu": 3000, "memory": 3 * Gi})

    assert scored(LeastAllocated.from_args({}), {"cpu": "1", "memory": "1Gi"}, nodes) == {"over": 0.0}
    assert scored(MostAllocated.from_args({}), {"cpu": "1", "memory": "1Gi"}, nodes) == {"over": 100.0}


# --- Registry ---------------------------------------------------------------------------------------------------


def test_every_built_in_plugin_is_registered_under_its_kind() -> None:
    registry = load_registry()

    assert sorted(FILTERS) == ["DynamicResources", "InterPodAffinity", "NodeAffinity", "NodePool", "NodePorts",
                               "NodeResourcesFit", "NodeUnschedulable", "NodeVolumeLimits", "PodTopologySpread",
                               "TaintToleration", "VolumeBinding", "VolumeRestrictions", "VolumeZone"]
    assert sorted(SCORES) == ["CpuOffGpuNodes", "GpuPacking", "InterPodAffinity", "LeastAllocated", "MostAllocated",
                              "NodeAffinity", "PodTopologySpread", "TaintToleration"]
    assert all(build({}).name == name for name, build in registry.filters.items())
    assert all(build({}).name == name for name, build in registry.scores.items())
