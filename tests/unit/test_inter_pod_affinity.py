"""InterPodAffinity (required terms) against hand-worked cases, and the ledger's inter-pod domain rule."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import fakeredis
import pytest

from resolver import compact
from resolver.ledger import BatchPod, Conflict, Ledger, Reserved
from tests.unit.kube_objects import Json, raw_node, raw_pod, table
from workers.errors import UnsupportedPodField
from workers.nodes import NodeTable, parse_placed
from workers.plugins.interpod import (
    AFFINITY_MISMATCH,
    ANTI_AFFINITY_MISMATCH,
    EXISTING_ANTI_AFFINITY,
    InterPodAffinity,
)
from workers.pod import PodView, parse_pod

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


def test_a_namespace_selector_with_labels_is_refused_by_name() -> None:
    selective = {**term(HOST, app="db"), "namespaceSelector": {"matchLabels": {"team": "a"}}}
    with pytest.raises(UnsupportedPodField, match=r"podAntiAffinity\.requiredDuringSchedulingIgnoredDuringExecution"
                                                  r"\[0\]\.namespaceSelector"):
        parse_pod(pod("web", anti=[selective]))


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
async def ledger() -> AsyncIterator[Ledger]:
    redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    ledger = Ledger(redis)
    alloc = {"cpu": 4000, "memory": 8 << 30, "pods": 110}
    await ledger.rebuild(nodes=[(f"n{i}", alloc, {HOST: f"n{i}", ZONE: "a"}, "") for i in (1, 2)], bound=[])
    yield ledger
    await redis.aclose()


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
