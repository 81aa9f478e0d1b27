"""A Reservation's status is a claim (issue 33, item 2): one marked Available by anyone but the worker that held its
room enters the ledger only if it fits on its node (reservation_refusal in hoss/ledger/lua/common.lua), in the
sync's binds and in a rebuild; refused, it holds nothing and no owner takes room from it, nor does a worker count
its room for an owner. Also the audit of every node's used totals against its entries. On a fakeredis ledger."""

from __future__ import annotations

import fakeredis
import numpy as np
import pytest

from hoss.framework.cycle import Placement as Decision
from hoss.framework.cycle import Profile, Unschedulable
from hoss.framework.plugins.fit import NodeResourcesFit
from hoss.framework.podindex import PlacedPod
from hoss.ledger.arguments import BoundPod, NodeRow, Placement
from hoss.ledger.client import Ledger
from hoss.ledger.keys import reservation_key
from hoss.ledger.results import Conflict, ReservationRefused, Reserved
from resolver.mirror import refusal_message
from tests.kube_objects import batch_pod, node_row, pod_view, raw_node, table
from workers.deciding import decide_with_reservations
from workers.reservations import Hint

N = {"cpu": 4000, "memory": 8 << 30, "pods": 110}
R = {"cpu": 3000, "pods": 1}
FILLER = BoundPod(uid="filler", pod="ns/filler", node="n1", request={"cpu": 3000, "pods": 1})
RESERVATION = Placement(uid="r", pod=reservation_key("train"), node="n1", request=R,
                        meta='{"namespace":"ns","priority":2147483647,"reservation":"train"}')


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    return [node_row("n1", N), node_row("n2", N)]


async def cpu(ledger: Ledger, node: str) -> int:
    return (await ledger.node_usage([node]))[node][1].get("cpu", 0)


async def test_a_reservation_marked_available_on_a_full_node_holds_nothing_and_its_owner_takes_nothing(
    ledger: Ledger,
) -> None:
    await ledger.bind_many([FILLER])
    assert await ledger.bind_many([RESERVATION]) == [
        ReservationRefused(uid="r", pod="Reservation/train", node="n1", resource="cpu", wanted=3000, free=1000)]
    assert await cpu(ledger, "n1") == 3000
    assert {e.uid for e in await ledger.entries()} == {"filler"}
    assert await ledger.reserve_batch([batch_pod("owner", "n1", cpu=3000, reservation="r")], owner="w",
                                      ttl_seconds=30) == [Conflict(node="n1", resource="cpu", wanted=3000, free=1000)]
    assert (await ledger.stats()).get("overcommits") is None, "nothing was counted: nothing was held"


async def test_a_reservation_that_fits_holds_its_room_and_one_refused_on_another_node_leaves_it(
    ledger: Ledger,
) -> None:
    assert await ledger.bind_many([RESERVATION]) == []
    assert await cpu(ledger, "n1") == 3000
    await ledger.bind_many([BoundPod(uid="f2", pod="ns/f2", node="n2", request={"cpu": 2000})])
    moved = Placement(uid="r", pod=RESERVATION.pod, node="n2", request=R, meta=RESERVATION.meta)
    assert [type(r) for r in await ledger.bind_many([moved])] == [ReservationRefused]
    assert (await cpu(ledger, "n1"), await cpu(ledger, "n2")) == (0, 2000), "held where its status says, or nowhere"


async def test_room_a_worker_held_for_it_stays_held_whatever_the_node_holds_since(ledger: Ledger) -> None:
    assert await ledger.hold_reservation(uid="r", name="train", candidates=["n1"], request=R, owner="w",
                                         ttl_seconds=30) == Reserved("n1")
    await ledger.bind_many([FILLER])  # the apiserver's truth overcommits the node
    assert await ledger.bind_many([RESERVATION]) == []
    assert await cpu(ledger, "n1") == 6000


async def test_a_rebuild_refuses_a_reservation_new_to_the_ledger_on_a_full_node_and_keeps_one_it_held(
    ledger: Ledger,
) -> None:
    assert await ledger.bind_many([RESERVATION]) == []
    other = Placement(uid="s", pod=reservation_key("other"), node="n2", request=R, meta=RESERVATION.meta)
    on_n2 = BoundPod(uid="f2", pod="ns/f2", node="n2", request={"cpu": 2000, "pods": 1})
    rebuilt = await ledger.rebuild(nodes=[node_row("n1", N), node_row("n2", N)],
                                   bound=[FILLER, RESERVATION, on_n2, other])
    assert rebuilt.refused == (ReservationRefused(uid="s", pod="Reservation/other", node="n2", resource="cpu",
                                                  wanted=3000, free=2000),)
    assert (await cpu(ledger, "n1"), await cpu(ledger, "n2")) == (6000, 2000)


async def test_a_rebuild_counts_the_owners_the_status_names_before_it_checks_the_room(ledger: Ledger) -> None:
    """A shared Reservation (allocateOnce false) whose two owners run on the node and hold all of it: after Redis
    lost its data, its room is what the owners do not hold, so it fits beside them."""
    owners = [BoundPod(uid=uid, pod=f"ns/{uid}", node="n1", request={"cpu": 2000, "pods": 1}) for uid in "ab"]
    meta = '{"namespace":"ns","priority":2147483647,"reservation":"pool","allocateOnce":false,"owners":["a","b"]}'
    pool = BoundPod(uid="pool", pod=reservation_key("pool"), node="n1", request={"cpu": 4000, "pods": 2}, meta=meta)
    rebuilt = await ledger.rebuild(nodes=[node_row("n1", N)], bound=[*owners, pool])
    assert rebuilt.refused == ()
    assert await cpu(ledger, "n1") == 4000
    assert (await ledger.reservation_owners(["pool"]))["pool"].room["cpu"] == 0


async def test_the_audit_of_used_totals_names_a_node_whose_totals_are_not_its_entries(
    ledger: Ledger, fake_redis: fakeredis.FakeAsyncRedis,
) -> None:
    await ledger.bind_many([FILLER])
    assert await ledger.used_drift() == []
    await fake_redis.hset("{hoss}:node:n1:used", "cpu", 0)  # what a writer with the password can do
    assert await ledger.used_drift() == ["node n1 cpu: used 0, entries 3000"]
    await ledger.rebuild(nodes=[node_row("n1", N), node_row("n2", N)], bound=[FILLER])
    assert await ledger.used_drift() == []


def test_the_refusal_says_which_node_lacks_what_in_quantities() -> None:
    message = refusal_message(ReservationRefused(uid="r", pod="Reservation/train", node="n1", resource="cpu",
                                                 wanted=3000, free=-500))
    assert "Reservation train is marked Available on node n1, which has no room for it (cpu: 3 wanted, 0 free)" \
        in message
    assert "its owners cannot use it" in message


def test_a_worker_gives_back_only_the_room_the_ledger_holds_for_a_reservation() -> None:
    """The owner's hint says a Reservation holds 3 cpu on n1, whose used (the ledger's) is 3 of 4 cpu: the room is
    the owner's only while the Reservation's entry is on n1 in the worker's pod index."""
    nodes = table(raw_node("n1", {"cpu": "4", "memory": "8Gi", "pods": "110"}))
    nodes.set_used("n1", {"cpu": 3000})
    owner = pod_view("owner", {"cpu": "3"})
    hint = Hint(uid="r", name="train", node="n1", request={"cpu": 3000, "pods": 1})
    profile = Profile(name="default", filters=[NodeResourcesFit()], scores=[])

    def decide() -> Decision | Unschedulable:
        return decide_with_reservations(profile, owner, [hint], nodes, rng=np.random.default_rng(0), top=3)

    assert isinstance(decide(), Unschedulable), "a claim the ledger does not hold frees nothing"
    nodes.place_pod(PlacedPod(uid="r", node="n1", namespace="ns", labels={}, ports=()))
    decision = decide()
    assert isinstance(decision, Decision) and decision.candidates == ["n1"]


def test_an_owner_too_big_for_its_restricted_reservation_may_not_take_that_nodes_free_room() -> None:
    """Koordinator's reservation filter: on a node where the pod's Restricted Reservations all have too little left
    for it, the pod does not go at all (not even on the node's free room); elsewhere it may."""
    nodes = table(raw_node("n1", {"cpu": "8", "memory": "8Gi", "pods": "110"}),
                  raw_node("n2", {"cpu": "8", "memory": "8Gi", "pods": "110"}))
    nodes.set_used("n1", {"cpu": 2000})
    nodes.place_pod(PlacedPod(uid="r", node="n1", namespace="ns", labels={}, ports=()))
    hint = Hint(uid="r", name="train", node="n1", request={"cpu": 2000, "pods": 1}, restricted=True)
    profile = Profile(name="default", filters=[NodeResourcesFit()], scores=[])

    def decide(cpu: str) -> Decision | Unschedulable:
        return decide_with_reservations(profile, pod_view("owner", {"cpu": cpu}), [hint], nodes,
                                        rng=np.random.default_rng(0), top=3)

    fits = decide("2")
    assert isinstance(fits, Decision) and fits.candidates[0] == "n1", "the Reservation's node first"
    too_big = decide("3")
    assert isinstance(too_big, Decision) and too_big.candidates == ["n2"], too_big
    nodes.set_used("n2", {"cpu": 8000})
    nowhere = decide("3")
    assert isinstance(nowhere, Unschedulable) and "allocatePolicy Restricted" in nowhere.message, nowhere
