"""Every ledger operation against fakeredis (its Lua runs the real scripts): results, totals and entries."""

from __future__ import annotations

import re

import fakeredis
import pytest

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.ledger.arguments import BoundPod, GangMember, NodeRow
from hoss.ledger.client import Ledger
from hoss.ledger.results import (
    Confirmed,
    Conflict,
    GangReserved,
    HeldElsewhere,
    LedgerNotReady,
    PodEntry,
    Reserved,
    UnknownNode,
)
from hoss.model.resources import MAX_UNITS
from tests.kube_objects import node_row
from tests.waiting import until

Gi = 2**30
N1 = {"cpu": 4000, "memory": 8 * Gi, "pods": 110}
N2 = {"cpu": 2000, "memory": 4 * Gi, "pods": 110}
GPU = {"cpu": 8000, "memory": 32 * Gi, "pods": 110, "nvidia.com/gpu": 2}
TTL = 60.0


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    """n1 and n2 in zones a and b, and gpu1."""
    return [node_row("n1", N1, labels={"zone": "a"}), node_row("n2", N2, labels={"zone": "b"}), node_row("gpu1", GPU)]


def needs(cpu: int = 0, memory: int = 0, **extra: int) -> dict[str, int]:
    """A pod's request: cpu (milli), memory (bytes), one pod, and any other resource."""
    return {"cpu": cpu, "memory": memory, "pods": 1, **extra}


async def reserve(
    ledger: Ledger, uid: str, node: str, request: dict[str, int], *, owner: str = "w1", ttl: float = TTL
) -> object:
    return await ledger.reserve(uid=uid, pod=f"ns/{uid}", node=node, request=request, owner=owner, ttl_seconds=ttl)


async def used(ledger: Ledger, node: str) -> dict[str, int]:
    return (await ledger.snapshot()).nodes[node].used


async def placements(ledger: Ledger) -> dict[str, tuple[str, str]]:
    """uid -> (node, state) of every entry."""
    return {entry.uid: (entry.node, entry.state) for entry in await ledger.entries()}


# -- reserve ---------------------------------------------------------------------------------------------------


async def test_reservation_that_fits_is_held_on_the_node(ledger: Ledger) -> None:
    assert await reserve(ledger, "a", "n1", needs(1500, Gi)) == Reserved("n1")

    snapshot = await ledger.snapshot()
    assert snapshot.nodes["n1"].used == {"cpu": 1500, "memory": Gi, "pods": 1}
    assert snapshot.nodes["n1"].free == {"cpu": 2500, "memory": 7 * Gi, "pods": 109}
    assert (snapshot.nodes["n1"].assumed, snapshot.nodes["n1"].bound) == (1, 0)
    [entry] = await ledger.entries()
    assert (entry.uid, entry.pod, entry.node, entry.state, entry.owner) == ("a", "ns/a", "n1", "assumed", "w1")
    assert entry.request == {"cpu": 1500, "memory": Gi, "pods": 1}


async def test_second_reservation_gets_conflict_naming_resource_and_free_room(ledger: Ledger) -> None:
    assert await reserve(ledger, "a", "n2", needs(1500, Gi)) == Reserved("n2")

    result = await reserve(ledger, "b", "n2", needs(1000, Gi))

    assert result == Conflict(node="n2", resource="cpu", wanted=1000, free=500)
    assert str(result) == "cpu does not fit on node n2: wanted 1000, free 500"
    assert await placements(ledger) == {"a": ("n2", "assumed")}
    assert await used(ledger, "n2") == {"cpu": 1500, "memory": Gi, "pods": 1}


async def test_conflict_names_the_first_misfit_in_request_order(ledger: Ledger) -> None:
    request = {"memory": 5 * Gi, "cpu": 3000, "pods": 1}
    assert await reserve(ledger, "a", "n2", request) == Conflict(
        node="n2", resource="memory", wanted=5 * Gi, free=4 * Gi
    )


async def test_a_request_exactly_filling_the_node_fits(ledger: Ledger) -> None:
    assert await reserve(ledger, "a", "n2", {"cpu": 2000, "memory": 4 * Gi, "pods": 1}) == Reserved("n2")
    assert await reserve(ledger, "b", "n2", needs(1)) == Conflict(node="n2", resource="cpu", wanted=1, free=0)


async def test_gpu_pod_never_fits_a_node_without_gpus(ledger: Ledger) -> None:
    gpu_pod = needs(100, Gi, **{"nvidia.com/gpu": 1})
    assert await reserve(ledger, "a", "n1", gpu_pod) == Conflict(node="n1", resource="nvidia.com/gpu", wanted=1, free=0)
    assert await reserve(ledger, "a", "gpu1", gpu_pod) == Reserved("gpu1")


async def test_reserve_on_unknown_node_is_refused(ledger: Ledger) -> None:
    assert await reserve(ledger, "a", "n9", needs(100)) == UnknownNode("n9")
    assert await ledger.entries() == []


async def test_reserving_the_same_uid_again_holds_it_once_and_pushes_the_deadline(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(1000, Gi), ttl=10)
    [first] = await ledger.entries()

    assert await reserve(ledger, "a", "n1", needs(1000, Gi), owner="w2", ttl=20) == Reserved("n1")

    [second] = await ledger.entries()
    assert await used(ledger, "n1") == {"cpu": 1000, "memory": Gi, "pods": 1}
    assert first.deadline_ms is not None and second.deadline_ms is not None
    assert second.deadline_ms >= first.deadline_ms + 9_000
    assert second.owner == "w2"


async def test_re_reserving_with_a_bigger_request_checks_only_the_growth(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n2", needs(1500))
    assert await reserve(ledger, "a", "n2", needs(2000)) == Reserved("n2")
    assert await reserve(ledger, "a", "n2", needs(2500)) == Conflict(node="n2", resource="cpu", wanted=2500, free=2000)
    assert await used(ledger, "n2") == {"cpu": 2000, "pods": 1}


async def test_reservation_moves_to_another_node(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(1000, Gi))

    assert await reserve(ledger, "a", "n2", needs(1000, Gi)) == Reserved("n2")

    assert await placements(ledger) == {"a": ("n2", "assumed")}
    assert await used(ledger, "n1") == {}
    assert await used(ledger, "n2") == {"cpu": 1000, "memory": Gi, "pods": 1}


async def test_failed_move_keeps_the_old_reservation(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(3000, Gi))

    assert await reserve(ledger, "a", "n2", needs(3000, Gi)) == Conflict(
        node="n2", resource="cpu", wanted=3000, free=2000
    )

    assert await placements(ledger) == {"a": ("n1", "assumed")}
    assert await used(ledger, "n1") == {"cpu": 3000, "memory": Gi, "pods": 1}
    assert await used(ledger, "n2") == {}


async def test_bound_pod_cannot_be_reserved_on_another_node(ledger: Ledger) -> None:
    await ledger.bind(uid="a", pod="ns/a", node="n1", request=needs(1000))

    assert await reserve(ledger, "a", "n2", needs(1000)) == HeldElsewhere(node="n1", state="bound")
    assert await reserve(ledger, "a", "n1", needs(1000)) == Reserved("n1")
    assert await placements(ledger) == {"a": ("n1", "bound")}
    assert await used(ledger, "n1") == {"cpu": 1000, "pods": 1}


async def test_quantities_up_to_2_to_the_53_are_exact(ledger: Ledger) -> None:
    await ledger.sync_node(node="big", allocatable={"memory": MAX_UNITS, "pods": 110})
    assert await reserve(ledger, "a", "big", {"memory": MAX_UNITS - 1, "pods": 1}) == Reserved("big")

    assert await reserve(ledger, "b", "big", {"memory": 2, "pods": 1}) == Conflict(
        node="big", resource="memory", wanted=2, free=1
    )
    assert await reserve(ledger, "b", "big", {"memory": 1, "pods": 1}) == Reserved("big")
    assert await used(ledger, "big") == {"memory": MAX_UNITS, "pods": 2}


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"cpu": -1}, "cpu: amount must be an integer in [0, 9007199254740992], got -1"),
        ({"cpu": MAX_UNITS + 1}, "cpu: amount must be an integer in [0, 9007199254740992], got 9007199254740993"),
        ({"cpu": True}, "cpu: amount must be an integer in [0, 9007199254740992], got True"),
        ({"": 1}, "resource names must not be empty"),
    ],
    ids=["negative", "beyond-exact", "bool", "unnamed"],
)
async def test_request_outside_what_the_ledger_counts_is_a_value_error(
    ledger: Ledger, request_: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        await reserve(ledger, "a", "n1", request_)
    assert await ledger.entries() == []


async def test_non_positive_ttl_is_a_value_error(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="ttl_seconds must be positive"):
        await reserve(ledger, "a", "n1", needs(1), ttl=0)


# -- reserve_gang ----------------------------------------------------------------------------------------------


def member(uid: str, node: str, request: dict[str, int]) -> GangMember:
    return GangMember(uid=uid, pod=f"ns/{uid}", node=node, request=request)


async def test_gang_reserves_every_member_across_nodes(ledger: Ledger) -> None:
    members = [member("g1", "n1", needs(2000)), member("g2", "n1", needs(2000)), member("g3", "n2", needs(2000))]

    assert await ledger.reserve_gang(members=members, owner="w1", ttl_seconds=TTL) == GangReserved(("g1", "g2", "g3"))

    assert await placements(ledger) == {"g1": ("n1", "assumed"), "g2": ("n1", "assumed"), "g3": ("n2", "assumed")}
    assert await used(ledger, "n1") == {"cpu": 4000, "pods": 2}
    assert await used(ledger, "n2") == {"cpu": 2000, "pods": 1}


async def test_gang_members_sharing_a_node_must_fit_together(ledger: Ledger) -> None:
    await reserve(ledger, "other", "n2", needs(500))
    members = [member("g1", "n2", needs(1000)), member("g2", "n2", needs(1000))]

    result = await ledger.reserve_gang(members=members, owner="w1", ttl_seconds=TTL)

    assert result == Conflict(node="n2", resource="cpu", wanted=2000, free=1500)
    assert await placements(ledger) == {"other": ("n2", "assumed")}
    assert await used(ledger, "n2") == {"cpu": 500, "pods": 1}


async def test_gang_with_one_misfit_writes_nothing(ledger: Ledger) -> None:
    await reserve(ledger, "g1", "n2", needs(100))  # an earlier reservation of a member stays where it was
    before = await ledger.snapshot()
    members = [member("g1", "n1", needs(1000)), member("g2", "gpu1", needs(1000)), member("g3", "n2", needs(2500))]

    result = await ledger.reserve_gang(members=members, owner="w1", ttl_seconds=TTL)

    assert result == Conflict(node="n2", resource="cpu", wanted=2500, free=2000)
    assert await placements(ledger) == {"g1": ("n2", "assumed")}
    assert await ledger.snapshot() == before


async def test_gang_member_moving_away_makes_room_for_another(ledger: Ledger) -> None:
    await reserve(ledger, "g1", "n2", needs(2000))
    members = [member("g1", "n1", needs(2000)), member("g2", "n2", needs(2000))]

    assert await ledger.reserve_gang(members=members, owner="w1", ttl_seconds=TTL) == GangReserved(("g1", "g2"))
    assert await placements(ledger) == {"g1": ("n1", "assumed"), "g2": ("n2", "assumed")}


async def test_gang_with_a_member_bound_elsewhere_is_refused(ledger: Ledger) -> None:
    await ledger.bind(uid="g2", pod="ns/g2", node="n2", request=needs(100))
    members = [member("g1", "n1", needs(100)), member("g2", "n1", needs(100))]

    assert await ledger.reserve_gang(members=members, owner="w1", ttl_seconds=TTL) == HeldElsewhere("n2", "bound")
    assert await placements(ledger) == {"g2": ("n2", "bound")}


async def test_gang_on_an_unknown_node_is_refused(ledger: Ledger) -> None:
    members = [member("g1", "n1", needs(100)), member("g2", "n9", needs(100))]
    assert await ledger.reserve_gang(members=members, owner="w1", ttl_seconds=TTL) == UnknownNode("n9")
    assert await ledger.entries() == []


async def test_gang_with_a_uid_twice_is_a_value_error(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="distinct uids"):
        await ledger.reserve_gang(
            members=[member("g1", "n1", needs(1)), member("g1", "n2", needs(1))], owner="w1", ttl_seconds=TTL
        )


# -- confirm ---------------------------------------------------------------------------------------------------


async def confirm(ledger: Ledger, uid: str, node: str, request: dict[str, int], owner: str = "foreign:alice") -> object:
    return await ledger.confirm(uid=uid, pod=f"ns/{uid}", node=node, request=request, owner=owner,
                                verify_after_seconds=TTL)


async def test_confirming_own_reservation_is_not_foreign_and_admits_it(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(1000), ttl=1)
    [before] = await ledger.entries()

    assert await confirm(ledger, "a", "n1", needs(1000)) == Confirmed(node="n1", foreign=False)

    [after] = await ledger.entries()
    assert after.owner == "w1"
    assert before.state == "assumed" and before.deadline_ms is not None
    assert after.state == "admitted" and after.deadline_ms is None
    assert await used(ledger, "n1") == {"cpu": 1000, "pods": 1}


async def test_confirming_a_pod_already_bound_there_is_not_foreign(ledger: Ledger) -> None:
    await ledger.bind(uid="a", pod="ns/a", node="n1", request=needs(1000))
    assert await confirm(ledger, "a", "n1", needs(1000)) == Confirmed(node="n1", foreign=False)
    assert await placements(ledger) == {"a": ("n1", "bound")}


async def test_foreign_binding_that_fits_is_held_for_its_owner(ledger: Ledger) -> None:
    assert await confirm(ledger, "a", "n2", needs(1500, Gi)) == Confirmed(node="n2", foreign=True)

    [entry] = await ledger.entries()
    assert (entry.node, entry.state, entry.owner) == ("n2", "admitted", "foreign:alice")
    assert await used(ledger, "n2") == {"cpu": 1500, "memory": Gi, "pods": 1}
    assert await reserve(ledger, "b", "n2", needs(1000)) == Conflict(node="n2", resource="cpu", wanted=1000, free=500)


async def test_foreign_binding_that_does_not_fit_is_a_conflict(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n2", needs(1500))
    assert await confirm(ledger, "b", "n2", needs(1000)) == Conflict(node="n2", resource="cpu", wanted=1000, free=500)
    assert await placements(ledger) == {"a": ("n2", "assumed")}


async def test_binding_to_another_node_than_the_reservation_is_held_elsewhere(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(1000))
    assert await confirm(ledger, "a", "n2", needs(1000)) == HeldElsewhere(node="n1", state="assumed")
    assert await placements(ledger) == {"a": ("n1", "assumed")}


async def test_binding_to_an_unknown_node_is_refused(ledger: Ledger) -> None:
    assert await confirm(ledger, "a", "n9", needs(1000)) == UnknownNode("n9")


# -- bind, release, expire, release_owner ----------------------------------------------------------------------


async def test_bind_records_the_apiserver_truth_even_when_it_overcommits(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n2", needs(1500))

    await ledger.bind(uid="b", pod="ns/b", node="n2", request=needs(1000))

    [_, entry] = await ledger.entries()
    assert (entry.uid, entry.state, entry.deadline_ms) == ("b", "bound", None)
    snapshot = (await ledger.snapshot()).nodes["n2"]
    assert snapshot.used == {"cpu": 2500, "pods": 2}
    assert (snapshot.assumed, snapshot.bound) == (1, 1)
    assert await reserve(ledger, "c", "n2", needs(1)) == Conflict(node="n2", resource="cpu", wanted=1, free=-500)


async def test_bind_turns_the_reservation_bound_and_moves_it_if_elsewhere(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(1000))
    await ledger.bind(uid="a", pod="ns/a", node="n1", request=needs(1000))
    assert await placements(ledger) == {"a": ("n1", "bound")}

    await ledger.bind(uid="a", pod="ns/a", node="n2", request=needs(1000))
    assert await placements(ledger) == {"a": ("n2", "bound")}
    assert await used(ledger, "n1") == {}
    assert await used(ledger, "n2") == {"cpu": 1000, "pods": 1}


async def test_bind_to_a_node_not_synced_yet_registers_it_without_room(ledger: Ledger) -> None:
    await ledger.bind(uid="a", pod="ns/a", node="n9", request=needs(1000))

    node = (await ledger.snapshot()).nodes["n9"]
    assert (node.alloc, node.used, node.bound) == ({}, {"cpu": 1000, "pods": 1}, 1)
    assert await reserve(ledger, "b", "n9", needs(1)) == Conflict(node="n9", resource="cpu", wanted=1, free=-1000)


async def test_release_frees_the_room_once(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n2", needs(2000))

    assert await ledger.release("a") is True
    assert await ledger.release("a") is False

    assert await ledger.entries() == []
    assert await used(ledger, "n2") == {}
    assert await reserve(ledger, "b", "n2", needs(2000)) == Reserved("n2")


async def test_release_assumed_drops_only_the_reservation_on_that_node(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(100))
    await ledger.bind(uid="b", pod="ns/b", node="n1", request=needs(200))

    assert await ledger.release_assumed(uid="a", node="n2") is False
    assert await ledger.release_assumed(uid="b", node="n1") is False
    assert await ledger.release_assumed(uid="a", node="n1") is True

    assert await placements(ledger) == {"b": ("n1", "bound")}
    assert await used(ledger, "n1") == {"cpu": 200, "pods": 1}


async def test_expire_drops_only_reservations_past_their_deadline(ledger: Ledger) -> None:
    await reserve(ledger, "short", "n1", needs(1000), ttl=0.05)
    await reserve(ledger, "long", "n1", needs(200), ttl=TTL)
    await ledger.bind(uid="bound", pod="ns/bound", node="n1", request=needs(30))
    expired: list[str] = []

    async def short_expired() -> tuple[bool, str]:
        expired.extend(await ledger.expire())
        return "short" in expired, f"expired so far: {expired}"

    # Deadlines are on the Redis server's clock, the one clock every worker and the sync share: wait for it.
    await until(short_expired, timeout=10, what="the 50 ms reservation to pass its deadline")

    assert expired == ["short"]
    assert await placements(ledger) == {"long": ("n1", "assumed"), "bound": ("n1", "bound")}
    assert await used(ledger, "n1") == {"cpu": 230, "pods": 2}


async def test_release_owner_drops_only_that_workers_reservations(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(100), owner="w1")
    await reserve(ledger, "b", "n2", needs(100), owner="w1")
    await reserve(ledger, "c", "n1", needs(100), owner="w2")
    await reserve(ledger, "d", "n1", needs(100), owner="w1")
    await ledger.bind(uid="d", pod="ns/d", node="n1", request=needs(100))

    assert await ledger.release_owner("w1") == 2

    assert await placements(ledger) == {"c": ("n1", "assumed"), "d": ("n1", "bound")}
    assert await used(ledger, "n1") == {"cpu": 200, "pods": 2}
    assert await used(ledger, "n2") == {}
    assert await ledger.release_owner("w1") == 0


# -- nodes -----------------------------------------------------------------------------------------------------


async def test_sync_node_shrinking_allocatable_keeps_entries_and_admits_nothing_more(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(3000))

    await ledger.sync_node(node="n1", allocatable={"cpu": 2000, "pods": 110}, labels={"zone": "c"})

    node = (await ledger.snapshot()).nodes["n1"]
    assert (node.alloc, node.used, node.labels) == ({"cpu": 2000, "pods": 110}, {"cpu": 3000, "pods": 1}, {"zone": "c"})
    assert await reserve(ledger, "a", "n1", needs(3000)) == Reserved("n1")
    assert await reserve(ledger, "b", "n1", needs(1)) == Conflict(node="n1", resource="cpu", wanted=1, free=-1000)
    assert await reserve(ledger, "b", "n1", needs(0, Gi)) == Conflict(node="n1", resource="memory", wanted=Gi, free=0)


async def test_sync_node_adds_a_new_node(ledger: Ledger) -> None:
    await ledger.sync_node(node="n3", allocatable={"cpu": 1000, "pods": 10})
    assert await reserve(ledger, "a", "n3", needs(1000)) == Reserved("n3")
    assert await ledger.node_usage(["n3", "n9"]) == {"n3": ({"cpu": 1000, "pods": 10}, {"cpu": 1000, "pods": 1})}


async def test_remove_node_drops_its_entries(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(100))
    await ledger.bind(uid="b", pod="ns/b", node="n1", request=needs(100))
    await reserve(ledger, "c", "n2", needs(100))

    assert sorted(await ledger.remove_node("n1")) == ["a", "b"]

    assert "n1" not in (await ledger.snapshot()).nodes
    assert await placements(ledger) == {"c": ("n2", "assumed")}
    assert await reserve(ledger, "a", "n1", needs(100)) == UnknownNode("n1")
    assert await ledger.expire() == []


# -- rebuild and readiness -------------------------------------------------------------------------------------


async def test_rebuild_replaces_bound_truth_and_keeps_live_reservations(ledger: Ledger) -> None:
    await reserve(ledger, "kept", "n1", needs(100), owner="w7")
    await reserve(ledger, "on-removed-node", "n2", needs(100))
    await reserve(ledger, "now-bound", "n1", needs(200))
    await ledger.bind(uid="stale", pod="ns/stale", node="n1", request=needs(400))
    old_epoch = await ledger.epoch()

    rebuilt = await ledger.rebuild(
        nodes=[("n1", N1, {"zone": "a"}), ("n3", {"cpu": 1000, "pods": 10}, {})],
        bound=[
            BoundPod(uid="now-bound", pod="ns/now-bound", node="n1", request=needs(200)),
            BoundPod(uid="x", pod="ns/x", node="n3", request=needs(700)),
        ],
    )

    assert rebuilt.epoch != old_epoch
    assert await ledger.epoch() == rebuilt.epoch
    assert await ledger.is_ready()
    assert await placements(ledger) == {
        "kept": ("n1", "assumed"),
        "now-bound": ("n1", "bound"),
        "x": ("n3", "bound"),
    }
    snapshot = await ledger.snapshot()
    assert sorted(snapshot.nodes) == ["n1", "n3"]
    assert snapshot.nodes["n1"].used == {"cpu": 300, "pods": 2}
    assert snapshot.nodes["n3"].used == {"cpu": 700, "pods": 1}
    [kept] = [entry for entry in await ledger.entries() if entry.uid == "kept"]
    assert kept.owner == "w7" and kept.deadline_ms is not None


async def test_flushed_redis_makes_every_write_refuse_until_rebuilt(
    ledger: Ledger, fake_server: fakeredis.FakeServer
) -> None:
    await reserve(ledger, "a", "n1", needs(100))
    client = fakeredis.FakeAsyncRedis(server=fake_server)
    await client.flushall()
    await client.aclose()

    assert not await ledger.is_ready()
    assert await ledger.epoch() is None
    assert isinstance(await reserve(ledger, "b", "n1", needs(100)), LedgerNotReady)
    gang = [member("g1", "n1", needs(1))]
    assert isinstance(await ledger.reserve_gang(members=gang, owner="w1", ttl_seconds=TTL), LedgerNotReady)
    assert isinstance(await confirm(ledger, "b", "n1", needs(100)), LedgerNotReady)
    for write in (
        ledger.bind(uid="a", pod="ns/a", node="n1", request=needs(100)),
        ledger.release("a"),
        ledger.release_assumed(uid="a", node="n1"),
        ledger.release_owner("w1"),
        ledger.expire(),
        ledger.sync_node(node="n1", allocatable=N1),
        ledger.remove_node("n1"),
    ):
        with pytest.raises(LedgerNotReadyError, match="ledger not ready"):
            await write
    assert await ledger.entries() == []

    await ledger.rebuild(nodes=[("n1", N1, {})], bound=[])
    assert await reserve(ledger, "b", "n1", needs(100)) == Reserved("n1")


async def test_mark_not_ready_pauses_admission_until_rebuild(ledger: Ledger) -> None:
    await ledger.mark_not_ready()

    result = await reserve(ledger, "a", "n1", needs(100))

    assert isinstance(result, LedgerNotReady) and "rebuilt" in result.reason
    assert not (await ledger.snapshot()).ready
    await ledger.rebuild(nodes=[("n1", N1, {})], bound=[])
    assert (await ledger.snapshot()).ready


async def test_unreachable_redis_raises_ledger_unavailable_with_the_cause(
    ledger: Ledger, fake_server: fakeredis.FakeServer
) -> None:
    fake_server.connected = False

    with pytest.raises(LedgerUnavailable) as caught:
        await reserve(ledger, "a", "n1", needs(100))
    assert caught.value.__cause__ is not None
    with pytest.raises(LedgerUnavailable):
        await ledger.is_ready()


async def test_snapshot_reports_counts_and_labels_per_node(ledger: Ledger) -> None:
    await reserve(ledger, "a", "n1", needs(100))
    await reserve(ledger, "b", "n1", needs(100))
    await ledger.bind(uid="b", pod="ns/b", node="n1", request=needs(100))

    snapshot = await ledger.snapshot()

    assert snapshot.ready and snapshot.epoch
    assert sorted(snapshot.nodes) == ["gpu1", "n1", "n2"]
    n1 = snapshot.nodes["n1"]
    assert (n1.alloc, n1.used, n1.assumed, n1.bound, n1.labels) == (N1, {"cpu": 200, "pods": 2}, 1, 1, {"zone": "a"})


async def test_entries_read_back_every_field(ledger: Ledger) -> None:
    await ledger.bind(uid="a", pod="ns/a", node="gpu1", request={"nvidia.com/gpu": 2, "pods": 1})
    assert await ledger.entries() == [
        PodEntry(
            uid="a",
            pod="ns/a",
            node="gpu1",
            state="bound",
            owner="",
            deadline_ms=None,
            request={"nvidia.com/gpu": 2, "pods": 1},
        )
    ]
