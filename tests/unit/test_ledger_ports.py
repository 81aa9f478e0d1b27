"""The ledger's pod meta and host ports: kept per entry, published for the workers' pod index, and checked
atomically by reserve_batch and reserve so two workers never put two pods with one host port on a node."""

from __future__ import annotations

import json

import pytest

from hoss.ledger.arguments import BatchPod, BoundPod, GangMember, NodeRow
from hoss.ledger.client import Ledger
from hoss.ledger.results import Conflict, Reserved
from hoss.model import compact
from tests.kube_objects import batch_pod


def raw(name: str, *ports: dict[str, object], labels: dict[str, str] | None = None) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "team", "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "ports": list(ports)}]}}


def port_pod(uid: str, *candidates: str, ports: str = "", meta: str = "") -> BatchPod:
    """A small pod of namespace team holding ``ports`` (as `compact.pod_meta` writes them)."""
    return batch_pod(uid, *candidates, cpu=100, namespace="team", ports=ports, meta=meta)


def test_pod_meta_keeps_namespace_labels_and_sanitised_host_ports() -> None:
    ports, meta = compact.pod_meta(raw("web", {"containerPort": 80, "hostPort": 8080},
                                       {"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"},
                                       {"containerPort": 9090}, labels={"app": "web"}))
    assert ports == "TCP/0.0.0.0/8080,UDP/10.0.0.1/53"
    assert json.loads(meta) == {"namespace": "team", "name": "web", "labels": {"app": "web"},
                                "ports": ["TCP/0.0.0.0/8080", "UDP/10.0.0.1/53"]}
    assert compact.pod_meta(raw("plain")) == ("", '{"name":"plain","namespace":"team"}')


def test_pod_meta_is_the_same_before_and_after_the_binding_copies_the_webhook_lane_label() -> None:
    """Kubernetes (1.35+) copies a Binding's labels onto the pod, so a bound pod carries hoss.io/lane; the worker's
    description of the pending pod and the sync's of the bound one must still agree (the ledger then binds the
    entry in place), and only the lane label is left out."""
    pending = raw("web", labels={"app": "web"})
    bound = raw("web", labels={"app": "web", "hoss.io/lane": "2"})
    assert compact.pod_meta(bound) == compact.pod_meta(pending)
    assert json.loads(compact.pod_meta(raw("web", labels={"hoss.io/lane": "1"}))[1]) == {"namespace": "team",
                                                                                        "name": "web"}


@pytest.mark.parametrize(
    ("held", "wanted", "conflict"),
    [
        ("TCP/0.0.0.0/80", "TCP/10.0.0.1/80", True),   # 0.0.0.0 holds the port on every IP
        ("TCP/10.0.0.1/80", "TCP/0.0.0.0/80", True),   # ... and wants it on every IP
        ("TCP/10.0.0.1/80", "TCP/10.0.0.2/80", False),  # two specific IPs
        ("TCP/10.0.0.1/80", "TCP/10.0.0.1/80", True),
        ("TCP/0.0.0.0/80", "UDP/0.0.0.0/80", False),   # another protocol
        ("TCP/0.0.0.0/80", "TCP/0.0.0.0/81", False),   # another port
    ],
)
async def test_reserve_batch_refuses_a_node_whose_host_port_is_taken(ledger: Ledger, held: str, wanted: str,
                                                                     conflict: bool) -> None:
    assert await ledger.reserve_batch([port_pod("a", "n1", ports=held)], owner="w1", ttl_seconds=30) \
        == [Reserved("n1")]
    results = await ledger.reserve_batch([port_pod("b", "n1", ports=wanted)], owner="w2", ttl_seconds=30)
    assert isinstance(results, list)
    [result] = results
    if conflict:
        assert result == Conflict(node="n1", resource=f"hostPort {wanted}", wanted=1, free=0)
    else:
        assert result == Reserved("n1")


async def test_a_port_conflict_falls_through_to_the_next_candidate_and_within_one_batch(ledger: Ledger) -> None:
    results = await ledger.reserve_batch(
        [port_pod("a", "n1", "n2", ports="TCP/0.0.0.0/80"), port_pod("b", "n1", "n2", ports="TCP/0.0.0.0/80"),
         port_pod("c", "n1", "n2", ports="TCP/0.0.0.0/80")],
        owner="w1", ttl_seconds=30)
    assert isinstance(results, list)
    assert results[:2] == [Reserved("n1"), Reserved("n2")]
    assert results[2] == Conflict(node="n2", resource="hostPort TCP/0.0.0.0/80", wanted=1, free=0)


async def test_releasing_or_moving_a_pod_frees_its_port_and_refreshing_keeps_it(ledger: Ledger) -> None:
    await ledger.reserve_batch([port_pod("a", "n1", ports="TCP/0.0.0.0/80")], owner="w1", ttl_seconds=30)
    # The same pod again on the same node: its own port is not a conflict.
    assert await ledger.reserve_batch([port_pod("a", "n1", ports="TCP/0.0.0.0/80")], owner="w1", ttl_seconds=30) \
        == [Reserved("n1")]
    # Moved to n2: n1's port is free again.
    assert await ledger.reserve_batch([port_pod("a", "n2", ports="TCP/0.0.0.0/80")], owner="w1", ttl_seconds=30) \
        == [Reserved("n2")]
    assert await ledger.reserve_batch([port_pod("b", "n1", ports="TCP/0.0.0.0/80")], owner="w2", ttl_seconds=30) \
        == [Reserved("n1")]
    assert await ledger.release("b")
    assert await ledger.reserve_batch([port_pod("c", "n1", ports="TCP/0.0.0.0/80")], owner="w2", ttl_seconds=30) \
        == [Reserved("n1")]


async def test_bound_pods_ports_count_and_survive_a_rebuild(ledger: Ledger, ledger_nodes: list[NodeRow]) -> None:
    ports, meta = compact.pod_meta(raw("old", {"containerPort": 80, "hostPort": 80}))
    bound = BoundPod(uid="old", pod="team/old", node="n1", request={"cpu": 100, "pods": 1}, ports=ports, meta=meta)
    await ledger.bind_many([bound])
    assert await ledger.reserve_batch([port_pod("a", "n1", ports="TCP/0.0.0.0/80")], owner="w", ttl_seconds=30) \
        == [Conflict(node="n1", resource="hostPort TCP/0.0.0.0/80", wanted=1, free=0)]
    await ledger.rebuild(nodes=ledger_nodes, bound=[bound])
    assert await ledger.reserve_batch([port_pod("a", "n1", ports="TCP/0.0.0.0/80")], owner="w", ttl_seconds=30) \
        == [Conflict(node="n1", resource="hostPort TCP/0.0.0.0/80", wanted=1, free=0)]
    loaded = await ledger.load()
    assert loaded.pods == [("old", "n1", meta)]


async def test_a_gang_reservation_checks_ports_between_its_members(ledger: Ledger) -> None:
    def member(uid: str, node: str) -> GangMember:
        return GangMember(uid=uid, pod=f"team/{uid}", node=node, request={"cpu": 100}, ports="TCP/0.0.0.0/7000")

    assert await ledger.reserve_gang(members=[member("a", "n1"), member("b", "n1")], owner="w", ttl_seconds=30) \
        == Conflict(node="n1", resource="hostPort TCP/0.0.0.0/7000", wanted=1, free=0)
    assert await ledger.entries() == []
    result = await ledger.reserve_gang(members=[member("a", "n1"), member("b", "n2")], owner="w", ttl_seconds=30)
    assert result.uids == ("a", "b")  # type: ignore[union-attr]


async def test_the_change_stream_says_which_pods_were_placed_and_removed(ledger: Ledger) -> None:
    start = (await ledger.load()).last_change
    await ledger.reserve_batch([port_pod("a", "n1", meta='{"namespace":"team"}')], owner="w", ttl_seconds=30)
    await ledger.reserve_batch([port_pod("a", "n2", meta='{"namespace":"team"}')], owner="w", ttl_seconds=30)
    await ledger.release("a")
    changes = await ledger.changes(start)
    pods = [[item for item in change.items if item[0][:2] in ("p:", "x:")] for change in changes]
    assert pods == [[("p:a", 'n1\n{"namespace":"team"}')], [("p:a", 'n2\n{"namespace":"team"}')], [("x:a", "n2")]]
