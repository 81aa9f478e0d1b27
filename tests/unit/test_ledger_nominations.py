"""Room held for a preempting pod in the ledger (hoss/ledger/lua/nominate.lua and 'Nominations' in common.lua),
against fakeredis running the real scripts."""

from __future__ import annotations

import fakeredis
import orjson

from hoss.ledger.arguments import BatchPod, GangMember
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed, Conflict, Reserved
from tests.kube_objects import batch_pod
from tests.waiting import until


def meta(priority: int) -> str:
    return orjson.dumps({"namespace": "ns", "priority": priority}).decode() if priority else '{"namespace":"ns"}'


def item(uid: str, *candidates: str, cpu: int, priority: int = 0) -> BatchPod:
    """A pod of that priority for a reservation batch."""
    return batch_pod(uid, *candidates, cpu=cpu, meta=meta(priority))


async def test_held_room_keeps_pods_of_lower_or_equal_priority_out_but_not_higher(ledger: Ledger) -> None:
    # A bound pod of priority 0 uses 1 cpu; the preemptor (priority 100) is nominated to n1 for 3 cpu.
    await ledger.bind(uid="victimless", pod="ns/old", node="n1", request={"cpu": 1000, "pods": 1})
    before = await ledger.node_usage(["n1"])
    assert await ledger.nominate(uid="p", node="n1", priority=100, request={"cpu": 3000, "pods": 1},
                                 ttl_seconds=60) == "nominated"
    assert await ledger.node_usage(["n1"]) == before  # a hold changes no usage: it frees nothing a pod uses
    results = await ledger.reserve_batch([item("low", "n1", cpu=500, priority=10)], owner="w", ttl_seconds=30)
    assert results == [Conflict(node="n1", resource="cpu (held for a preempting pod)", wanted=500, free=0)]
    # kube-scheduler counts a nominated pod against pods of its priority or lower: an equal one is kept out too,
    # a higher one is not.
    results = await ledger.reserve_batch([item("same", "n1", cpu=500, priority=100),
                                          item("high", "n1", cpu=500, priority=1000)], owner="w", ttl_seconds=30)
    assert results == [Conflict(node="n1", resource="cpu (held for a preempting pod)", wanted=500, free=0),
                       Reserved("n1")]
    # The low pod falls back to a node without a hold.
    results = await ledger.reserve_batch([item("low", "n1", "n2", cpu=500, priority=10)], owner="w", ttl_seconds=30)
    assert results == [Reserved("n2")]


async def test_two_equal_nominees_for_one_room_the_first_nominated_takes_it(ledger: Ledger) -> None:
    """Two workers may nominate two preemptors of equal priority to the same room (the same victims): each must
    not keep the other out for the holds' lifetime. The one nominated first counts for the other, not back."""
    await ledger.bind(uid="victimless", pod="ns/old", node="n1", request={"cpu": 3000, "pods": 1})
    # "first" is nominated first and "a-second" later, with a later deadline: the deadline decides, not the uid.
    for uid, ttl in (("first", 60), ("a-second", 61)):
        assert await ledger.nominate(uid=uid, node="n1", priority=100, request={"cpu": 1000, "pods": 1},
                                     ttl_seconds=ttl) == "nominated"
    results = await ledger.reserve_batch([item("a-second", "n1", cpu=1000, priority=100)], owner="w",
                                         ttl_seconds=30)
    assert results == [Conflict(node="n1", resource="cpu (held for a preempting pod)", wanted=1000, free=0)]
    results = await ledger.reserve_batch([item("first", "n1", cpu=1000, priority=100)], owner="w", ttl_seconds=30)
    assert results == [Reserved("n1")]
    # A pod of that priority that is not nominated still leaves both holds alone.
    await ledger.release("first")
    results = await ledger.reserve_batch([item("other", "n1", cpu=1000, priority=100)], owner="w", ttl_seconds=30)
    assert results == [Conflict(node="n1", resource="cpu (held for a preempting pod)", wanted=1000, free=0)]


async def test_the_preemptor_takes_its_room_and_its_nomination_ends(ledger: Ledger) -> None:
    await ledger.nominate(uid="p", node="n1", priority=100, request={"cpu": 4000, "pods": 1}, ttl_seconds=60)
    assert set(await ledger.nominations()) == {"p"}
    results = await ledger.reserve_batch([item("p", "n1", cpu=4000, priority=100)], owner="w", ttl_seconds=30)
    assert results == [Reserved("n1")]
    assert await ledger.nominations() == {}
    # Nominating a pod that holds an entry holds nothing.
    assert await ledger.nominate(uid="p", node="n2", priority=100, request={"cpu": 1, "pods": 1},
                                 ttl_seconds=60) == "assumed"
    assert await ledger.nominations() == {}


async def test_a_foreign_binding_of_lower_priority_is_refused_where_room_is_held(ledger: Ledger) -> None:
    await ledger.nominate(uid="p", node="n1", priority=100, request={"cpu": 3000, "pods": 1}, ttl_seconds=60)
    refused = await ledger.confirm(uid="f", pod="ns/f", node="n1", request={"cpu": 2000, "pods": 1},
                                   owner="foreign:x", verify_after_seconds=30, meta=meta(0))
    assert refused == Conflict(node="n1", resource="cpu (held for a preempting pod)", wanted=2000, free=1000)
    allowed = await ledger.confirm(uid="g", pod="ns/g", node="n1", request={"cpu": 2000, "pods": 1},
                                   owner="foreign:x", verify_after_seconds=30, meta=meta(200))  # higher: allowed
    assert allowed == Confirmed(node="n1", foreign=True)


async def test_a_gang_of_lower_priority_leaves_held_room_counting_all_its_members(ledger: Ledger) -> None:
    await ledger.nominate(uid="p", node="n1", priority=100, request={"cpu": 2000, "pods": 1}, ttl_seconds=60)
    members = [GangMember(uid=f"m{i}", pod=f"ns/m{i}", node="n1", request={"cpu": 1500, "pods": 1}, meta=meta(1))
               for i in range(2)]
    result = await ledger.reserve_gang(members=members, owner="w", ttl_seconds=30)
    assert result == Conflict(node="n1", resource="cpu (held for a preempting pod)", wanted=3000, free=2000)


async def test_a_nomination_ends_at_its_deadline_or_when_dropped(ledger: Ledger) -> None:
    await ledger.nominate(uid="p", node="n1", priority=100, request={"cpu": 4000, "pods": 1}, ttl_seconds=0.05)
    await ledger.nominate(uid="q", node="n2", priority=100, request={"cpu": 4000, "pods": 1}, ttl_seconds=60)

    async def p_ended() -> tuple[bool, str]:
        live = set(await ledger.nominations())
        return "p" not in live, f"nominations: {sorted(live)}"

    # Deadlines are on the Redis server's clock, the one clock every worker shares: wait for it.
    await until(p_ended, timeout=10, what="p's 50 ms nomination to pass its deadline")
    assert set(await ledger.nominations()) == {"q"}
    results = await ledger.reserve_batch([item("low", "n1", cpu=4000)], owner="w", ttl_seconds=30)
    assert results == [Reserved("n1")]
    assert await ledger.unnominate("q") is True
    assert await ledger.unnominate("q") is False
    results = await ledger.reserve_batch([item("low2", "n2", cpu=4000)], owner="w", ttl_seconds=30)
    assert results == [Reserved("n2")]


async def test_a_gone_preemptor_ends_its_nomination(ledger: Ledger, fake_redis: fakeredis.FakeAsyncRedis) -> None:
    await ledger.nominate(uid="p", node="n1", priority=100, request={"cpu": 4000, "pods": 1}, ttl_seconds=60)
    await fake_redis.hset("{hoss}:podver", "p", "gone")
    await ledger.reserve_batch([BatchPod(uid="p", pod="ns/p", digest="d", candidates=["n1"],
                                         request={"cpu": 4000, "pods": 1}, meta=meta(100))],
                               owner="w", ttl_seconds=30)
    assert await ledger.nominations() == {}
