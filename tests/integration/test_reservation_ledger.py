"""Room held for a future pod (a Reservation) in the ledger on a real redis-server: placed in two steps
(`hold_reservation`, `keep_reservation`), closed to every other pod and to foreign bindings, and taken by the owner
pod that names it in one call (hoss/ledger/lua/reserve_batch.lua, 'Reservations')."""

from __future__ import annotations

import asyncio

from hoss.ledger.arguments import BatchPod, BoundPod, Placement
from hoss.ledger.client import Ledger
from hoss.ledger.keys import reservation_key
from hoss.ledger.results import Conflict, Reserved
from tests.kube_objects import batch_pod

N = {"cpu": 4000, "memory": 8 << 30, "pods": 110}
R = {"cpu": 3000, "pods": 1}


async def held(ledger: Ledger) -> None:
    await ledger.rebuild(nodes=[("n1", N, {}, ""), ("n2", N, {}, "")], bound=[])
    assert await ledger.hold_reservation(uid="r", name="train", candidates=["n1"], request=R, owner="w",
                                         ttl_seconds=30) == Reserved("n1")
    await ledger.keep_reservation(uid="r", name="train", node="n1", request=R)


async def test_held_room_is_closed_to_other_pods_and_foreign_bindings(ledger: Ledger) -> None:
    await held(ledger)
    [entry] = await ledger.entries()
    assert (entry.uid, entry.pod, entry.state, entry.node) == ("r", reservation_key("train"), "bound", "n1")
    assert await ledger.reserve_batch([batch_pod("other", "n1", cpu=2000)], owner="w", ttl_seconds=30) == [
        Conflict(node="n1", resource="cpu", wanted=2000, free=1000)]
    foreign = await ledger.confirm(uid="kube", pod="ns/kube", node="n1", request={"cpu": 2000}, owner="kube-scheduler",
                                   verify_after_seconds=30)
    assert isinstance(foreign, Conflict) and foreign.free == 1000
    # Naming the Reservation is what opens it: any pod naming a uid that is not a Reservation gets nothing.
    assert await ledger.reserve_batch([batch_pod("liar", "n1", cpu=2000, reservation="other")], owner="w",
                                      ttl_seconds=30) == [Conflict(node="n1", resource="cpu", wanted=2000, free=1000)]


async def test_the_owner_takes_the_room_in_one_call_and_the_reservation_holds_nothing_more(ledger: Ledger) -> None:
    await held(ledger)
    before = (await ledger.node_usage(["n1"]))["n1"][1]["cpu"]
    # The owner wants more than the Reservation holds: the Reservation's 3 cpu plus 1 of the node's free room.
    assert await ledger.reserve_batch([batch_pod("owner", "n1", cpu=4000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Reserved("n1", consumed=True)]
    assert (await ledger.node_usage(["n1"]))["n1"][1]["cpu"] == before + 1000
    entries = {e.uid: e for e in await ledger.entries()}
    assert set(entries) == {"owner", "r"} and entries["r"].request == {"cpu": 0, "pods": 0}
    shares = (await ledger.reservation_owners(["r"]))["r"]
    assert [(o.uid, dict(o.share)) for o in shares.owners] == [("owner", {"cpu": 3000, "pods": 1})]
    # allocateOnce: a second owner takes nothing, even of room the Reservation still had.
    assert await ledger.reserve_batch([batch_pod("second", "n1", cpu=1000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Conflict(node="n1", resource="cpu", wanted=1000, free=0)]


async def test_elsewhere_the_owner_is_an_ordinary_pod(ledger: Ledger) -> None:
    await held(ledger)
    assert await ledger.reserve_batch([batch_pod("owner", "n2", cpu=1000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Reserved("n2")]
    assert {e.uid for e in await ledger.entries()} == {"owner", "r"}


async def test_racing_pods_never_take_held_room(ledger: Ledger) -> None:
    """Many callers at once (one connection each): strangers only get the 1 free cpu, the owner gets the held 3."""
    await held(ledger)

    async def stranger(i: int) -> object:
        results = await ledger.reserve_batch([batch_pod(f"s{i}", "n1", cpu=1000)], owner=f"w{i}", ttl_seconds=30)
        assert isinstance(results, list)
        return results[0]

    owner = ledger.reserve_batch([batch_pod("owner", "n1", cpu=3000, reservation="r")], owner="o", ttl_seconds=30)
    results = await asyncio.gather(*(stranger(i) for i in range(8)), owner)
    assert sum(1 for r in results[:8] if r == Reserved("n1")) == 1
    assert results[8] == [Reserved("n1", consumed=True)]
    usage = (await ledger.node_usage(["n1"]))["n1"][1]
    assert usage["cpu"] == 4000


# -- allocateOnce false: several owners share one Reservation ----------------------------------------------

GPU = "nvidia.com/gpu"
SHARED = {"cpu": 4000, GPU: 4, "pods": 4}
SHARED_META = '{"namespace":"ns","priority":2147483647,"reservation":"pool","allocateOnce":false}'
GPU_NODE = {"cpu": 8000, GPU: 8, "pods": 110}


def gpu_pod(uid: str, *candidates: str, gpus: int, reservation: str = "pool-uid") -> BatchPod:
    return BatchPod(uid=uid, pod=f"ns/{uid}", digest="", candidates=candidates,
                    request={"cpu": 1000 * gpus, GPU: gpus, "pods": 1}, reservation=reservation)


async def shared(ledger: Ledger) -> None:
    """A Reservation of 4 GPUs (allocateOnce false) on g1, which has 8; g2 is empty."""
    await ledger.rebuild(nodes=[("g1", GPU_NODE, {}, ""), ("g2", GPU_NODE, {}, "")], bound=[])
    assert await ledger.hold_reservation(uid="pool-uid", name="pool", candidates=["g1"], request=SHARED,
                                         meta=SHARED_META, owner="w", ttl_seconds=30) == Reserved("g1")
    await ledger.keep_reservation(uid="pool-uid", name="pool", node="g1", request=SHARED, meta=SHARED_META)


async def gpus_used(ledger: Ledger, node: str = "g1") -> int:
    return (await ledger.node_usage([node]))[node][1].get(GPU, 0)


async def test_owners_share_the_reservation_while_they_fit_and_the_rest_stays_held(ledger: Ledger) -> None:
    await shared(ledger)
    assert await gpus_used(ledger) == 4
    assert await ledger.reserve_batch([gpu_pod("a", "g1", gpus=2)], owner="w", ttl_seconds=30) == [
        Reserved("g1", consumed=True)]
    # The node counts 4 GPUs: a's 2 came out of the Reservation, whose entry holds the other 2.
    assert await gpus_used(ledger) == 4
    view = (await ledger.reservation_owners(["pool-uid"]))["pool-uid"]
    assert view.room == {"cpu": 2000, GPU: 2, "pods": 4}  # each owner is a pod of its own (Koordinator)
    assert [(o.uid, o.pod, dict(o.share)) for o in view.owners] == [("a", "ns/a", {"cpu": 2000, GPU: 2})]
    # Still closed to a stranger beyond the node's free 4 GPUs, and to a foreign binding.
    assert await ledger.reserve_batch([gpu_pod("s", "g1", gpus=5, reservation="")], owner="w", ttl_seconds=30) == [
        Conflict(node="g1", resource="cpu", wanted=5000, free=4000)]
    foreign = await ledger.confirm(uid="kube", pod="ns/kube", node="g1", request={GPU: 5}, owner="kube-scheduler",
                                   verify_after_seconds=30)
    assert isinstance(foreign, Conflict) and foreign.free == 4
    # A second owner of 2 takes the rest: the Reservation holds nothing, the node still counts 4.
    assert await ledger.reserve_batch([gpu_pod("b", "g1", gpus=2)], owner="w", ttl_seconds=30) == [
        Reserved("g1", consumed=True)]
    view = (await ledger.reservation_owners(["pool-uid"]))["pool-uid"]
    assert view.room == {"cpu": 0, GPU: 0, "pods": 4} and [o.uid for o in view.owners] == ["a", "b"]
    assert await gpus_used(ledger) == 4
    # A third owner does not fit in what is left (nothing): placed as any pod, from the node's free room.
    assert await ledger.reserve_batch([gpu_pod("c", "g1", gpus=1)], owner="w", ttl_seconds=30) == [Reserved("g1")]
    assert await gpus_used(ledger) == 5
    assert [o.uid for o in (await ledger.reservation_owners(["pool-uid"]))["pool-uid"].owners] == ["a", "b"]


async def test_an_owner_asking_more_than_is_left_is_placed_as_any_pod(ledger: Ledger) -> None:
    await shared(ledger)
    assert await ledger.reserve_batch([gpu_pod("a", "g1", gpus=3)], owner="w", ttl_seconds=30) == [
        Reserved("g1", consumed=True)]
    # 1 GPU left in the Reservation: a 2-GPU owner takes nothing of it; on g1 it fits the node's free room.
    assert await ledger.reserve_batch([gpu_pod("b", "g1", gpus=2)], owner="w", ttl_seconds=30) == [Reserved("g1")]
    assert await gpus_used(ledger) == 6
    view = (await ledger.reservation_owners(["pool-uid"]))["pool-uid"]
    assert view.room[GPU] == 1 and [o.uid for o in view.owners] == ["a"]


async def test_an_owners_share_returns_when_its_pod_goes_bound_or_not(ledger: Ledger) -> None:
    await shared(ledger)
    for uid in ("a", "b"):
        assert await ledger.reserve_batch([gpu_pod(uid, "g1", gpus=2)], owner="w", ttl_seconds=30) == [
            Reserved("g1", consumed=True)]
    # The sync sees a bound: its share stays taken (the node still counts 4, the Reservation holds 0).
    await ledger.bind_many([Placement(uid="a", pod="ns/a", node="g1", request={"cpu": 2000, GPU: 2, "pods": 1})])
    assert await gpus_used(ledger) == 4
    assert (await ledger.reservation_owners(["pool-uid"]))["pool-uid"].room[GPU] == 0
    # The pod a is deleted (the sync releases its entry): its 2 GPUs go back to the Reservation, not to the node.
    await ledger.release_many(["a"])
    view = (await ledger.reservation_owners(["pool-uid"]))["pool-uid"]
    assert view.room[GPU] == 2 and [o.uid for o in view.owners] == ["b"]
    assert await gpus_used(ledger) == 4
    assert await ledger.reserve_batch([gpu_pod("s", "g1", gpus=5, reservation="")], owner="w", ttl_seconds=30) == [
        Conflict(node="g1", resource="cpu", wanted=5000, free=4000)]
    # Another owner takes the returned share.
    assert await ledger.reserve_batch([gpu_pod("c", "g1", gpus=2)], owner="w", ttl_seconds=30) == [
        Reserved("g1", consumed=True)]
    assert await gpus_used(ledger) == 4
    # The Reservation ends (the sync releases its entry): only the owners' own entries stay.
    await ledger.release_many(["pool-uid"])
    assert await gpus_used(ledger) == 4
    await ledger.release_many(["b"])
    assert await gpus_used(ledger) == 2
    assert await ledger.reservation_owners(["pool-uid"]) == {}


async def test_the_room_returns_at_once_when_the_owners_binding_fails(ledger: Ledger) -> None:
    """Gap 2: the worker releases the owner's assumed entry (its binding failed): the share is back with the
    Reservation in that call, for allocateOnce (the next owner can use it) and for shared Reservations alike."""
    await held(ledger)
    assert await ledger.reserve_batch([batch_pod("owner", "n1", cpu=3000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Reserved("n1", consumed=True)]
    assert await ledger.release_assumed(uid="owner", node="n1", answered=True)
    entries = {e.uid: e for e in await ledger.entries()}
    assert set(entries) == {"r"} and entries["r"].request == R
    assert await ledger.reserve_batch([batch_pod("other", "n1", cpu=2000)], owner="w", ttl_seconds=30) == [
        Conflict(node="n1", resource="cpu", wanted=2000, free=1000)]
    assert await ledger.reserve_batch([batch_pod("retry", "n1", cpu=3000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Reserved("n1", consumed=True)]
    await shared(ledger)
    assert await ledger.reserve_batch([gpu_pod("a", "g1", gpus=4)], owner="w", ttl_seconds=30) == [
        Reserved("g1", consumed=True)]
    assert await ledger.release_assumed(uid="a", node="g1", answered=False)
    assert (await ledger.reservation_owners(["pool-uid"]))["pool-uid"].room == SHARED


async def test_two_owners_racing_for_the_last_share_never_both_take_it(ledger: Ledger) -> None:
    """Many workers at once (one connection each) ask for the Reservation's last 2 GPUs on a node with no other
    free GPU: exactly one takes the share, the others are refused; the node never counts more than it has."""
    await ledger.rebuild(nodes=[("g1", {"cpu": 8000, GPU: 4, "pods": 110}, {}, "")], bound=[])
    assert await ledger.hold_reservation(uid="pool-uid", name="pool", candidates=["g1"], request=SHARED,
                                         meta=SHARED_META, owner="w", ttl_seconds=30) == Reserved("g1")
    await ledger.keep_reservation(uid="pool-uid", name="pool", node="g1", request=SHARED, meta=SHARED_META)
    assert await ledger.reserve_batch([gpu_pod("first", "g1", gpus=2)], owner="w", ttl_seconds=30) == [
        Reserved("g1", consumed=True)]
    racers = 12

    async def owner(i: int) -> object:
        results = await ledger.reserve_batch([gpu_pod(f"o{i}", "g1", gpus=2)], owner=f"w{i}", ttl_seconds=30)
        assert isinstance(results, list)
        return results[0]

    results = await asyncio.gather(*(owner(i) for i in range(racers)))
    assert sum(1 for r in results if r == Reserved("g1", consumed=True)) == 1
    assert sum(1 for r in results if isinstance(r, Conflict)) == racers - 1
    assert await gpus_used(ledger) == 4
    view = (await ledger.reservation_owners(["pool-uid"]))["pool-uid"]
    assert view.room[GPU] == 0 and len(view.owners) == 2


async def test_a_rebuild_keeps_the_shares_of_owners_the_status_names(ledger: Ledger) -> None:
    """After a rebuild (Redis lost its data, or the sync's relist) the bound owners named in the Reservation's
    status take their shares again, and a placed (assumed) owner keeps its own."""
    await shared(ledger)
    for uid in ("a", "b"):
        assert await ledger.reserve_batch([gpu_pod(uid, "g1", gpus=1)], owner="w", ttl_seconds=30) == [
            Reserved("g1", consumed=True)]
    bound_a = BoundPod(uid="a", pod="ns/a", node="g1", request={"cpu": 1000, GPU: 1, "pods": 1})
    meta = SHARED_META[:-1] + ',"owners":["a"]}'
    pool = BoundPod(uid="pool-uid", pod=reservation_key("pool"), node="g1", request=SHARED, meta=meta)
    await ledger.rebuild(nodes=[("g1", GPU_NODE, {}, ""), ("g2", GPU_NODE, {}, "")], bound=[bound_a, pool])
    view = (await ledger.reservation_owners(["pool-uid"]))["pool-uid"]
    assert [o.uid for o in view.owners] == ["a", "b"] and view.room[GPU] == 2
    assert await gpus_used(ledger) == 4
