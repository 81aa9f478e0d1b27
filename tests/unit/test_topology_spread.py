"""PodTopologySpread (filter and score) and InterPodAffinity's score against hand-worked cases, kube-scheduler's
edge cases included (minDomains, nodes lacking the key, matchLabelKeys, inclusion policies), and the ledger's
rule for a batch whose tentative pod was refused."""

from __future__ import annotations

import numpy as np
import pytest

from hoss.errors import PodSpecError
from hoss.framework.cycle import evaluate
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.interpod import InterPodAffinity
from hoss.framework.plugins.topology import CONSTRAINTS_NOT_MATCH, MISSING_LABEL, PodTopologySpread
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import parse_placed
from hoss.framework.profiles import load_profiles
from hoss.ledger.arguments import BatchPod, NodeRow
from hoss.ledger.client import Ledger
from hoss.ledger.results import Conflict, Reserved
from hoss.model import compact
from hoss.queue import GangMember, WorkItem
from tests.kube_objects import Json, node_row, raw_node, raw_pod, table
from workers.arguments import inter_pod_keys
from workers.intake import parse_work

HOST = "kubernetes.io/hostname"
ZONE = "zone"
WEB = {"app": "web"}


def constraint(key: str = ZONE, *, skew: int = 1, hard: bool = True, **extra: object) -> Json:
    return {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
            "labelSelector": {"matchLabels": WEB}, **extra}


def spread_pod(name: str, *constraints: Json, labels: dict[str, str] | None = None, namespace: str = "team",
               node_selector: dict[str, str] | None = None) -> PodView:
    raw = raw_pod(name, labels=WEB if labels is None else labels, namespace=namespace, node_selector=node_selector)
    raw["spec"]["topologySpreadConstraints"] = list(constraints)
    return parse_pod(raw)


def cluster(**extra_labels: dict[str, str]) -> NodeTable:
    # zone a: n1, n2; zone b: n3; zone c: n4; n5 has no zone label.
    nodes = []
    for i, zone in ((1, "a"), (2, "a"), (3, "b"), (4, "c"), (5, "")):
        labels = {HOST: f"n{i}", **({ZONE: zone} if zone else {}), **extra_labels.get(f"n{i}", {})}
        nodes.append(raw_node(f"n{i}", labels=labels))
    return table(*nodes)


_uids = iter(range(10_000))


def running(nodes: NodeTable, node: str, count: int = 1, *, labels: dict[str, str] | None = None,
            namespace: str = "team", raw: Json | None = None) -> None:
    for _ in range(count):
        pod = raw or raw_pod(f"p{next(_uids)}", labels=WEB if labels is None else labels, namespace=namespace)
        pod["metadata"]["uid"] = f"uid-{next(_uids)}"
        _ports, meta = compact.pod_meta(pod)
        nodes.place_pod(parse_placed(pod["metadata"]["uid"], node, meta))


def verdict(pod: PodView, nodes: NodeTable) -> dict[str, str]:
    result = PodTopologySpread().filter(pod, nodes)
    out = {}
    for row, name in enumerate(nodes.names):
        reasons = [reason for reason, marked in result.reasons.items() if marked[row]]
        assert len(reasons) <= 1
        out[name] = "" if result.mask[row] else reasons[0]
    return out


def normalized(plugin: PodTopologySpread | InterPodAffinity, pod: PodView, nodes: NodeTable) -> dict[str, float]:
    feasible = np.ones(len(nodes), dtype=np.bool_)
    scores = plugin.normalize(plugin.score(pod, nodes, feasible), feasible)
    return dict(zip(nodes.names, scores.tolist(), strict=True))


def test_max_skew_counts_per_zone_and_a_node_without_the_key_is_refused_for_its_missing_label() -> None:
    nodes = cluster()
    running(nodes, "n1", 2)
    running(nodes, "n3", 1)
    running(nodes, "n5", 5)  # no zone: not a domain, its pods count nowhere
    # a=2, b=1, c=0, min 0: a 2+1 > 1, b 1+1 > 1, c 0+1 <= 1.
    assert verdict(spread_pod("x", constraint()), nodes) == {
        "n1": CONSTRAINTS_NOT_MATCH, "n2": CONSTRAINTS_NOT_MATCH, "n3": CONSTRAINTS_NOT_MATCH, "n4": "",
        "n5": MISSING_LABEL}
    # maxSkew 2: b (1+1-0 = 2) passes too.
    assert verdict(spread_pod("x", constraint(skew=2)), nodes)["n3"] == ""


def test_min_domains_above_the_domain_count_makes_the_global_minimum_zero() -> None:
    nodes = cluster()
    for name in ("n1", "n3", "n4"):
        running(nodes, name, 1)
    # Three domains of 1 each: every zone node passes with min 1 ...
    assert verdict(spread_pod("x", constraint()), nodes) == {
        "n1": "", "n2": "", "n3": "", "n4": "", "n5": MISSING_LABEL}
    # ... but minDomains 4 > 3 domains: the minimum is 0 and 1 + 1 - 0 > 1 everywhere.
    refused = verdict(spread_pod("x", constraint(minDomains=4)), nodes)
    assert refused == {"n1": CONSTRAINTS_NOT_MATCH, "n2": CONSTRAINTS_NOT_MATCH, "n3": CONSTRAINTS_NOT_MATCH,
                       "n4": CONSTRAINTS_NOT_MATCH, "n5": MISSING_LABEL}
    # minDomains 3 = the domain count: as without it.
    assert verdict(spread_pod("x", constraint(minDomains=3)), nodes)["n1"] == ""


def test_node_affinity_policy_honor_leaves_the_unselected_zone_out_and_ignore_counts_it() -> None:
    nodes = cluster(n1={"disk": "ssd"}, n2={"disk": "ssd"}, n3={"disk": "ssd"})
    running(nodes, "n1", 1)
    running(nodes, "n3", 1)
    ssd = {"disk": "ssd"}
    # Honor (default): zone c (n4, no ssd) is no domain; a=1, b=1: min 1, every selected zone passes.
    honored = verdict(spread_pod("x", constraint(), node_selector=ssd), nodes)
    assert honored["n1"] == honored["n3"] == ""
    # Ignore: zone c counts with 0, so a and b are at 1 + 1 - 0 = 2.
    ignored = verdict(spread_pod("x", constraint(nodeAffinityPolicy="Ignore"), node_selector=ssd), nodes)
    assert ignored["n1"] == ignored["n3"] == CONSTRAINTS_NOT_MATCH
    assert ignored["n4"] == ""


def test_node_taints_policy_honor_leaves_a_zone_of_untolerated_taints_out() -> None:
    nodes = table(*(raw_node(f"n{i}", labels={ZONE: z}, taints=[{"key": "gpu", "effect": "NoSchedule"}] if z == "c"
                             else ()) for i, z in ((1, "a"), (2, "b"), (3, "c"))))
    running(nodes, "n1", 1)
    running(nodes, "n2", 1)
    assert verdict(spread_pod("x", constraint(nodeTaintsPolicy="Honor")), nodes)["n1"] == ""
    assert verdict(spread_pod("x", constraint()), nodes)["n1"] == CONSTRAINTS_NOT_MATCH  # Ignore: c counts, 0


def test_match_label_keys_count_only_pods_of_the_same_revision() -> None:
    nodes = cluster()
    running(nodes, "n1", 3, labels={**WEB, "pod-template-hash": "v1"})
    labels = {**WEB, "pod-template-hash": "v2"}
    assert verdict(spread_pod("x", constraint(), labels=labels), nodes)["n1"] == CONSTRAINTS_NOT_MATCH
    keyed = spread_pod("x", constraint(matchLabelKeys=["pod-template-hash", "absent"]), labels=labels)
    assert verdict(keyed, nodes)["n1"] == ""
    running(nodes, "n2", 2, labels=labels)
    assert verdict(keyed, nodes)["n1"] == CONSTRAINTS_NOT_MATCH


def test_pods_of_other_namespaces_and_a_pod_not_matching_its_own_selector() -> None:
    nodes = cluster()
    running(nodes, "n1", 4, namespace="other")
    assert verdict(spread_pod("x", constraint()), nodes)["n1"] == ""
    running(nodes, "n1", 1)
    # The pod itself does not match: skew = 1 + 0 - 0 <= 1.
    assert verdict(spread_pod("x", constraint(), labels={"app": "other"}), nodes)["n1"] == ""
    assert verdict(spread_pod("x", constraint()), nodes)["n1"] == CONSTRAINTS_NOT_MATCH


def test_a_node_is_reported_under_the_first_constraint_it_fails() -> None:
    nodes = cluster()
    running(nodes, "n1", 1)
    # Constraint 1 on the hostname refuses n1 (1 + 1 - 0); constraint 2 on a rack key no node has.
    result = verdict(spread_pod("x", constraint(HOST), constraint("rack")), nodes)
    assert set(result.values()) == {MISSING_LABEL}
    result = verdict(spread_pod("x", constraint("rack"), constraint(HOST)), nodes)
    assert set(result.values()) == {MISSING_LABEL}


def test_schedule_anyway_alone_filters_nothing() -> None:
    nodes = cluster()
    running(nodes, "n1", 9)
    assert set(verdict(spread_pod("x", constraint(hard=False)), nodes).values()) == {""}


@pytest.mark.parametrize(("patch", "field"), [
    ({"whenUnsatisfiable": "Sometimes"}, "spec.topologySpreadConstraints[0].whenUnsatisfiable"),
    ({"maxSkew": 0}, "spec.topologySpreadConstraints[0].maxSkew"),
    ({"minDomains": 2, "whenUnsatisfiable": "ScheduleAnyway"}, "spec.topologySpreadConstraints[0].minDomains"),
    ({"nodeTaintsPolicy": "Maybe"}, "spec.topologySpreadConstraints[0].nodeTaintsPolicy"),
    ({"topologyKey": None}, "spec.topologySpreadConstraints[0].topologyKey"),
    ({"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
     "spec.topologySpreadConstraints[0].labelSelector.matchExpressions[0].operator"),
])
def test_a_malformed_constraint_names_its_field(patch: Json, field: str) -> None:
    with pytest.raises(PodSpecError) as caught:
        spread_pod("x", {**constraint(), **patch})
    assert caught.value.field == field


def test_schedule_anyway_score_prefers_the_emptier_zone_with_kube_schedulers_arithmetic() -> None:
    nodes = cluster()
    running(nodes, "n1", 2)
    running(nodes, "n3", 1)
    # 3 zones: weight log(5) = 1.609; raw a: round(3.22) = 3, b: round(1.61) = 2, c: 0; n5 lacks the key.
    # normalised 100 * (max + min - s) // max: a 0, b 33, c 100; n5 ignored: 0.
    assert normalized(PodTopologySpread(), spread_pod("x", constraint(hard=False)), nodes) == {
        "n1": 0.0, "n2": 0.0, "n3": 33.0, "n4": 100.0, "n5": 0.0}


def test_hostname_score_counts_each_node_and_max_skew_shifts_every_score() -> None:
    nodes = cluster()
    running(nodes, "n1", 2)
    running(nodes, "n3", 1)
    # 5 nodes: log(7) = 1.946; raw = count * 1.946 + (2 - 1): n1 round(4.89) = 5, n3 round(2.95) = 3, others 1.
    # 100 * (5 + 1 - s) // 5: n1 20, n3 60, others 100.
    assert normalized(PodTopologySpread(), spread_pod("x", constraint(HOST, skew=2, hard=False)), nodes) == {
        "n1": 20.0, "n2": 100.0, "n3": 60.0, "n4": 100.0, "n5": 100.0}


def test_no_soft_constraint_scores_every_node_zero() -> None:
    nodes = cluster()
    running(nodes, "n1", 2)
    assert set(normalized(PodTopologySpread(), spread_pod("x", constraint()), nodes).values()) == {0.0}


def affinity_pod(name: str, *, labels: dict[str, str] | None = None, preferred: list[Json] | None = None,
                 preferred_anti: list[Json] | None = None, required: list[Json] | None = None) -> Json:
    raw = raw_pod(name, labels=labels or {})
    affinity: Json = {}
    if preferred or required:
        affinity["podAffinity"] = {}
        if preferred:
            affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
        if required:
            affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = required
    if preferred_anti:
        affinity["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": preferred_anti}
    if affinity:
        raw["spec"]["affinity"] = affinity
    return raw


def weighted(weight: int, key: str, **match: str) -> Json:
    return {"weight": weight, "podAffinityTerm": {"topologyKey": key, "labelSelector": {"matchLabels": match}}}


def test_preferred_affinity_and_anti_affinity_of_the_incoming_pod() -> None:
    nodes = cluster()
    running(nodes, "n1", labels={"app": "db"})
    running(nodes, "n3", labels={"app": "cache"})
    incoming = parse_pod(affinity_pod("x", preferred=[weighted(10, ZONE, app="db")],
                                      preferred_anti=[weighted(5, HOST, app="cache")]))
    # zone a +10 (n1, n2); n3 -5; n4, n5 0. min -5, max 10: 100 * (s + 5) / 15 truncated.
    assert normalized(InterPodAffinity(), incoming, nodes) == {
        "n1": 100.0, "n2": 100.0, "n3": 0.0, "n4": 33.0, "n5": 33.0}


def test_existing_pods_preferred_and_required_terms_weigh_in_for_a_pod_without_terms() -> None:
    nodes = cluster()
    holder = affinity_pod("holder", preferred_anti=[weighted(7, ZONE, app="web")],
                          required=[{"topologyKey": HOST, "labelSelector": {"matchLabels": WEB}}])
    running(nodes, "n4", raw=holder)
    running(nodes, "n1", raw=affinity_pod("fan", preferred=[weighted(3, HOST, app="web")]))
    incoming = parse_pod(raw_pod("x", labels=WEB))
    # zone c: -7, n4 itself +1 (required term, hardPodAffinityWeight 1), n1 +3: n4 -6, n1 3, others 0.
    # min -6, max 3: 100 * (s + 6) / 9 truncated.
    assert normalized(InterPodAffinity(), incoming, nodes) == {
        "n1": 100.0, "n2": 66.0, "n3": 66.0, "n4": 0.0, "n5": 66.0}
    # A pod the terms do not match: all equal, all 0.
    assert set(normalized(InterPodAffinity(), parse_pod(raw_pod("y", labels={"app": "api"})), nodes).values()) == {0.0}


def test_the_shipped_default_profile_puts_a_spread_pod_in_the_empty_zone() -> None:
    profiles, _ = load_profiles("configs/policies.yaml")
    nodes = cluster()
    running(nodes, "n1", 1)
    running(nodes, "n3", 1)
    evaluation = evaluate(profiles["default"], spread_pod("x", constraint(hard=False)), nodes)
    best = nodes.names[int(np.argmax(np.where(evaluation.feasible, evaluation.scores, -1)))]
    assert best == "n4"
    assert inter_pod_keys(spread_pod("x", constraint(), constraint(HOST, hard=False))) == ZONE


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    """n1 in zone a, n2 in zone b."""
    return [node_row(f"n{i}", labels={HOST: f"n{i}", ZONE: zone}) for i, zone in ((1, "a"), (2, "b"))]


def tentative_pod(uid: str, node: str, position: str, cpu: int = 10) -> BatchPod:
    """A web pod of a batch, decided at ``position`` counting the earlier pods of its batch (tentative)."""
    _ports, meta = compact.pod_meta(raw_pod(uid, labels=WEB))
    return BatchPod(uid=uid, pod=f"team/{uid}", digest="", candidates=[node], request={"cpu": cpu}, meta=meta,
                    inter_pod_keys=ZONE, position=position, tentative=True)


async def test_a_spread_pod_after_a_refused_tentative_pod_of_its_batch_is_refused_too(ledger: Ledger) -> None:
    seen = (await ledger.load()).last_change
    # The first pod does not fit n1: the second was decided counting it in zone a, so it must not go to b blindly.
    batch = [tentative_pod("big", "n1", seen, cpu=9000), tentative_pod("next", "n2", seen)]
    results = await ledger.reserve_batch(batch, owner="w", ttl_seconds=30)
    assert isinstance(results, list) and isinstance(results[0], Conflict)
    assert results[1] == Conflict("n2", "inter-pod batch", 1, 0)
    # Alone (or after a tentative pod that was reserved where decided) it is placed.
    results = await ledger.reserve_batch([tentative_pod("one", "n1", seen), tentative_pod("two", "n2", seen)],
                                         owner="w", ttl_seconds=30)
    assert results == [Reserved("n1"), Reserved("n2")]


def test_gang_members_with_do_not_schedule_or_soft_constraints_are_accepted_for_placement() -> None:
    def gang(*constraints: Json) -> WorkItem:
        raw = raw_pod("m", labels=WEB)
        raw["spec"]["topologySpreadConstraints"] = list(constraints)
        member = GangMember("uid-m", "team", "m", pod=compact.encode(compact.compact_pod(raw)).decode())
        return WorkItem(uid="g", namespace="team", name="g", policy="default", gang="g", members=(member,))

    hard = parse_work("1-0", gang(constraint()))
    assert not hard.problem and [view.hard_spread for view, _raw in hard.members] != [()]
    assert not parse_work("1-0", gang(constraint(hard=False))).problem


def test_terminating_pods_count_in_no_spread_domain_but_still_in_inter_pod_affinity() -> None:
    nodes = cluster()
    running(nodes, "n1")
    leaving = raw_pod("leaving", labels=WEB)
    leaving["metadata"]["deletionTimestamp"] = "2026-11-23T02:00:00Z"
    running(nodes, "n2", raw=leaving)
    running(nodes, "n3")
    running(nodes, "n4")
    # zone a holds 1 live + 1 terminating web pod, b and c 1 each: counted 1/1/1, so every zone passes maxSkew 1
    # (counting the terminating one, zone a would be 2 + 1 - 1 = 2 > 1).
    assert verdict(spread_pod("web", constraint()), nodes) == {
        "n1": "", "n2": "", "n3": "", "n4": "", "n5": MISSING_LABEL}
    # kube-scheduler's InterPodAffinity has no such exception: the terminating pod still repels on its node.
    raw = raw_pod("other", labels={"app": "other"})
    raw["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": WEB}, "topologyKey": HOST}]}}
    mask = InterPodAffinity().filter(parse_pod(raw), nodes).mask
    assert dict(zip(nodes.names, mask.tolist(), strict=True)) == {
        "n1": False, "n2": False, "n3": False, "n4": False, "n5": True}
