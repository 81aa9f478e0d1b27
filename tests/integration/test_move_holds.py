"""The rescheduler's holds in the ledger (hoss/ledger/lua/hold_moves.lua, 'Nominations' in common.lua) on a real
redis-server: all or nothing and fit-checked, kept from every other pod and foreign binding, claimed by the pod
they are for (the pending pod by uid, a moved pod's replacement by its controller), announced to the workers; and
the executor (rescheduler/execute.py) over them: a replacement that asks more than the moved pod has its hold
dropped and is placed as any pod, the plan saying so."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from hoss.ledger.arguments import BatchPod, MoveHold, Placement
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed, Conflict, Reserved
from hoss.model.objects import Json
from hoss.model.resources import pod_requests
from rescheduler.cluster import ClusterView
from rescheduler.execute import EvictionLimit, Executor
from rescheduler.plan import Move, Node, Plan, Pod, fragmentation, plan_for_pending
from tests.waiting import until

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
NODE = {"cpu": 96_000, "memory": 768 << 30, "pods": 110, GPU: 8}


def meta(owner: str = "", priority: int = 0) -> str:
    value: dict[str, object] = {"namespace": "ns"}
    if owner:
        value["owner"] = owner
    if priority:
        value["priority"] = priority
    return orjson.dumps(value).decode()


def gpus(n: int) -> dict[str, int]:
    return {"cpu": 1000, "pods": 1, GPU: n}


def item(uid: str, *candidates: str, n: int, owner: str = "", priority: int = 0) -> BatchPod:
    return BatchPod(uid=uid, pod=f"ns/{uid}", digest="", candidates=candidates, request=gpus(n),
                    meta=meta(owner, priority))


@pytest.fixture
async def example(ledger: Ledger) -> Ledger:
    """node1 runs A (4 GPUs) and B (3), node2 is empty: the issue's example."""
    await ledger.rebuild(nodes=[("node1", NODE, {}), ("node2", NODE, {})], bound=[
        Placement(uid="a", pod="ns/a", node="node1", request=gpus(4), meta=meta("rs-a")),
        Placement(uid="b", pod="ns/b", node="node1", request=gpus(3), meta=meta("rs-b")),
    ])
    return ledger


def plan_holds() -> list[MoveHold]:
    # C (pending, 4 GPUs) on node1, counting the 3 B frees there; B's replacement (controller rs-b) on node2.
    return [MoveHold(key="c", node="node1", request=gpus(4), freeing=gpus(3)),
            MoveHold(key="move/b", node="node2", request=gpus(3), owner="rs-b")]


async def test_holds_are_all_or_nothing_and_fit_checked(example: Ledger) -> None:
    # Without counting B's departure C's hold does not fit node1: nothing is held, B's hold included.
    refused = await example.hold_moves([MoveHold(key="move/b", node="node2", request=gpus(3), owner="rs-b"),
                                        MoveHold(key="c", node="node1", request=gpus(4))], ttl_seconds=60)
    assert refused == Conflict(node="node1", resource=GPU, wanted=4, free=1)
    assert await example.nominations() == {}
    assert await example.hold_moves(plan_holds(), ttl_seconds=60) is None
    held = await example.nominations()
    assert {(k, h.node, h.owner, h.pin) for k, h in held.items()} == {("c", "node1", "", True),
                                                                      ("move/b", "node2", "rs-b", True)}
    # A second plan cannot hold room already held: node2 has 8 - 3 left.
    refused = await example.hold_moves([MoveHold(key="move/x", node="node2", request=gpus(6), owner="rs-x")],
                                       ttl_seconds=60)
    assert refused == Conflict(node="node2", resource=GPU, wanted=6, free=5)
    # A pending pod already placed is not held for.
    await example.reserve_batch([item("d", "node2", n=1)], owner="w", ttl_seconds=30)
    assert await example.hold_moves([MoveHold(key="d", node="node2", request=gpus(1))], ttl_seconds=60) == "node2"


async def test_held_room_is_kept_from_other_pods_of_any_priority_and_from_foreign_bindings(example: Ledger) -> None:
    await example.hold_moves(plan_holds(), ttl_seconds=60)
    results = await example.reserve_batch([item("x", "node2", n=6, priority=2_000_001_000)], owner="w",
                                          ttl_seconds=30)
    assert results == [Conflict(node="node2", resource=f"{GPU} (held for a preempting pod)", wanted=6, free=5)]
    refused = await example.confirm(uid="f", pod="ns/f", node="node2", request=gpus(6), owner="foreign:k",
                                    verify_after_seconds=30, meta=meta())
    assert isinstance(refused, Conflict)
    # A pod of another controller cannot claim B's hold; a replacement asking more than was held cannot either.
    results = await example.reserve_batch([item("y", "node2", n=8, owner="rs-y"),
                                           item("b-big", "node2", n=8, owner="rs-b")], owner="w", ttl_seconds=30)
    assert isinstance(results, list) and [type(r) for r in results] == [Conflict, Conflict]
    # Room beside the hold stays usable: 5 GPUs on node2.
    assert await example.reserve_batch([item("z", "node2", n=5)], owner="w", ttl_seconds=30) == [Reserved("node2")]


async def test_the_replacement_and_the_pending_pod_claim_their_holds(example: Ledger) -> None:
    await example.hold_moves(plan_holds(), ttl_seconds=60)
    # B's replacement (same controller, same shape) takes node2's held room, and the hold ends.
    assert await example.reserve_batch([item("b2", "node2", n=3, owner="rs-b")], owner="w",
                                       ttl_seconds=30) == [Reserved("node2")]
    assert set(await example.nominations()) == {"c"}
    # B leaves node1; only C may take the 4 GPUs freed there.
    await example.release_many(["b"])
    results = await example.reserve_batch([item("other", "node1", n=4, priority=1000)], owner="w", ttl_seconds=30)
    assert isinstance(results, list) and isinstance(results[0], Conflict)
    assert await example.reserve_batch([item("c", "node1", n=4)], owner="w", ttl_seconds=30) == [Reserved("node1")]
    assert await example.nominations() == {}
    usage = await example.node_usage(["node1", "node2"])
    assert usage["node1"][1][GPU] == 8 and usage["node2"][1][GPU] == 3


async def test_a_foreign_binding_of_the_replacement_claims_the_hold(example: Ledger) -> None:
    await example.hold_moves(plan_holds(), ttl_seconds=60)
    allowed = await example.confirm(uid="b2", pod="ns/b2", node="node2", request=gpus(3), owner="foreign:k",
                                    verify_after_seconds=30, meta=meta("rs-b"))
    assert allowed == Confirmed("node2", foreign=True)
    assert set(await example.nominations()) == {"c"}


async def test_holds_are_announced_on_the_change_stream_and_end_at_their_deadline(example: Ledger) -> None:
    start = (await example.load()).last_change
    await example.hold_moves(plan_holds(), ttl_seconds=0.05)
    await example.unnominate("c")
    changes = [c for c in await example.changes(start) if c.kind == "h"]
    assert [(c.items[0][0], bool(c.items[0][1])) for c in changes] == [("c", True), ("move/b", True),
                                                                       ("c", False)]
    held = orjson.loads(changes[1].items[0][1])
    assert held["owner"] == "rs-b" and held["node"] == "node2"
    # Past its deadline (on the Redis clock) the hold no longer counts, and the first script that meets it drops
    # and announces it.
    async def room_taken() -> tuple[bool, str]:
        results = await example.reserve_batch([item("x", "node2", n=8)], owner="w", ttl_seconds=30)
        return results == [Reserved("node2")], str(results)

    await until(room_taken, timeout=10, what="the held room to be free for any pod once the hold's deadline passed")
    assert [c.items[0] for c in await example.changes(start) if c.kind == "h"][-1] == ("move/b", "")


class Apiserver:
    """The calls the executor makes, in memory (the ledger is the real one): an eviction removes the pod, and its
    ReplicaSet creates the replacement, whose template now asks `replacement_gpus`."""

    def __init__(self, pods: list[Json], replacement_gpus: int) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.replacement_gpus = replacement_gpus
        self.evicted = asyncio.Event()

    async def request(self, method: str, path: str, *, body: Any = None, params: Any = None,
                      content_type: str | None = None) -> Json:
        if method == "POST" and path.endswith("/eviction"):
            moved = self.pods.pop(path.split("/")[-2])
            replacement = raw_pod(f"{moved['metadata']['name']}-2", self.replacement_gpus,
                                  owner=moved["metadata"]["ownerReferences"][0]["uid"])
            self.pods[replacement["metadata"]["name"]] = replacement
            self.evicted.set()
            return {}
        if method == "GET":
            return {"items": list(self.pods.values())}
        raise AssertionError(f"unexpected call {method} {path}")


def raw_pod(name: str, n: int, *, owner: str, node: str = "") -> Json:
    return {"metadata": {"name": name, "namespace": "ns", "uid": name,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                              "uid": owner, "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {
                "cpu": "1", GPU: str(n)}, "limits": {GPU: str(n)}}}]}}


async def test_a_replacement_asking_more_is_placed_normally_and_its_hold_dropped(example: Ledger) -> None:
    # The plan moves B (3 GPUs) to node2 for C (4, pending) on node1; B's ReplicaSet meanwhile asks 6 GPUs.
    moved = [raw_pod("a", 4, owner="rs-a", node="node1"), raw_pod("b", 3, owner="rs-b", node="node1")]
    view_pods = [Pod(key=f"ns/{p['metadata']['name']}", uid=p["metadata"]["uid"], node="node1",
                     request=pod_requests(p), owner=p["metadata"]["ownerReferences"][0]["uid"]) for p in moved]
    pending = Pod(key="ns/c", uid="c", node="", request=pod_requests(raw_pod("c", 4, owner="rs-c")))
    usage = await example.node_usage(["node1", "node2"])
    nodes = [Node(name=name, alloc=alloc, used=used) for name, (alloc, used) in usage.items()]
    plan = plan_for_pending(pending, nodes, view_pods)
    assert plan is not None and [(m.pod.key, m.target) for m in plan.moves] == [("ns/b", "node2")]
    view = ClusterView(nodes=nodes, placed=view_pods, pending=[pending], allowed={},
                       raw={p["metadata"]["uid"]: p for p in moved}, gated=set())
    apiserver = Apiserver(moved, replacement_gpus=6)
    executor = Executor(apiserver, example, limit=EvictionLimit(10), hold_seconds=60,  # type: ignore[arg-type]
                        outcome_timeout_seconds=30)
    run = asyncio.create_task(executor.run(plan, view))
    # While the hold stands the 6-GPU replacement fits nowhere (node2: 8 free, 3 held): it must be dropped.
    await asyncio.wait_for(apiserver.evicted.wait(), timeout=10)
    await example.release_many(["b"])  # B's entry leaves with B (the sync does this)
    assert await example.reserve_batch([item("c", "node1", n=4)], owner="w", ttl_seconds=30) == [Reserved("node1")]
    record = await asyncio.wait_for(run, timeout=20)
    assert record.outcome == "replacement larger"
    assert record.detail == ("replacement ns/b-2 of ns/b asks more (nvidia.com/gpu 6 (moved pod: 3)): it cannot "
                             "take the room held on node2, which was dropped; it is placed as any pod")
    assert record.to_json()["outcome"] == "replacement larger"
    # Nothing is left held, and the replacement is placed as any pod: node2's 8 GPUs are free for it.
    assert await example.nominations() == {}
    assert await example.reserve_batch([item("b-2", "node2", n=6, owner="rs-b")], owner="w",
                                       ttl_seconds=30) == [Reserved("node2")]


async def test_a_replacement_asking_no_more_claims_its_hold(example: Ledger) -> None:
    moved = [raw_pod("b", 3, owner="rs-b", node="node1")]
    pod = Pod(key="ns/b", uid="b", node="node1", request=pod_requests(moved[0]), owner="rs-b")
    usage = await example.node_usage(["node1", "node2"])
    nodes = [Node(name=name, alloc=alloc, used=used) for name, (alloc, used) in usage.items()]
    plan = Plan(reason="fragmentation", moves=(Move(pod=pod, source="node1", target="node2"),),
                before=fragmentation([]), after=fragmentation([]))
    view = ClusterView(nodes=nodes, placed=[pod], pending=[], allowed={}, raw={"b": moved[0]}, gated=set())
    apiserver = Apiserver(moved, replacement_gpus=3)
    executor = Executor(apiserver, example, limit=EvictionLimit(10), hold_seconds=60,  # type: ignore[arg-type]
                        outcome_timeout_seconds=30)
    run = asyncio.create_task(executor.run(plan, view))
    await asyncio.wait_for(apiserver.evicted.wait(), timeout=10)
    replacement = raw_pod("b-2", 3, owner="rs-b")
    assert await example.reserve_batch([BatchPod(uid="b-2", pod="ns/b-2", digest="", candidates=("node2",),
                                                 request=pod_requests(replacement), meta=meta("rs-b"))],
                                       owner="w", ttl_seconds=30) == [Reserved("node2")]
    record = await asyncio.wait_for(run, timeout=20)
    assert (record.outcome, record.detail) == ("completed", "every held room was taken by the pod it was held for")
