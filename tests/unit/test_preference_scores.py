"""NodeAffinity preferred terms and TaintToleration PreferNoSchedule as scores, against hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from hoss.errors import PodSpecError
from hoss.framework.cycle import Profile, decide, default_normalize, evaluate
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.affinity import NodeAffinity
from hoss.framework.plugins.spread import LeastAllocated
from hoss.framework.plugins.taints import TaintToleration
from hoss.framework.pod import PodView, parse_pod
from tests.kube_objects import Json, pod_view, raw_node, raw_pod, table


def preferring(*terms: tuple[int, Json]) -> PodView:
    pod = raw_pod("p")
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": weight, "preference": preference} for weight, preference in terms
    ]}}
    return parse_pod(pod)


def zone(*values: str) -> Json:
    return {"matchExpressions": [{"key": "zone", "operator": "In", "values": list(values)}]}


def disk(value: str) -> Json:
    return {"matchExpressions": [{"key": "disk", "operator": "In", "values": [value]}]}


def nodes() -> NodeTable:
    return table(
        raw_node("a", labels={"zone": "z1", "disk": "ssd"}),
        raw_node("b", labels={"zone": "z1", "disk": "hdd"}),
        raw_node("c", labels={"zone": "z2", "disk": "ssd"}),
        raw_node("d", labels={"zone": "z3"}),
    )


def normalized(plugin: NodeAffinity | TaintToleration, pod: PodView, table_: NodeTable,
               feasible: list[bool] | None = None) -> dict[str, float]:
    mask = np.array(feasible if feasible is not None else [True] * len(table_), dtype=np.bool_)
    scores = plugin.normalize(plugin.score(pod, table_, mask), mask)
    return {name: float(scores[row]) for row, name in enumerate(table_.names) if mask[row]}


def test_preferred_terms_sum_the_weights_each_node_matches_and_scale_to_the_best() -> None:
    # raw: a = 80 (zone z1) + 20 (ssd) = 100, b = 80, c = 20, d = 0; max 100.
    pod = preferring((80, zone("z1")), (20, disk("ssd")))
    assert normalized(NodeAffinity(), pod, nodes()) == {"a": 100, "b": 80, "c": 20, "d": 0}


def test_preferred_scores_use_go_integer_division() -> None:
    # raw: a = 3 + 2 = 5 (max), b = 3, c = 2, d = 0 -> 100*3//5 = 60, 100*2//5 = 40; and 100*1//3 = 33 below.
    pod = preferring((3, zone("z1")), (2, disk("ssd")))
    assert normalized(NodeAffinity(), pod, nodes()) == {"a": 100, "b": 60, "c": 40, "d": 0}
    thirds = preferring((1, zone("z2")), (2, zone("z1")))
    assert normalized(NodeAffinity(), thirds, nodes()) == {"a": 100, "b": 100, "c": 50, "d": 0}
    assert default_normalize(np.array([1.0, 3.0]), np.array([True, True])).tolist() == [33.0, 100.0]


def test_normalisation_runs_over_feasible_nodes_only() -> None:
    # a (the best match) is infeasible: b's 80 is now the max.
    pod = preferring((80, zone("z1")), (20, disk("ssd")))
    assert normalized(NodeAffinity(), pod, nodes(), [False, True, True, True]) == {"b": 100, "c": 25, "d": 0}


def test_no_preference_or_no_match_scores_every_node_zero() -> None:
    assert set(normalized(NodeAffinity(), pod_view("p"), nodes()).values()) == {0}
    assert set(normalized(NodeAffinity(), preferring((50, zone("nowhere"))), nodes()).values()) == {0}


def test_an_empty_preferred_term_matches_nothing() -> None:
    assert set(normalized(NodeAffinity(), preferring((50, {})), nodes()).values()) == {0}


def test_preferred_weight_out_of_range_is_a_malformed_pod() -> None:
    with pytest.raises(PodSpecError, match=r"preferredDuringSchedulingIgnoredDuringExecution\[0\]\.weight"):
        preferring((0, zone("z1")))


def prefer_no(key: str, value: str = "") -> dict[str, str]:
    return {"key": key, "value": value, "effect": "PreferNoSchedule"}


def tainted() -> NodeTable:
    return table(
        raw_node("clean"),
        raw_node("one", taints=[prefer_no("spot")]),
        raw_node("two", taints=[prefer_no("spot"), prefer_no("old-kernel")]),
        raw_node("hard", taints=[{"key": "spot", "value": "", "effect": "NoSchedule"}]),
    )


def test_prefer_no_schedule_taints_are_counted_and_normalised_in_reverse() -> None:
    # raw counts: clean 0, one 1, two 2 (max), hard 0 (a NoSchedule taint is the filter's business) ->
    # 100 - 100*count//2: clean 100, one 50, two 0, hard 100.
    assert normalized(TaintToleration(), pod_view("p"), tainted()) == {"clean": 100, "one": 50, "two": 0, "hard": 100}


def test_only_tolerations_for_prefer_no_schedule_or_every_effect_count() -> None:
    # Tolerating spot with effect NoSchedule does not help; with an empty effect it does: counts 0, 0, 1 -> max 1.
    no_schedule = pod_view("p", tolerations=[{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}])
    assert normalized(TaintToleration(), no_schedule, tainted()) == {"clean": 100, "one": 50, "two": 0, "hard": 100}
    any_effect = pod_view("p", tolerations=[{"key": "spot", "operator": "Exists"}])
    assert normalized(TaintToleration(), any_effect, tainted()) == {"clean": 100, "one": 100, "two": 0, "hard": 100}


def test_without_prefer_no_schedule_taints_every_feasible_node_scores_100() -> None:
    assert set(normalized(TaintToleration(), pod_view("p"), nodes()).values()) == {100}


def test_kube_scheduler_default_weights_make_a_preference_outweigh_spreading() -> None:
    # LeastAllocated alone would pick the emptier node "b"; NodeAffinity (weight 2) and TaintToleration (weight 3)
    # prefer "a" and keep off the PreferNoSchedule node "c".
    cluster = table(
        raw_node("a", labels={"zone": "z1"}),
        raw_node("b", labels={"zone": "z2"}),
        raw_node("c", labels={"zone": "z1"}, taints=[prefer_no("spot")]),
    )
    cluster.set_used("a", {"cpu": 16000, "memory": 64 * 2**30})
    profile = Profile(name="default", filters=[], scores=[
        (NodeAffinity(), 2), (TaintToleration(), 3), (LeastAllocated.from_args({}), 1)])
    pod = preferring((10, zone("z1")))
    evaluation = evaluate(profile, pod, cluster)
    by_node = dict(zip(cluster.names, evaluation.scores.tolist(), strict=True))
    assert by_node["a"] > by_node["b"] and by_node["a"] > by_node["c"]
    decision = decide(profile, pod, cluster, rng=np.random.default_rng(1))
    assert decision.candidates[0] == "a"  # type: ignore[union-attr]
