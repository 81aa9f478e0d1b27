"""NodePorts over the workers' pod index, and the index fed from the ledger (load + change stream)."""

from __future__ import annotations

import numpy as np
import pytest

from hoss.framework.cycle import Profile, decide
from hoss.framework.feed import NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.ports import PORTS_TAKEN, NodePorts
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import HostPort, PlacedPod
from hoss.ledger.arguments import BatchPod, BoundPod, NodeRow
from hoss.ledger.client import Ledger
from hoss.model import compact
from tests.kube_objects import Json, node_row, raw_node, raw_pod, table
from workers.gang import place_gang


def with_ports(name: str, *ports: Json) -> Json:
    pod = raw_pod(name)
    pod["spec"]["containers"][0]["ports"] = list(ports)
    return pod


def wanting(*ports: Json) -> PodView:
    return parse_pod(with_ports("new", *ports))


def holding(nodes: NodeTable, uid: str, node: str, *ports: str) -> None:
    nodes.place_pod(PlacedPod(uid=uid, node=node, namespace="team", labels={},
                              ports=tuple(p for p in map(HostPort.parse, ports) if p is not None)))


def passing(pod: PodView, nodes: NodeTable) -> list[str]:
    result = NodePorts().filter(pod, nodes)
    return [name for row, name in enumerate(nodes.names) if result.mask[row]]


def three() -> NodeTable:
    return table(raw_node("a"), raw_node("b"), raw_node("c"))


def test_a_pod_without_host_ports_passes_every_node() -> None:
    nodes = three()
    holding(nodes, "x", "a", "TCP/0.0.0.0/80")
    assert passing(parse_pod(raw_pod("plain")), nodes) == ["a", "b", "c"]


def test_hostip_0000_against_a_specific_ip_conflicts_both_ways() -> None:
    nodes = three()
    holding(nodes, "x", "a", "TCP/10.0.0.1/80")
    holding(nodes, "y", "b", "TCP/0.0.0.0/80")
    assert passing(wanting({"containerPort": 80, "hostPort": 80}), nodes) == ["c"]
    assert passing(wanting({"containerPort": 80, "hostPort": 80, "hostIP": "10.0.0.1"}), nodes) == ["c"]
    assert passing(wanting({"containerPort": 80, "hostPort": 80, "hostIP": "10.0.0.2"}), nodes) == ["a", "c"]


def test_protocol_and_port_must_both_match() -> None:
    nodes = three()
    holding(nodes, "x", "a", "UDP/0.0.0.0/53")
    holding(nodes, "y", "b", "TCP/0.0.0.0/54")
    assert passing(wanting({"containerPort": 53, "hostPort": 53}), nodes) == ["a", "b", "c"]
    assert passing(wanting({"containerPort": 53, "hostPort": 53, "protocol": "UDP"}), nodes) == ["b", "c"]


def test_a_removed_pod_frees_its_port_and_the_reason_is_kube_schedulers() -> None:
    nodes = three()
    holding(nodes, "x", "a", "TCP/0.0.0.0/80")
    holding(nodes, "y", "a", "TCP/0.0.0.0/80")
    result = NodePorts().filter(wanting({"containerPort": 80, "hostPort": 80}), nodes)
    assert list(result.reasons) == [PORTS_TAKEN] == ["node(s) didn't have free ports for the requested pod ports"]
    nodes.remove_pod("x")
    assert passing(wanting({"containerPort": 80, "hostPort": 80}), nodes) == ["b", "c"]
    nodes.remove_pod("y")
    assert passing(wanting({"containerPort": 80, "hostPort": 80}), nodes) == ["a", "b", "c"]


def test_the_unschedulable_message_counts_port_conflicts() -> None:
    nodes = table(raw_node("a"), raw_node("b"))
    holding(nodes, "x", "a", "TCP/0.0.0.0/80")
    holding(nodes, "y", "b", "TCP/0.0.0.0/80")
    decision = decide(Profile(name="p", filters=[NodePorts()], scores=[]),
                      wanting({"containerPort": 80, "hostPort": 80}), nodes, rng=np.random.default_rng(0))
    assert decision.message == (  # type: ignore[union-attr]
        "0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports.")


def test_removing_a_node_drops_its_pods_from_the_index() -> None:
    nodes = three()
    holding(nodes, "x", "a", "TCP/0.0.0.0/80")
    nodes.remove_node("a")
    assert nodes.pods == {} and nodes.pods_on == {}


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    return [node_row("a"), node_row("b")]


@pytest.fixture
def ledger_bound() -> list[BoundPod]:
    """"old", bound on a, holding host port 80."""
    ports, meta = compact.pod_meta(with_ports("old", {"containerPort": 80, "hostPort": 80}))
    return [BoundPod(uid="old", pod="team/old", node="a", request={"cpu": 100, "pods": 1}, ports=ports, meta=meta)]


async def test_the_feed_loads_the_pod_index_and_follows_placements_and_removals(ledger: Ledger) -> None:
    nodes = NodeTable()
    feed = NodeFeed(ledger, nodes, block_ms=1)
    assert await feed.load()
    assert set(nodes.pods) == {"old"} and nodes.pods["old"].ports == (HostPort("TCP", "0.0.0.0", 80),)
    assert nodes.pods["old"].namespace == "team"
    ports, meta = compact.pod_meta(with_ports("new", {"containerPort": 81, "hostPort": 81}))
    await ledger.reserve_batch([BatchPod(uid="new", pod="team/new", digest="", candidates=["b"],
                                         request={"cpu": 100, "pods": 1}, ports=ports, meta=meta)],
                               owner="w", ttl_seconds=30)
    await ledger.release("old")
    await feed.step()
    assert set(nodes.pods) == {"new"} and nodes.pods_on == {"b": {"new"}}
    assert passing(wanting({"containerPort": 81, "hostPort": 81}), nodes) == ["a"]
    assert passing(wanting({"containerPort": 80, "hostPort": 80}), nodes) == ["a", "b"]


def test_gang_members_never_share_a_host_port_on_a_node() -> None:
    nodes = table(raw_node("a"), raw_node("b"), raw_node("c"))
    members = [parse_pod(with_ports(f"m{i}", {"containerPort": 80, "hostPort": 80})) for i in range(3)]
    profile = Profile(name="p", filters=[NodePorts()], scores=[])
    placed = place_gang(profile, members, nodes, rng=np.random.default_rng(0), min_available=3, topology_key=None,
                        gang="team/g")
    assert sorted(placed.assignments.values()) == ["a", "b", "c"]  # type: ignore[union-attr]
    assert nodes.pods == {}, "the real pod index is untouched"
    four = [*members, parse_pod(with_ports("m3", {"containerPort": 80, "hostPort": 80}))]
    refused = place_gang(profile, four, nodes, rng=np.random.default_rng(0), min_available=4, topology_key=None,
                         gang="team/g")
    assert "didn't have free ports for the requested pod ports" in refused.message  # type: ignore[union-attr]
