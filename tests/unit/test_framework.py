"""decide(): feasibility, kube-scheduler's unschedulable message, ranking, tie-breaking; the node table and pod view.

Everything is pure: hand-built node tables and raw pods, no Redis and no apiserver.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hoss.errors import NodeSpecError, PodSpecError
from hoss.framework.cycle import (
    BoolArray,
    FilterPlugin,
    FilterResult,
    FloatArray,
    Placement,
    Profile,
    Unschedulable,
    choose,
    decide,
    evaluate,
    min_max_normalize,
)
from hoss.framework.errors import PluginError, UnknownNodeError
from hoss.framework.node import Taint, parse_node
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.affinity import NodeAffinity
from hoss.framework.plugins.binpack import MostAllocated
from hoss.framework.plugins.fit import NodeResourcesFit
from hoss.framework.plugins.spread import LeastAllocated
from hoss.framework.plugins.taints import NodeUnschedulable, TaintToleration
from hoss.framework.pod import PodView, parse_pod
from tests.kube_objects import CPU_NODE, GPU_NODE, Json, pod_view, raw_node, raw_pod, table

GPU = "nvidia.com/gpu"
Gi = 2**30
FILTERS: list[FilterPlugin] = [NodeUnschedulable(), TaintToleration(), NodeAffinity(), NodeResourcesFit()]
SPREAD = Profile(name="default", filters=FILTERS, scores=[(LeastAllocated.from_args({}), 1)])
BINPACK = Profile(
    name="binpack",
    filters=FILTERS,
    scores=[(MostAllocated.from_args({"resources": {"cpu": 1, "memory": 1, GPU: 1}}), 1)],
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def placed(decision: Placement | Unschedulable) -> Placement:
    assert isinstance(decision, Placement), decision
    return decision


def refused(decision: Placement | Unschedulable) -> Unschedulable:
    assert isinstance(decision, Unschedulable), decision
    return decision


# --- Unschedulable ---------------------------------------------------------------------------------------------


def test_mixed_rejections_read_exactly_like_kube_scheduler() -> None:
    gpu_nodes = [raw_node(f"gpu-{i}", GPU_NODE, labels={"accelerator": "a100"}) for i in range(30)]
    cpu_nodes = [raw_node(f"cpu-{i}", CPU_NODE) for i in range(20)]
    nodes = table(*gpu_nodes, *cpu_nodes)
    for i in range(30):
        nodes.set_used(f"gpu-{i}", {GPU: 8, "pods": 4})
    pod = pod_view(requests={"cpu": "1", GPU: "1"}, node_selector={"accelerator": "a100"})

    decision = refused(decide(SPREAD, pod, nodes, rng=rng()))

    assert decision.message == (
        "0/50 nodes are available: 20 node(s) didn't match Pod's node affinity/selector, "
        "30 Insufficient nvidia.com/gpu."
    )
    assert decision.reasons == {
        "node(s) didn't match Pod's node affinity/selector": 20,
        "Insufficient nvidia.com/gpu": 30,
    }


def test_node_is_counted_under_the_first_filter_that_rejects_it() -> None:
    # The cordoned node is also too small; kube-scheduler stops at NodeUnschedulable and reports only that.
    nodes = table(
        raw_node("cordoned", {"cpu": "1", "memory": "1Gi", "pods": "110"}, unschedulable=True),
        raw_node("small", {"cpu": "1", "memory": "1Gi", "pods": "110"}),
        raw_node("tainted", taints=[{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]),
    )

    decision = refused(decide(SPREAD, pod_view(requests={"cpu": "2", "memory": "2Gi"}), nodes, rng=rng()))

    assert decision.message == (
        "0/3 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 node(s) had untolerated taint "
        "{dedicated: infra}, 1 node(s) were unschedulable."
    )


def test_no_nodes_at_all() -> None:
    decision = refused(decide(SPREAD, pod_view(), NodeTable(), rng=rng()))

    assert decision.message == "no nodes available to schedule pods"


class _RejectsWithoutReason:
    name = "Silent"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        return FilterResult(mask=np.zeros(len(nodes), dtype=np.bool_))


def test_rejection_without_a_reason_is_still_counted() -> None:
    profile = Profile(name="odd", filters=[_RejectsWithoutReason()], scores=[])

    decision = refused(decide(profile, pod_view(), table(raw_node("a"), raw_node("b")), rng=rng()))

    assert decision.message == "0/2 nodes are available: 2 node(s) didn't pass Silent."


class _ShortFilter:
    name = "Short"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        return FilterResult(mask=np.ones(1, dtype=np.bool_))


def test_plugin_returning_the_wrong_shape_is_an_error() -> None:
    profile = Profile(name="broken", filters=[_ShortFilter()], scores=[])

    with pytest.raises(PluginError, match="Short"):
        decide(profile, pod_view(), table(raw_node("a"), raw_node("b")), rng=rng())


# --- Placement and ranking -------------------------------------------------------------------------------------


def loaded_nodes() -> NodeTable:
    """Four 10-cpu nodes at 0, 2, 5 and 8 cpus used, and one full node."""
    nodes = table(*(raw_node(name, {"cpu": "10", "memory": "40Gi", "pods": "110"}) for name in "abcde"))
    for name, cpus in zip("abcde", (0, 2, 5, 8, 10), strict=True):
        nodes.set_used(name, {"cpu": cpus * 1000, "memory": cpus * 4 * Gi})
    return nodes


def test_spread_prefers_the_emptiest_node_and_binpack_the_fullest_that_fits() -> None:
    nodes = loaded_nodes()
    pod = pod_view(requests={"cpu": "1", "memory": "4Gi"})

    spread = placed(decide(SPREAD, pod, nodes, rng=rng()))
    binpack = placed(decide(BINPACK, pod, nodes, rng=rng()))

    assert spread.candidates == ["a", "b", "c", "d"]
    assert binpack.candidates == ["d", "c", "b", "a"]
    assert spread.feasible == binpack.feasible == 4
    assert binpack.scores == sorted(binpack.scores, reverse=True)
    assert binpack.scores[0] == pytest.approx(90.0, abs=1e-5)


def test_candidates_are_the_best_few_in_order() -> None:
    nodes = table(*(raw_node(f"n{i:02}", {"cpu": "100", "memory": "100Gi", "pods": "110"}) for i in range(40)))
    for i in range(40):
        nodes.set_used(f"n{i:02}", {"cpu": i * 1000, "memory": i * Gi})

    decision = placed(decide(BINPACK, pod_view(), nodes, rng=rng(), top=3))

    assert decision.candidates == ["n39", "n38", "n37"]
    assert decision.feasible == 40


def test_binpack_sends_gpu_pods_to_the_node_with_fewest_gpus_left() -> None:
    nodes = table(*(raw_node(f"gpu-{i}", GPU_NODE) for i in range(3)))
    nodes.set_used("gpu-0", {GPU: 2})
    nodes.set_used("gpu-1", {GPU: 6})
    nodes.set_used("gpu-2", {GPU: 7})

    decision = placed(decide(BINPACK, pod_view(requests={"cpu": "1", GPU: "2"}), nodes, rng=rng()))

    assert decision.candidates == ["gpu-1", "gpu-0"]


class _FreeCpuScore:
    """A score plugin without its own normalize: raw free cpu."""

    name = "FreeCpu"

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        return nodes.free_column("cpu").astype(np.float64)


def test_scores_without_normalize_are_min_max_scaled_then_weighted() -> None:
    nodes = loaded_nodes()
    profile = Profile(name="custom", filters=FILTERS, scores=[(_FreeCpuScore(), 2)])

    decision = placed(decide(profile, pod_view(), nodes, rng=rng(), tie_break=0.0))

    # Free cpu 10, 8, 5, 2 over the feasible nodes -> 100, 75, 37.5, 0, times weight 2.
    assert decision.scores == [200.0, 150.0, 75.0, 0.0]


def test_min_max_normalize_gives_100_when_all_feasible_scores_are_equal() -> None:
    scores = np.array([3.0, 3.0, -50.0])
    feasible = np.array([True, True, False])

    assert min_max_normalize(scores, feasible).tolist() == [100.0, 100.0, 0.0]


# --- Evaluate and choose ---------------------------------------------------------------------------------------


def test_decide_is_evaluate_then_choose() -> None:
    nodes = loaded_nodes()
    pod = pod_view(requests={"cpu": "1", "memory": "4Gi"})

    evaluation = evaluate(BINPACK, pod, nodes)

    assert evaluation.feasible.tolist() == [True, True, True, True, False]
    assert evaluation.reasons == {"Insufficient cpu": 1, "Insufficient memory": 1}
    assert choose(evaluation, nodes, rng=rng(3), top=2) == decide(BINPACK, pod, nodes, rng=rng(3), top=2)


def test_restricted_evaluation_chooses_among_the_allowed_and_reports_the_others() -> None:
    nodes = loaded_nodes()
    evaluation = evaluate(BINPACK, pod_view(requests={"cpu": "1", "memory": "4Gi"}), nodes)
    allowed = np.array([True, True, False, False, False])

    decision = placed(choose(evaluation.restricted(allowed), nodes, rng=rng()))
    none = np.zeros(5, dtype=np.bool_)
    nothing = refused(choose(evaluation.restricted(none, {"node(s) were busy": 4}), nodes, rng=rng()))

    assert decision.candidates == ["b", "a"]
    assert nothing.message == (
        "0/5 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 4 node(s) were busy."
    )


def test_infeasible_pod_is_not_scored() -> None:
    class _Exploding:
        name = "Exploding"

        def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
            raise AssertionError("scored a pod that fits nowhere")

    profile = Profile(name="p", filters=FILTERS, scores=[(_Exploding(), 1)])

    evaluation = evaluate(profile, pod_view(requests={"cpu": "64"}), loaded_nodes())

    assert not evaluation.feasible.any()


class _ShortNormalize:
    name = "ShortNormalize"

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        return np.zeros(len(nodes))

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return scores[:1]


def test_normalize_returning_the_wrong_shape_is_an_error() -> None:
    profile = Profile(name="broken", filters=FILTERS, scores=[(_ShortNormalize(), 1)])

    with pytest.raises(PluginError, match="ShortNormalize"):
        decide(profile, pod_view(), loaded_nodes(), rng=rng())


# --- Tie-breaking ----------------------------------------------------------------------------------------------


def identical_nodes(count: int = 16) -> NodeTable:
    return table(*(raw_node(f"n{i:02}", {"cpu": "8", "memory": "32Gi", "pods": "110"}) for i in range(count)))


def test_workers_with_different_seeds_break_ties_differently() -> None:
    nodes = identical_nodes()
    first, second = rng(1), rng(2)

    picks = [
        (
            placed(decide(BINPACK, pod_view(f"p{i}"), nodes, rng=first)).candidates[0],
            placed(decide(BINPACK, pod_view(f"p{i}"), nodes, rng=second)).candidates[0],
        )
        for i in range(5)
    ]

    assert any(a != b for a, b in picks)
    assert len({a for a, _ in picks}) > 1


def test_same_seed_decides_the_same() -> None:
    nodes = identical_nodes()

    assert placed(decide(BINPACK, pod_view(), nodes, rng=rng(7))).candidates == (
        placed(decide(BINPACK, pod_view(), nodes, rng=rng(7))).candidates
    )


def test_jitter_never_reorders_different_scores() -> None:
    nodes = loaded_nodes()
    pod = pod_view(requests={"cpu": "1", "memory": "4Gi"})

    orders = {tuple(placed(decide(BINPACK, pod, nodes, rng=rng(seed))).candidates) for seed in range(20)}

    assert orders == {("d", "c", "b", "a")}


# --- Scale -----------------------------------------------------------------------------------------------------


def test_deciding_over_20000_nodes_runs_no_python_loop_per_node() -> None:
    nodes = NodeTable()
    for i in range(20_000):
        labels = {"zone": f"z{i % 4}", "kubernetes.io/hostname": f"n{i}"}
        taints = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}] if i % 10 == 0 else []
        nodes.upsert_node(raw_node(f"n{i}", GPU_NODE if i % 5 == 0 else CPU_NODE, labels=labels, taints=taints))
        nodes.set_used(f"n{i}", {"cpu": (i % 32) * 1000, "pods": i % 110})
    pod = pod_view(
        requests={"cpu": "2", "memory": "4Gi"},
        node_selector={"zone": "z1"},
        terms=[{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}]}],
    )

    decide(SPREAD, pod, table(raw_node("warm-up")), rng=rng())  # lazy imports must not count below
    lines = 0

    def count_lines(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return count_lines

    previous = sys.gettrace()
    sys.settrace(count_lines)
    try:
        spread = decide(SPREAD, pod, nodes, rng=rng())
        binpack = decide(BINPACK, pod, nodes, rng=rng())
    finally:
        sys.settrace(previous)

    assert len(placed(spread).candidates) == len(placed(binpack).candidates) == 8
    assert placed(spread).feasible == 4999
    # Both decisions together execute about 1,500 lines of Python; a loop over nodes would add 20,000 each.
    assert lines < 5_000


# --- NodeTable -------------------------------------------------------------------------------------------------

NAMES = st.sampled_from([f"node-{i}" for i in range(6)])
LABELS = st.dictionaries(st.sampled_from(["zone", "rack", "gpu"]), st.sampled_from(["a", "b", "c"]), max_size=3)
TAINTS = st.lists(
    st.builds(
        lambda key, effect: {"key": key, "value": "v", "effect": effect},
        st.sampled_from(["dedicated", "spot"]),
        st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
    ),
    max_size=2,
    unique_by=lambda taint: (taint["key"], taint["effect"]),
)
ALLOC = st.fixed_dictionaries(
    {"cpu": st.integers(1, 64).map(str), "pods": st.integers(1, 110).map(str)},
    optional={GPU: st.integers(1, 8).map(str), "hugepages-1Gi": st.integers(1, 4).map(lambda n: f"{n}Gi")},
)
USED = st.dictionaries(st.sampled_from(["cpu", "pods", GPU, "example.com/fpga"]), st.integers(0, 10_000), max_size=4)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), NAMES, ALLOC, LABELS, TAINTS, st.booleans()),
        st.tuples(st.just("remove"), NAMES),
        st.tuples(st.just("used"), NAMES, USED),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, database=None)
@given(OPERATIONS)
def test_node_table_rows_stay_consistent_through_upserts_removals_and_usage(operations: list[tuple[Any, ...]]) -> None:
    nodes = NodeTable()
    expected: dict[str, tuple[Json, dict[str, int]]] = {}
    for operation in operations:
        kind, name = operation[0], operation[1]
        if kind == "upsert":
            _, _, alloc, labels, taints, cordoned = operation
            node = raw_node(name, alloc, labels=labels, taints=taints, unschedulable=cordoned)
            nodes.upsert_node(node)
            expected[name] = (node, expected[name][1] if name in expected else {})
        elif kind == "remove":
            assert nodes.remove_node(name) == (name in expected)
            expected.pop(name, None)
        elif name in expected:
            nodes.set_used(name, operation[2])
            expected[name] = (expected[name][0], {r: a for r, a in operation[2].items() if a})
        else:
            with pytest.raises(UnknownNodeError):
                nodes.set_used(name, operation[2])
        assert_table_matches(nodes, expected)


def assert_table_matches(nodes: NodeTable, expected: dict[str, tuple[Json, dict[str, int]]]) -> None:
    assert sorted(nodes.names) == sorted(expected)
    assert {name: row for row, name in enumerate(nodes.names)} == nodes.index
    assert nodes.alloc.shape == nodes.used.shape == (len(expected), len(nodes.resources))
    keys = {key for node, _ in expected.values() for key in node["metadata"]["labels"]}
    for name, (raw, used) in expected.items():
        row = nodes.index[name]
        view = parse_node(raw)
        alloc = {r: int(nodes.alloc[row, c]) for c, r in enumerate(nodes.resources) if nodes.alloc[row, c]}
        assert alloc == view.allocatable
        assert nodes.used_of(name) == used
        assert nodes.labels[row] == view.labels
        for key in keys:
            code = int(nodes.label_codes(key)[row])
            assert (nodes.label_values(key)[code] if code >= 0 else None) == view.labels.get(key)
        present = {nodes.taint_kinds[c]: int(p) for c, p in enumerate(nodes.taint_positions[row]) if p >= 0}
        assert present == {taint: position for position, taint in enumerate(view.taints)}
        assert bool(nodes.unschedulable[row]) == view.unschedulable
        assert bool(nodes.ready[row])


def test_usage_survives_a_node_update_and_is_reset_by_removal() -> None:
    nodes = table(raw_node("a"), raw_node("b"))
    nodes.set_used("a", {"cpu": 1500})
    nodes.upsert_node(raw_node("a", labels={"zone": "x"}))
    assert nodes.used_of("a") == {"cpu": 1500}

    nodes.remove_node("a")
    nodes.upsert_node(raw_node("a"))
    assert nodes.used_of("a") == {}


def test_label_values_of_deleted_nodes_are_recoded_away() -> None:
    nodes = NodeTable()
    for i in range(1000):
        nodes.upsert_node(raw_node(f"n{i}", labels={"kubernetes.io/hostname": f"n{i}"}))
        if i >= 3:
            nodes.remove_node(f"n{i - 3}")

    assert len(nodes.label_values("kubernetes.io/hostname")) < 100
    assert {nodes.label_values("kubernetes.io/hostname")[c] for c in nodes.label_codes("kubernetes.io/hostname")} == {
        "n997",
        "n998",
        "n999",
    }


def test_arrays_handed_out_are_read_only() -> None:
    nodes = table(raw_node("a"))

    with pytest.raises(ValueError, match="read-only"):
        nodes.used[0, 0] = 5


def test_removing_an_unknown_node_is_a_no_op() -> None:
    nodes = table(raw_node("a"))

    assert not nodes.remove_node("ghost")
    assert nodes.names == ["a"]


@pytest.mark.parametrize(
    ("node", "field"),
    [
        ({"metadata": {}, "status": {"allocatable": {"cpu": "1"}}}, "metadata.name"),
        ({"metadata": {"name": "n", "labels": {"a": 1}}, "status": {"allocatable": {"cpu": "1"}}}, "metadata.labels.a"),
        (
            {
                "metadata": {"name": "n"},
                "spec": {"taints": [{"key": "k", "effect": "Sometimes"}]},
                "status": {"allocatable": {"cpu": "1"}},
            },
            "spec.taints[0].effect",
        ),
        (
            {"metadata": {"name": "n"}, "spec": {"unschedulable": "yes"}, "status": {"allocatable": {"cpu": "1"}}},
            "spec.unschedulable",
        ),
        ({"metadata": {"name": "n"}, "status": {}}, "status.allocatable"),
    ],
)
def test_malformed_node_names_the_field(node: Json, field: str) -> None:
    with pytest.raises(NodeSpecError) as caught:
        NodeTable().upsert_node(node)

    assert caught.value.field == field


def test_taint_prints_as_kube_scheduler_does() -> None:
    assert str(Taint(key="node.kubernetes.io/not-ready", value="", effect="NoExecute")) == (
        "{node.kubernetes.io/not-ready: }"
    )


# --- PodView ---------------------------------------------------------------------------------------------------


def test_pod_view_reads_what_the_plugins_need() -> None:
    raw = raw_pod(
        "train-0",
        {"cpu": "500m", GPU: "2"},
        labels={"hoss.io/policy": "binpack", "hoss.io/pool": "research"},
        node_selector={"accelerator": "a100"},
        terms=[{"matchExpressions": [{"key": "rack", "operator": "Gt", "values": ["3"]}]}],
        tolerations=[{"key": GPU, "operator": "Exists"}],
    )
    raw["spec"]["priority"] = 1000

    pod = parse_pod(raw)

    assert (pod.uid, pod.key, pod.scheduler_name) == ("uid-train-0", "team/train-0", "hoss")
    assert pod.request == {"cpu": 500, GPU: 2, "pods": 1}
    assert (pod.policy, pod.pool, pod.priority) == ("binpack", "research", 1000)
    assert pod.node_selector == {"accelerator": "a100"}
    assert pod.required_affinity is not None
    assert pod.required_affinity[0].match_expressions[0].values == ("3",)
    assert pod.tolerates(Taint(key=GPU, value="present", effect="NoSchedule"))


def test_pod_without_policy_label_uses_the_default() -> None:
    pod = pod_view()

    assert (pod.policy, pod.pool, pod.required_affinity, pod.tolerations) == (None, None, None, ())


def _with(path: str, value: object) -> Json:
    pod = raw_pod()
    target = pod
    *parents, last = path.split("/")
    for part in parents:
        target = target.setdefault(part, {})
    target[last] = value
    return pod


AFFINITY = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        (_with("metadata/uid", ""), "metadata.uid"),
        (_with("metadata/labels", {"hoss.io/policy": 3}), "metadata.labels.hoss.io/policy"),
        (_with("spec/nodeSelector", ["zone"]), "spec.nodeSelector"),
        (_with("spec/tolerations", [{"key": "k", "operator": "Maybe"}]), "spec.tolerations[0].operator"),
        (_with("spec/tolerations", [{"operator": "Equal", "value": "v"}]), "spec.tolerations[0].operator"),
        (_with("spec/tolerations", [{"key": "k", "operator": "Exists", "value": "v"}]), "spec.tolerations[0].value"),
        (_with("spec/tolerations", [{"key": "k", "effect": "Never"}]), "spec.tolerations[0].effect"),
        (_with("spec/priority", "high"), "spec.priority"),
        (raw_pod(terms=[]), AFFINITY),
        (
            raw_pod(terms=[{"matchExpressions": [{"key": "a", "operator": "Near"}]}]),
            f"{AFFINITY}[0].matchExpressions[0].operator",
        ),
        (
            raw_pod(terms=[{"matchExpressions": [{"key": "a", "operator": "In"}]}]),
            f"{AFFINITY}[0].matchExpressions[0].values",
        ),
        (
            raw_pod(terms=[{"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}]),
            f"{AFFINITY}[0].matchExpressions[0].values",
        ),
        (
            raw_pod(terms=[{"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["ten"]}]}]),
            f"{AFFINITY}[0].matchExpressions[0].values",
        ),
        (
            raw_pod(terms=[{"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}]),
            f"{AFFINITY}[0].matchFields[0].key",
        ),
        (
            raw_pod(terms=[{"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}]),
            f"{AFFINITY}[0].matchFields[0].operator",
        ),
        (raw_pod(requests={"cpu": "-1"}), "spec.containers[0].resources.requests.cpu"),
    ],
)
def test_malformed_pod_names_the_field(pod: Json, field: str) -> None:
    with pytest.raises(PodSpecError) as caught:
        parse_pod(pod)

    assert caught.value.field == field
