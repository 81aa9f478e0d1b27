"""Room held for a future pod (a Reservation) in the ledger on a real redis-server: placed in two steps
(`hold_reservation`, `keep_reservation`), closed to every other pod and to foreign bindings, and taken by the owner
pod that names it in one call (resolver/lua/reserve_batch.lua, 'Reservations')."""

from __future__ import annotations

import asyncio

from resolver.ledger import (
    BatchPod,
    Conflict,
    Ledger,
    Reserved,
    reservation_key,
)

N = {"cpu": 4000, "memory": 8 << 30, "pods": 110}
R = {"cpu": 3000, "pods": 1}


def pod(uid: str, *candidates: str, cpu: int, reservation: str = "") -> BatchPod:
    return BatchPod(uid=uid, pod=f"ns/{uid}", digest="", candidates=candidates, request={"cpu": cpu, "pods": 1},
                    reservation=reservation)


async def held(ledger: Ledger) -> None:
    await ledger.rebuild(nodes=[("n1", N, {}, ""), ("n2", N, {}, "")], bound=[])
    assert await ledger.hold_reservation(uid="r", name="train", candidates=["n1"], request=R, owner="w",
                                         ttl_seconds=30) == Reserved("n1")
    await ledger.keep_reservation(uid="r", name="train", node="n1", request=R)


async def test_held_room_is_closed_to_other_pods_and_foreign_bindings(ledger: Ledger) -> None:
    await held(ledger)
    [entry] = await ledger.entries()
    assert (entry.uid, entry.pod, entry.state, entry.node) == ("r", reservation_key("train"), "bound", "n1")
    assert await ledger.reserve_batch([pod("other", "n1", cpu=2000)], owner="w", ttl_seconds=30) == [
        Conflict(node="n1", resource="cpu", wanted=2000, free=1000)]
    foreign = await ledger.confirm(uid="kube", pod="ns/kube", node="n1", request={"cpu": 2000}, owner="kube-scheduler",
                                   verify_after_seconds=30)
    assert isinstance(foreign, Conflict) and foreign.free == 1000
    # Naming the Reservation is what opens it: any pod naming a uid that is not a Reservation gets nothing.
    assert await ledger.reserve_batch([pod("liar", "n1", cpu=2000, reservation="other")], owner="w",
                                      ttl_seconds=30) == [Conflict(node="n1", resource="cpu", wanted=2000, free=1000)]


async def test_the_owner_takes_the_room_in_one_call_and_the_reservation_entry_is_gone(ledger: Ledger) -> None:
    await held(ledger)
    before = (await ledger.node_usage(["n1"]))["n1"][1]["cpu"]
    # The owner wants more than the Reservation holds: the Reservation's 3 cpu plus 1 of the node's free room.
    assert await ledger.reserve_batch([pod("owner", "n1", cpu=4000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Reserved("n1", consumed=True)]
    assert (await ledger.node_usage(["n1"]))["n1"][1]["cpu"] == before + 1000
    assert {e.uid for e in await ledger.entries()} == {"owner"}
    # A second owner finds nothing held any more.
    assert await ledger.reserve_batch([pod("second", "n1", cpu=1000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Conflict(node="n1", resource="cpu", wanted=1000, free=0)]


async def test_elsewhere_the_owner_is_an_ordinary_pod(ledger: Ledger) -> None:
    await held(ledger)
    assert await ledger.reserve_batch([pod("owner", "n2", cpu=1000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Reserved("n2")]
    assert {e.uid for e in await ledger.entries()} == {"owner", "r"}


async def test_racing_pods_never_take_held_room(ledger: Ledger) -> None:
    """Many callers at once (one connection each): strangers only get the 1 free cpu, the owner gets the held 3."""
    await held(ledger)

    async def stranger(i: int) -> object:
        results = await ledger.reserve_batch([pod(f"s{i}", "n1", cpu=1000)], owner=f"w{i}", ttl_seconds=30)
        assert isinstance(results, list)
        return results[0]

    results = await asyncio.gather(*(stranger(i) for i in range(8)),
                                   ledger.reserve_batch([pod("owner", "n1", cpu=3000, reservation="r")], owner="o",
                                                        ttl_seconds=30))
    assert sum(1 for r in results[:8] if r == Reserved("n1")) == 1
    assert results[8] == [Reserved("n1", consumed=True)]
    usage = (await ledger.node_usage(["n1"]))["n1"][1]
    assert usage["cpu"] == 4000
