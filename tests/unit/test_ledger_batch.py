"""The ledger's batch operations and change stream against fakeredis (its Lua runs the real scripts)."""

from __future__ import annotations

import fakeredis
import pytest

from hoss.ledger.arguments import BoundPod, NodeRow
from hoss.ledger.client import Ledger
from hoss.ledger.keys import PODVER_KEY
from hoss.ledger.replies import parse_used
from hoss.ledger.results import Confirmed, Conflict, HeldElsewhere, NeedRequest, Reserved, Stale, UnknownNode
from tests.kube_objects import batch_pod

N1 = {"cpu": 4000, "memory": 8 << 30, "pods": 110}
N2 = {"cpu": 2000, "memory": 4 << 30, "pods": 110}


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    """n1 with a stand-in description, n2 with none; of different sizes."""
    return [("n1", N1, {}, '{"spec":1}'), ("n2", N2, {}, "")]


async def test_batch_reserves_in_order_and_falls_back_to_the_next_candidate(ledger: Ledger) -> None:
    results = await ledger.reserve_batch(
        [batch_pod("a", "n2", cpu=1500), batch_pod("b", "n2", "n1", cpu=1000), batch_pod("c", "n2", cpu=600),
         batch_pod("d", "n9", "n2", cpu=100), batch_pod("e", "n9")],
        owner="w1", ttl_seconds=30)
    assert results == [
        Reserved("n2"),
        Reserved("n1"),  # n2 has 500 left after a
        Conflict(node="n2", resource="cpu", wanted=600, free=500),
        Reserved("n2"),  # an unknown first candidate is skipped
        UnknownNode("n9"),
    ]
    usage = await ledger.node_usage(["n1", "n2"])
    assert usage["n2"][1]["cpu"] == 1600 and usage["n1"][1]["cpu"] == 1000


async def test_batch_reports_stale_versions_and_bound_pods(
    ledger: Ledger, fake_redis: fakeredis.FakeAsyncRedis
) -> None:
    await fake_redis.hset(PODVER_KEY, mapping={"changed": "d2", "gone": "gone", "same": "d1"})
    await ledger.bind(uid="bound", pod="ns/bound", node="n1", request={"cpu": 100, "pods": 1})
    decided_on_d1 = [batch_pod(uid, node, digest="d1") for uid, node in
                     (("changed", "n1"), ("gone", "n1"), ("same", "n1"), ("bound", "n2"))]
    results = await ledger.reserve_batch(decided_on_d1, owner="w1", ttl_seconds=30)
    assert results == [Stale("d2"), Stale("gone"), Reserved("n1"), HeldElsewhere(node="n1", state="bound")]
    assert (await ledger.node_usage(["n1"]))["n1"][1]["cpu"] == 1100


async def test_confirm_without_request_needs_an_entry(ledger: Ledger) -> None:
    assert await ledger.confirm(uid="x", pod="ns/x", node="n1", request=None, owner="w", verify_after_seconds=5) \
        == NeedRequest()
    await ledger.reserve_batch([batch_pod("x", "n1")], owner="w1", ttl_seconds=30)
    assert await ledger.confirm(uid="x", pod="ns/x", node="n1", request=None, owner="w", verify_after_seconds=5) \
        == Confirmed(node="n1", foreign=False)
    assert await ledger.confirm(uid="x", pod="ns/x", node="n2", request=None, owner="w", verify_after_seconds=5) \
        == HeldElsewhere(node="n1", state="admitted")


async def test_bind_many_and_release_many(ledger: Ledger) -> None:
    await ledger.reserve_batch([batch_pod("a", "n1")], owner="w1", ttl_seconds=30)
    await ledger.bind_many([BoundPod(uid="a", pod="ns/a", node="n2", request={"cpu": 1000, "pods": 1}),
                            BoundPod(uid="b", pod="ns/b", node="n1", request={"cpu": 300, "pods": 1})])
    entries = {e.uid: (e.node, e.state) for e in await ledger.entries()}
    assert entries == {"a": ("n2", "bound"), "b": ("n1", "bound")}
    assert await ledger.release_many(["a", "b", "nobody"]) == 2
    usage = await ledger.node_usage(["n1", "n2"])
    assert usage["n1"][1] == {} and usage["n2"][1] == {}


async def test_load_then_follow_the_change_stream(ledger: Ledger) -> None:
    loaded = await ledger.load()
    assert loaded.ready and loaded.nodes == {"n1": ('{"spec":1}', {}), "n2": ("", {})}
    await ledger.reserve_batch([batch_pod("a", "n1", cpu=700)], owner="w1", ttl_seconds=30)
    await ledger.sync_node(node="n3", allocatable={"cpu": 1000}, spec='{"n3":1}')
    await ledger.release("a")
    await ledger.remove_node("n2")
    changes = await ledger.changes(loaded.last_change)
    assert [(c.kind, c.items) for c in changes] == [
        ("u", [("n1", "cpu=700,pods=1"), ("p:a", "n1\n")]),
        ("s", [("n3", '{"n3":1}')]),
        ("u", [("n3", "")]),
        ("u", [("n1", ""), ("x:a", "n1")]),
        ("d", [("n2", "")]),
    ]
    assert parse_used("cpu=700,pods=1") == {"cpu": 700, "pods": 1}
    await ledger.rebuild(nodes=[("n1", N1, {}, "")], bound=[])
    after = await ledger.changes(changes[-1].id)
    assert [c.kind for c in after] == ["r"]
    assert await ledger.first_change() is not None


async def test_a_node_named_t_does_not_clash_with_the_kind(ledger: Ledger) -> None:
    loaded = await ledger.load()
    await ledger.sync_node(node="t", allocatable={"cpu": 1000, "pods": 10}, spec="{}")
    await ledger.reserve_batch([batch_pod("a", "t", cpu=10)], owner="w1", ttl_seconds=30)
    changes = await ledger.changes(loaded.last_change)
    assert changes[-1].kind == "u" and changes[-1].items == [("t", "cpu=10,pods=1"), ("p:a", "t\n")]
