"""InterPodAffinity (required terms) against hand-worked cases, and the ledger's inter-pod domain rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hoss.framework.errors import UnsupportedPodField
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.interpod import (
    AFFINITY_MISMATCH,
    ANTI_AFFINITY_MISMATCH,
    EXISTING_ANTI_AFFINITY,
    InterPodAffinity,
)
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import parse_placed
from hoss.ledger.arguments import BatchPod, NodeRow
from hoss.ledger.client import Ledger
from hoss.ledger.results import Conflict, Reserved
from hoss.model import compact
from tests.kube_objects import Json, node_row, raw_node, raw_pod, table

HOST = "kubernetes.io/hostname"
ZONE = "zone"


def term(key: str, **match: str) -> Json:
    return {"labelSelector": {"matchLabels": match}, "topologyKey": key}


def pod(name: str, *, labels: dict[str, str] | None = None, affinity: list[Json] | None = None,
        anti: list[Json] | None = None, namespace: str = "team") -> Json:
    raw = raw_pod(name, labels=labels, namespace=namespace)
    spec_affinity: Json = {}
    if affinity:
        spec_affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": affinity}
    if anti:
        spec_affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": anti}
    if spec_affinity:
        raw["spec"]["affinity"] = spec_affinity
    return raw


def cluster() -> NodeTable:
    # zone a: n1, n2; zone b: n3, n4; n5 has no zone label.
    return table(*(raw_node(f"n{i}", labels={HOST: f"n{i}", **({ZONE: z} if z else {})})
                   for i, z in ((1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, ""))))


def running(nodes: NodeTable, raw: Json, node: str) -> None:
    _ports, meta = compact.pod_meta(raw)
    nodes.place_pod(parse_placed(raw["metadata"]["uid"], node, meta))


def verdict(incoming: PodView, nodes: NodeTable) -> dict[str, str]:
    """node -> '' when it passes, else its reason."""
    result = InterPodAffinity().filter(incoming, nodes)
    out = {}
    for row, name in enumerate(nodes.names):
        reasons = [reason for reason, marked in result.reasons.items() if marked[row]]
        assert len(reasons) <= 1, "each node is reported under one reason"
        out[name] = "" if result.mask[row] else reasons[0]
    return out


def test_anti_affinity_on_hostname_keeps_one_per_node_and_a_pod_matching_its_own_term_spreads() -> None:
    nodes = cluster()
    web = {"app": "web"}
    running(nodes, pod("web-1", labels=web, anti=[term(HOST, app="web")]), "n1")
    incoming = parse_pod(pod("web-2", labels=web, anti=[term(HOST, app="web")]))
    result = verdict(incoming, nodes)
    # n1 is refused by the incoming pod's own term (checked before the existing pod's term).
    assert result == {"n1": ANTI_AFFINITY_MISMATCH, "n2": "", "n3": "", "n4": "", "n5": ""}


def test_anti_affinity_on_zone_refuses_the_whole_zone_and_passes_nodes_without_the_key() -> None:
    nodes = cluster()
    running(nodes, pod("db", labels={"app": "db"}), "n2")
    incoming = parse_pod(pod("web", anti=[term(ZONE, app="db")]))
    assert verdict(incoming, nodes) == {"n1": ANTI_AFFINITY_MISMATCH, "n2": ANTI_AFFINITY_MISMATCH, "n3": "",
                                        "n4": "", "n5": ""}


def test_existing_pods_anti_affinity_holds_against_a_pod_without_terms() -> None:
    nodes = cluster()
    running(nodes, pod("loner", labels={"app": "loner"}, anti=[term(ZONE, app="noisy")]), "n3")
    assert verdict(parse_pod(pod("noisy", labels={"app": "noisy"})), nodes) == {
        "n1": "", "n2": "", "n3": EXISTING_ANTI_AFFINITY, "n4": EXISTING_ANTI_AFFINITY, "n5": ""}
    assert set(verdict(parse_pod(pod("quiet", labels={"app": "quiet"})), nodes).values()) == {""}


def test_affinity_needs_a_matching_pod_in_the_domain_and_the_key_on_the_node() -> None:
    nodes = cluster()
    running(nodes, pod("db", labels={"app": "db"}), "n4")
    follower = parse_pod(pod("follower", affinity=[term(ZONE, app="db")]))
    assert verdict(follower, nodes) == {"n1": AFFINITY_MISMATCH, "n2": AFFINITY_MISMATCH, "n3": "", "n4": "",
                                        "n5": AFFINITY_MISMATCH}


def test_the_first_pod_of_a_self_affine_group_may_go_to_any_node_with_the_key() -> None:
    nodes = cluster()
    first = parse_pod(pod("g-1", labels={"group": "g"}, affinity=[term(ZONE, group="g")]))
    assert verdict(first, nodes) == {"n1": "", "n2": "", "n3": "", "n4": "", "n5": AFFINITY_MISMATCH}
    stranger = parse_pod(pod("s", labels={"group": "other"}, affinity=[term(ZONE, group="g")]))
    assert set(verdict(stranger, nodes).values()) == {AFFINITY_MISMATCH}


def test_terms_match_the_owners_namespace_unless_they_list_others() -> None:
    nodes = cluster()
    running(nodes, pod("db", labels={"app": "db"}, namespace="other"), "n1")
    same_namespace = parse_pod(pod("web", anti=[term(HOST, app="db")]))
    assert verdict(same_namespace, nodes)["n1"] == ""
    listed = {**term(HOST, app="db"), "namespaces": ["other"]}
    assert verdict(parse_pod(pod("web", anti=[listed])), nodes)["n1"] == ANTI_AFFINITY_MISMATCH
    everywhere = {**term(HOST, app="db"), "namespaceSelector": {}}
    assert verdict(parse_pod(pod("web", anti=[everywhere])), nodes)["n1"] == ANTI_AFFINITY_MISMATCH


NAMESPACE_LABELS = {"team": {"env": "prod"}, "other": {"env": "prod"}, "dev": {"env": "dev"}}


def resolved(raw: Json, namespaces: dict[str, dict[str, str]] | None = None) -> PodView:
    """The pod as a worker reads it from the dispatcher's compact form, namespaceSelectors resolved."""
    form = compact.compact_pod(raw, namespaces=NAMESPACE_LABELS if namespaces is None else namespaces)
    return parse_pod(compact.decode(compact.encode(form)))


def selecting(key: str, namespaces: list[str] | None = None, **labels: str) -> Json:
    """An anti-affinity term on app=db whose namespaceSelector matches `labels`."""
    return {**term(key, app="db"), "namespaceSelector": {"matchLabels": labels},
            **({"namespaces": namespaces} if namespaces else {})}


def test_a_namespace_selector_adds_the_namespaces_it_selects_to_the_listed_ones() -> None:
    nodes = cluster()
    running(nodes, pod("db-1", labels={"app": "db"}, namespace="other"), "n1")
    running(nodes, pod("db-2", labels={"app": "db"}, namespace="dev"), "n3")
    # env=prod selects team and other: the db pod in other (n1) counts, the one in dev (n3) does not.
    assert verdict(resolved(pod("web", anti=[selecting(HOST, env="prod")])), nodes) == {
        "n1": ANTI_AFFINITY_MISMATCH, "n2": "", "n3": "", "n4": "", "n5": ""}
    # namespaces plus the selected ones: listing dev adds n3.
    assert verdict(resolved(pod("web", anti=[selecting(HOST, ["dev"], env="prod")])), nodes) == {
        "n1": ANTI_AFFINITY_MISMATCH, "n2": "", "n3": ANTI_AFFINITY_MISMATCH, "n4": "", "n5": ""}


def test_a_namespace_selector_selecting_nothing_does_not_fall_back_to_the_pods_own_namespace() -> None:
    nodes = cluster()
    running(nodes, pod("db", labels={"app": "db"}, namespace="team"), "n2")
    # kube-scheduler: the own namespace only when there are neither namespaces nor a namespaceSelector.
    assert set(verdict(resolved(pod("web", anti=[selecting(HOST, env="staging")])), nodes).values()) == {""}
    assert verdict(resolved(pod("web", anti=[term(HOST, app="db")])), nodes)["n2"] == ANTI_AFFINITY_MISMATCH


def test_required_affinity_follows_a_pod_in_a_selected_namespace() -> None:
    nodes = cluster()
    running(nodes, pod("db", labels={"app": "db"}, namespace="other"), "n4")
    follower = {**term(ZONE, app="db"), "namespaceSelector": {"matchExpressions": [
        {"key": "env", "operator": "In", "values": ["prod"]}]}}
    assert verdict(resolved(pod("f", affinity=[follower])), nodes) == {
        "n1": AFFINITY_MISMATCH, "n2": AFFINITY_MISMATCH, "n3": "", "n4": "", "n5": AFFINITY_MISMATCH}
    # once other is relabelled env=dev, nothing matches and f (not matching its own term) fits nowhere
    moved = {**NAMESPACE_LABELS, "other": {"env": "dev"}}
    assert set(verdict(resolved(pod("f", affinity=[follower]), moved), nodes).values()) == {AFFINITY_MISMATCH}


def test_an_existing_pods_namespace_selector_matches_the_incoming_pods_namespace_labels() -> None:
    nodes = cluster()
    guard = {**term(ZONE, app="web"), "namespaceSelector": {"matchLabels": {"env": "prod"}}}
    running(nodes, pod("guard", labels={"app": "guard"}, namespace="other", anti=[guard]), "n3")
    # web in team (env=prod) is kept out of zone b; web in dev (env=dev) is not
    assert verdict(resolved(pod("web", labels={"app": "web"}, namespace="team")), nodes) == {
        "n1": "", "n2": "", "n3": EXISTING_ANTI_AFFINITY, "n4": EXISTING_ANTI_AFFINITY, "n5": ""}
    assert set(verdict(resolved(pod("web", labels={"app": "web"}, namespace="dev")), nodes).values()) == {""}
    # namespace labels unknown (a form no dispatcher resolved): the selector is read as every namespace
    unknown = parse_pod(pod("web", labels={"app": "web"}, namespace="dev"))
    assert verdict(unknown, nodes)["n3"] == EXISTING_ANTI_AFFINITY


def test_preferred_terms_with_a_namespace_selector_score_only_selected_namespaces() -> None:
    nodes = cluster()
    running(nodes, pod("db-1", labels={"app": "db"}, namespace="other"), "n1")
    running(nodes, pod("db-2", labels={"app": "db"}, namespace="dev"), "n3")
    raw = pod("web")
    raw["spec"]["affinity"] = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {**term(ZONE, app="db"),
                                           "namespaceSelector": {"matchLabels": {"env": "prod"}}}}]}}
    plugin = InterPodAffinity()
    incoming = resolved(raw)
    raw_scores = plugin.score(incoming, nodes, np.ones(len(nodes), dtype=np.bool_))
    # zone a holds db-1 (other: selected) -> +10; zone b's db-2 is in dev (not selected) -> 0
    assert dict(zip(nodes.names, raw_scores.tolist(), strict=True)) == {
        "n1": 10.0, "n2": 10.0, "n3": 0.0, "n4": 0.0, "n5": 0.0}


def test_a_namespace_selector_no_dispatcher_resolved_is_refused_by_name() -> None:
    selective = {**term(HOST, app="db"), "namespaceSelector": {"matchLabels": {"team": "a"}}}
    with pytest.raises(UnsupportedPodField, match=r"podAntiAffinity\.requiredDuringSchedulingIgnoredDuringExecution"
                                                  r"\[0\]\.namespaceSelector"):
        parse_pod(pod("web", anti=[selective]))


def test_the_compact_form_resolves_namespace_selectors_and_carries_the_own_namespace_labels() -> None:
    raw = pod("web", anti=[selecting(HOST, env="prod")])
    context = compact.compact_pod(raw, namespaces=NAMESPACE_LABELS)[compact.NAMESPACES]
    key = compact.selector_key({"matchLabels": {"env": "prod"}})
    assert context == {"labels": {"env": "prod"}, "selected": {key: ["other", "team"]}}
    assert compact.NAMESPACES not in compact.compact_pod(raw), "no namespaces given: nothing claimed"


def test_match_expressions_and_a_missing_selector() -> None:
    nodes = cluster()
    running(nodes, pod("a", labels={"tier": "cache"}), "n1")
    running(nodes, pod("b", labels={"tier": "db"}), "n3")
    expression = {"labelSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]},
                  "topologyKey": HOST}
    assert verdict(parse_pod(pod("x", anti=[expression])), nodes) == {
        "n1": ANTI_AFFINITY_MISMATCH, "n2": "", "n3": "", "n4": "", "n5": ""}
    no_selector = {"topologyKey": HOST}
    assert set(verdict(parse_pod(pod("y", anti=[no_selector])), nodes).values()) == {""}


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    """n1 and n2, both in zone a."""
    return [node_row(f"n{i}", labels={HOST: f"n{i}", ZONE: "a"}) for i in (1, 2)]


def anti_pod(uid: str, node: str, position: str, key: str = HOST) -> BatchPod:
    _ports, meta = compact.pod_meta(pod(uid, labels={"app": "web"}, anti=[term(key, app="web")]))
    return BatchPod(uid=uid, pod=f"team/{uid}", digest="", candidates=[node], request={"cpu": 10},
                    meta=meta, inter_pod_keys=key, position=position)


async def test_two_workers_deciding_from_the_same_position_cannot_both_take_one_domain(ledger: Ledger) -> None:
    seen = (await ledger.load()).last_change
    assert await ledger.reserve_batch([anti_pod("a", "n1", seen)], owner="w1", ttl_seconds=30) == [Reserved("n1")]
    # Worker 2 decided from the same position (it had not seen a): refused on n1, free on n2.
    [refused] = await ledger.reserve_batch([anti_pod("b", "n1", seen)], owner="w2", ttl_seconds=30)  # type: ignore[misc]
    assert isinstance(refused, Conflict) and refused.resource == f"inter-pod domain {HOST}=n1"
    assert await ledger.reserve_batch([anti_pod("c", "n2", seen)], owner="w2", ttl_seconds=30) == [Reserved("n2")]
    # A plain pod decided before a's placement is refused next to a (a's anti-affinity may reject it) ...
    plain = BatchPod(uid="p", pod="team/p", digest="", candidates=["n1"], request={"cpu": 10}, position=seen)
    [stale] = await ledger.reserve_batch([plain], owner="w3", ttl_seconds=30)  # type: ignore[misc]
    assert isinstance(stale, Conflict)
    # ... and placed once decided from a position that includes it.
    now = (await ledger.load()).last_change
    fresh = BatchPod(uid="p", pod="team/p", digest="", candidates=["n1"], request={"cpu": 10}, position=now)
    assert await ledger.reserve_batch([fresh], owner="w3", ttl_seconds=30) == [Reserved("n1")]


async def test_within_one_call_a_domain_changed_earlier_in_the_call_is_refused(ledger: Ledger) -> None:
    seen = (await ledger.load()).last_change
    await ledger.reserve_batch([anti_pod("warm", "n2", seen, key=ZONE)], owner="w", ttl_seconds=30)
    seen = (await ledger.load()).last_change
    results = await ledger.reserve_batch([anti_pod("a", "n1", seen, key=ZONE), anti_pod("b", "n1", seen, key=ZONE)],
                                         owner="w", ttl_seconds=30)
    assert isinstance(results, list)
    assert results[0] == Reserved("n1") and isinstance(results[1], Conflict)


async def test_the_change_stream_carries_the_anti_terms_for_the_index(ledger: Ledger) -> None:
    seen = (await ledger.load()).last_change
    await ledger.reserve_batch([anti_pod("a", "n1", seen)], owner="w", ttl_seconds=30)
    [change] = await ledger.changes(seen)
    placed = dict(change.items)["p:a"].split("\n", 1)[1]
    assert json.loads(placed)["anti"] == [term(HOST, app="web")]
    assert parse_placed("a", "n1", placed).anti[0].topology_key == HOST
