"""The preemption driver (workers.preempt.Preemptor): the ledger hold, the Eviction API, nominatedNodeName and the
messages, with a real ledger script run by fakeredis and an in-process HTTPS server standing in for the
apiserver (it records every request)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from hoss.framework.cycle import Profile
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import PlacedPod
from hoss.framework.profiles import load_profiles
from hoss.kube.rest import KubeREST
from hoss.ledger.arguments import NodeRow
from hoss.ledger.client import Ledger
from hoss.model.objects import Json
from tests.kube_objects import node_row, raw_node, raw_pod, table
from tests.unit.tls_apiserver import Seen, TLSApiserver, status
from workers.preempt import Preemptor

NODE = {"cpu": "4", "memory": "16Gi", "pods": "110"}
ALLOC = {"cpu": 4000, "memory": 16 << 30, "pods": 110}
POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"


@pytest.fixture
def profile() -> Profile:
    profiles, default = load_profiles(POLICIES)
    return profiles[default]


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[TLSApiserver]:
    refuse = {"value": False}

    async def respond(seen: Seen) -> web.StreamResponse:
        if seen.raw_path == "/apis/policy/v1/poddisruptionbudgets":
            return web.json_response({"kind": "PodDisruptionBudgetList", "items": []})
        if seen.raw_path.endswith("/eviction") and refuse["value"]:
            return status(429, "Cannot evict pod as it would violate the pod's disruption budget.", "TooManyRequests")
        return web.json_response({}, status=201 if seen.method == "POST" else 200)

    server = TLSApiserver(tmp_path, respond=respond)
    server.refuse = refuse  # type: ignore[attr-defined]
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    """n1 and n2 as NODE says, with no description (the preemptor reads the table, not the ledger's nodes)."""
    return [node_row("n1", ALLOC, described=False), node_row("n2", ALLOC, described=False)]


@pytest.fixture
async def preemptor(apiserver: TLSApiserver, ledger: Ledger) -> AsyncIterator[tuple[Preemptor, list[Json]]]:
    events: list[Json] = []
    async with await KubeREST.connect(str(apiserver.kubeconfig())) as rest:
        yield Preemptor(rest, ledger, record=events.append, component="hoss-worker/w", hold_seconds=60), events


def place(nodes: NodeTable, name: str, node: str, *, cpu: int, priority: int) -> PlacedPod:
    pod = PlacedPod(uid=f"uid-{name}", node=node, namespace="team", labels={"app": name}, ports=(), name=name,
                    priority=priority, request={"cpu": cpu, "pods": 1}, created="2026-01-01T00:00:00Z")
    nodes.place_pod(pod)
    nodes.add_used(node, pod.request)
    return pod


def gone(nodes: NodeTable, pod: PlacedPod) -> None:
    nodes.remove_pod(pod.uid)
    nodes.sub_used(pod.node, pod.request)


def urgent(priority: int = 100, policy: str | None = None) -> tuple[PodView, Json]:
    raw = raw_pod("urgent", {"cpu": "2"})
    raw["spec"]["priority"] = priority
    if policy is not None:
        raw["spec"]["preemptionPolicy"] = policy
    return parse_pod(raw), raw


def requests(apiserver: TLSApiserver) -> list[tuple[str, str]]:
    return [(seen.method, seen.raw_path) for seen in apiserver.seen]


async def test_holds_the_room_evicts_then_nominates_and_waits_while_its_victim_leaves(
    profile: Profile, apiserver: TLSApiserver, ledger: Ledger, preemptor: tuple[Preemptor, list[Json]]
) -> None:
    driver, events = preemptor
    nodes = table(raw_node("n1", NODE))
    place(nodes, "a", "n1", cpu=2000, priority=1)
    b = place(nodes, "b", "n1", cpu=2000, priority=1)
    pod, raw = urgent()
    message = await driver.attempt(profile, pod, raw, nodes, "0/1 nodes are available: 1 Insufficient cpu.")
    assert message == ("0/1 nodes are available: 1 Insufficient cpu. preemption: in progress on node n1: evicted 1 "
                       "lower-priority pod(s) (team/b); the room is held for this pod.")
    assert requests(apiserver) == [("GET", "/apis/policy/v1/poddisruptionbudgets"),
                                   ("POST", "/api/v1/namespaces/team/pods/b/eviction"),
                                   ("PATCH", "/api/v1/namespaces/team/pods/urgent/status")]
    eviction = json.loads(apiserver.seen[1].body)
    assert eviction["kind"] == "Eviction" and eviction["deleteOptions"]["preconditions"] == {"uid": "uid-b"}
    assert json.loads(apiserver.seen[2].body) == {"status": {"nominatedNodeName": "n1"}}
    assert [(e["reason"], e["message"], e["involvedObject"]["name"]) for e in events] == \
        [("Preempted", "Preempted by team/urgent on node n1", "b")]
    assert {uid: n.node for uid, n in (await ledger.nominations()).items()} == {"uid-urgent": "n1"}

    # Its victim is still on the node: it waits, without another request.
    message = await driver.attempt(profile, pod, raw, nodes, "no room.")
    assert message == ("no room. preemption: in progress on node n1: waiting for 1 evicted pod(s) to leave; the "
                       "room is held for this pod.")
    assert len(apiserver.seen) == 3
    # The victim left: the pod fits (it is placed on its next decision), nothing more is evicted.
    gone(nodes, b)
    assert (await driver.attempt(profile, pod, raw, nodes, "stale.")).endswith("not needed: a node has room now; "
                                                                             "retrying.")
    assert len(apiserver.seen) == 3


async def test_a_preemptor_whose_room_was_taken_looks_again(
    profile: Profile, apiserver: TLSApiserver, ledger: Ledger, preemptor: tuple[Preemptor, list[Json]]
) -> None:
    driver, _events = preemptor
    nodes = table(raw_node("n1", NODE), raw_node("n2", NODE))
    place(nodes, "a", "n1", cpu=2000, priority=10)
    b = place(nodes, "b", "n1", cpu=2000, priority=1)
    place(nodes, "c", "n2", cpu=2000, priority=5)
    place(nodes, "d", "n2", cpu=2000, priority=5)
    pod, raw = urgent()
    assert "in progress on node n1" in await driver.attempt(profile, pod, raw, nodes, "full.")
    # b (priority 1) left, but a pod of higher priority took its room before the preemptor was retried: on n1 only
    # a (priority 10) could go now, on n2 c (priority 5), so it looks again and moves its hold to n2.
    gone(nodes, b)
    place(nodes, "boss", "n1", cpu=2000, priority=1000)
    message = await driver.attempt(profile, pod, raw, nodes, "full.")
    assert message.startswith("full. preemption: in progress on node n2: evicted 1 lower-priority pod(s)")
    assert {uid: n.node for uid, n in (await ledger.nominations()).items()} == {"uid-urgent": "n2"}
    assert requests(apiserver)[-2][1] == "/api/v1/namespaces/team/pods/d/eviction"  # c (same age, lower uid) kept


async def test_a_refused_eviction_gives_the_room_back_and_nominates_nothing(
    profile: Profile, apiserver: TLSApiserver, ledger: Ledger, preemptor: tuple[Preemptor, list[Json]]
) -> None:
    driver, events = preemptor
    apiserver.refuse["value"] = True  # type: ignore[attr-defined]
    nodes = table(raw_node("n1", NODE))
    place(nodes, "a", "n1", cpu=4000, priority=1)
    pod, raw = urgent()
    message = await driver.attempt(profile, pod, raw, nodes, "full.")
    assert message.startswith("full. preemption: eviction on node n1 refused for team/a: 429: Cannot evict pod")
    assert message.endswith("; the pod waits.")
    assert [m for m, _p in requests(apiserver)] == ["GET", "POST"]  # no nominatedNodeName
    assert events == [] and await ledger.nominations() == {}


async def test_preemption_policy_never_asks_nothing_and_evicts_nothing(
    profile: Profile, apiserver: TLSApiserver, ledger: Ledger, preemptor: tuple[Preemptor, list[Json]]
) -> None:
    driver, events = preemptor
    nodes = table(raw_node("n1", NODE))
    place(nodes, "a", "n1", cpu=4000, priority=1)
    pod, raw = urgent(policy="Never")
    assert await driver.attempt(profile, pod, raw, nodes, "full.") == \
        "full. preemption: not eligible due to preemptionPolicy=Never."
    assert apiserver.seen == [] and events == [] and await ledger.nominations() == {}


def member(name: str, cpu: str = "3") -> tuple[PodView, Json]:
    raw = raw_pod(name, {"cpu": cpu})
    raw["metadata"]["uid"] = f"uid-{name}"
    raw["spec"]["priority"] = 100
    return parse_pod(raw), raw


def full_cluster() -> NodeTable:
    """n1 and n2 (4 cpu each) each hold two 2-cpu pods of priority 1."""
    nodes = table(raw_node("n1", NODE), raw_node("n2", NODE))
    for node in ("n1", "n2"):
        for i in range(2):
            place(nodes, f"low-{node}-{i}", node, cpu=2000, priority=1)
    return nodes


async def test_a_gang_preempts_for_every_member_after_a_dry_run_of_every_eviction(
    profile: Profile, apiserver: TLSApiserver, ledger: Ledger, preemptor: tuple[Preemptor, list[Json]]
) -> None:
    driver, events = preemptor
    nodes = full_cluster()
    message = await driver.attempt_gang(profile, "gang-a", [member("m1"), member("m2")], nodes, "no room.")
    assert message == ("no room. preemption: in progress for the gang: evicted 4 lower-priority pod(s) on 2 node(s) "
                       "for 2 member(s); the room is held for them.")
    evictions = [(seen.raw_path.split("/")[-2], seen.query.get("dryRun")) for seen in apiserver.seen
                 if seen.raw_path.endswith("/eviction")]
    # every eviction is tried as a dry run before any is made
    assert [dry for _name, dry in evictions] == ["All"] * 4 + [None] * 4
    assert sorted(name for name, dry in evictions if dry is None) == [
        "low-n1-0", "low-n1-1", "low-n2-0", "low-n2-1"]
    assert {uid: hold.node for uid, hold in (await ledger.nominations()).items()} == {"uid-m1": "n1", "uid-m2": "n2"}
    assert len(events) == 4 and len(nodes.pods) == 4, "the plan left the table as it was"


async def test_a_gang_that_cannot_make_room_for_every_member_evicts_nothing(
    profile: Profile, apiserver: TLSApiserver, ledger: Ledger, preemptor: tuple[Preemptor, list[Json]]
) -> None:
    driver, events = preemptor
    nodes = full_cluster()
    # three 3-cpu members on two 4-cpu nodes: two could preempt, the third never fits, so none does
    message = await driver.attempt_gang(profile, "gang-b", [member("m1"), member("m2"), member("m3")], nodes, "x.")
    assert message == "x. preemption: no victims make room for every member of the gang; nothing was evicted."
    assert not [seen for seen in apiserver.seen if seen.raw_path.endswith("/eviction")]
    assert await ledger.nominations() == {} and events == []
    assert len(nodes.pods) == 4 and nodes.used_of("n1") == {"cpu": 4000, "pods": 2}


async def test_a_budget_refusing_one_dry_run_keeps_every_victim_of_the_gang(
    profile: Profile, apiserver: TLSApiserver, ledger: Ledger, preemptor: tuple[Preemptor, list[Json]]
) -> None:
    driver, events = preemptor
    apiserver.refuse["value"] = True  # type: ignore[attr-defined]
    message = await driver.attempt_gang(profile, "gang-c", [member("m1"), member("m2")], full_cluster(), "x.")
    assert message.startswith("x. preemption: eviction refused for team/low-n1-")
    assert message.endswith("(dry run); nothing was evicted; the gang waits.")
    assert all(seen.query.get("dryRun") == "All" for seen in apiserver.seen if seen.raw_path.endswith("/eviction"))
    assert await ledger.nominations() == {} and events == []
