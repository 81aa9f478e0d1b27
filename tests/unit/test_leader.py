"""Leader election on a Lease: the pure decisions, and two electors racing over an in-memory apiserver Lease."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest

from dispatcher.leader import (
    Action,
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
    LeaseSpecError,
    decide,
    format_micro_time,
    lease_object,
    parse_lease,
    released_object,
)
from hoss.kube.client import KubeError

T0 = datetime.datetime(2026, 11, 22, 8, 0, 0, tzinfo=datetime.UTC)
Json = dict[str, Any]


def held_by(holder: str, *, renewed: datetime.datetime, duration: int = 15, version: str = "7") -> LeaseRecord:
    return parse_lease({
        "metadata": {"name": "hoss-dispatcher", "namespace": "hoss-system", "resourceVersion": version},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                 "acquireTime": format_micro_time(renewed), "renewTime": format_micro_time(renewed),
                 "leaseTransitions": 2},
    })


def seconds(n: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=n)


# --- pure decisions ----------------------------------------------------------------------------------------


def test_micro_time_is_what_kubernetes_expects() -> None:
    assert format_micro_time(T0) == "2026-11-22T08:00:00.000000Z"
    assert held_by("a", renewed=T0).renew_time == T0


def test_missing_lease_is_created() -> None:
    assert decide(None, identity="a", now=T0) is Action.CREATE


def test_holder_renews_its_own_lease() -> None:
    assert decide(held_by("a", renewed=T0), identity="a", now=T0 + seconds(5)) is Action.RENEW


def test_live_lease_of_another_replica_is_followed() -> None:
    lease = held_by("b", renewed=T0)
    assert decide(lease, identity="a", now=T0 + seconds(14.9)) is Action.FOLLOW


def test_lease_is_taken_over_once_renew_time_plus_duration_has_passed() -> None:
    lease = held_by("b", renewed=T0)
    assert decide(lease, identity="a", now=T0 + seconds(15)) is Action.ACQUIRE
    assert decide(lease, identity="a", now=T0 + seconds(60)) is Action.ACQUIRE


def test_released_lease_is_taken_over_at_once() -> None:
    released = parse_lease(released_object(held_by("b", renewed=T0), now=T0))
    assert released.holder == ""
    assert decide(released, identity="a", now=T0) is Action.ACQUIRE


def test_takeover_writes_new_holder_with_the_read_resource_version_and_counts_a_transition() -> None:
    previous = held_by("b", renewed=T0, version="42")
    now = T0 + seconds(20)
    body = lease_object(action=Action.ACQUIRE, previous=previous, name="hoss-dispatcher", namespace="hoss-system",
                        identity="a", duration_seconds=15, now=now)
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["spec"]["holderIdentity"] == "a"
    assert body["spec"]["renewTime"] == body["spec"]["acquireTime"] == format_micro_time(now)
    assert body["spec"]["leaseTransitions"] == 3
    assert previous.raw["spec"]["holderIdentity"] == "b"  # the record read is left as it was


def test_renewal_moves_renew_time_only() -> None:
    previous = held_by("a", renewed=T0)
    body = lease_object(action=Action.RENEW, previous=previous, name="hoss-dispatcher", namespace="hoss-system",
                        identity="a", duration_seconds=15, now=T0 + seconds(2))
    assert body["spec"]["acquireTime"] == format_micro_time(T0)
    assert body["spec"]["renewTime"] == format_micro_time(T0 + seconds(2))
    assert body["spec"]["leaseTransitions"] == 2


def test_malformed_lease_is_rejected_naming_the_field() -> None:
    with pytest.raises(LeaseSpecError, match=r"spec\.renewTime"):
        parse_lease({"metadata": {"resourceVersion": "1"},
                     "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "yesterday"}})
    with pytest.raises(LeaseSpecError, match=r"metadata\.resourceVersion"):
        parse_lease({"metadata": {}, "spec": {}})
    with pytest.raises(LeaseSpecError, match=r"spec\.leaseDurationSeconds"):
        parse_lease({"metadata": {"resourceVersion": "1"}, "spec": {"holderIdentity": "a"}})


# --- electors over an in-memory Lease ------------------------------------------------------------------------


class FakeLeaseServer:
    """One Lease with the apiserver's optimistic concurrency: create fails when it exists, replace when stale."""

    def __init__(self) -> None:
        self.lease: Json | None = None
        self.version = 0
        self.failing = False
        self.writes: list[str] = []

    def client(self) -> FakeLeaseAPI:
        return FakeLeaseAPI(self)


class FakeLeaseAPI:
    name = "hoss-dispatcher"
    namespace = "hoss-system"

    def __init__(self, server: FakeLeaseServer) -> None:
        self.server = server

    def _check(self) -> None:
        if self.server.failing:
            raise KubeError("apiserver unavailable", status=503)

    async def read(self) -> Json | None:
        self._check()
        return copy.deepcopy(self.server.lease)

    async def create(self, body: Json) -> Json:
        self._check()
        if self.server.lease is not None:
            raise LeaseConflict("leases.coordination.k8s.io already exists", status=409)
        return self._store(body)

    async def replace(self, body: Json) -> Json:
        self._check()
        assert self.server.lease is not None
        if body["metadata"].get("resourceVersion") != self.server.lease["metadata"]["resourceVersion"]:
            raise LeaseConflict("the object has been modified", status=409)
        return self._store(body)

    def _store(self, body: Json) -> Json:
        self.server.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.server.version)
        self.server.lease = stored
        self.server.writes.append(stored["spec"]["holderIdentity"])
        return copy.deepcopy(stored)


class Clocks:
    def __init__(self) -> None:
        self.elapsed = 0.0

    def wall(self) -> datetime.datetime:
        return T0 + seconds(self.elapsed)

    def monotonic(self) -> float:
        return self.elapsed


def elector(server: FakeLeaseServer, identity: str, clocks: Clocks) -> LeaderElector:
    return LeaderElector(
        server.client(), identity=identity, lease_duration_seconds=15, renew_deadline_seconds=10,
        renew_interval_seconds=2, wall=clocks.wall, monotonic=clocks.monotonic,
    )


async def test_first_replica_creates_the_lease_and_leads_the_second_follows() -> None:
    server, clocks = FakeLeaseServer(), Clocks()
    a, b = elector(server, "a", clocks), elector(server, "b", clocks)
    assert await a.try_once()
    assert not await b.try_once()
    assert a.is_leader and a.leading.is_set() and not a.following.is_set()
    assert not b.is_leader and b.following.is_set() and b.holder == "a"


class StaleReader(FakeLeaseAPI):
    """Answers reads with a Lease read earlier, as a replica does whose read raced another's write."""

    def __init__(self, server: FakeLeaseServer, seen: Json | None) -> None:
        super().__init__(server)
        self.seen = seen

    async def read(self) -> Json | None:
        return copy.deepcopy(self.seen)


async def test_two_replicas_that_both_read_an_expired_lease_cannot_both_win() -> None:
    server, clocks = FakeLeaseServer(), Clocks()
    await elector(server, "old", clocks).try_once()
    clocks.elapsed = 30.0
    expired = await server.client().read()
    a, b = elector(server, "a", clocks), elector(server, "b", clocks)
    b.api = StaleReader(server, expired)

    assert await a.try_once()
    assert not await b.try_once()

    assert (a.is_leader, b.is_leader) == (True, False)
    assert server.lease is not None and server.lease["spec"]["holderIdentity"] == "a"


async def test_follower_takes_over_only_after_the_lease_expires() -> None:
    server, clocks = FakeLeaseServer(), Clocks()
    a, b = elector(server, "a", clocks), elector(server, "b", clocks)
    await a.try_once()
    clocks.elapsed = 14.0
    assert not await b.try_once()
    clocks.elapsed = 15.5
    assert await b.try_once()
    assert server.lease is not None and server.lease["spec"]["leaseTransitions"] == 1
    # The old leader finds out on its next round (it would already have stepped down at its renew deadline).
    assert not await a.try_once()
    assert not a.is_leader and a.holder == "b"


async def test_leader_steps_down_when_it_cannot_renew_within_its_deadline() -> None:
    server, clocks = FakeLeaseServer(), Clocks()
    a = elector(server, "a", clocks)
    await a.try_once()
    server.failing = True
    clocks.elapsed = 6.0
    assert await a.try_once()  # still inside the renew deadline: keeps leading
    clocks.elapsed = 10.0
    assert not await a.try_once()
    assert a.following.is_set()
    # It stopped before anyone else may take over (lease duration 15s).
    assert clocks.elapsed < 15


async def test_released_lease_lets_the_standby_take_over_without_waiting() -> None:
    server, clocks = FakeLeaseServer(), Clocks()
    a, b = elector(server, "a", clocks), elector(server, "b", clocks)
    await a.try_once()
    await a.release()
    assert not a.is_leader
    assert await b.try_once()
    assert server.writes == ["a", "", "b"]


async def test_release_after_losing_the_lease_leaves_the_new_holder_alone() -> None:
    server, clocks = FakeLeaseServer(), Clocks()
    a, b = elector(server, "a", clocks), elector(server, "b", clocks)
    await a.try_once()
    clocks.elapsed = 20.0
    await b.try_once()
    await a.release()
    assert server.lease is not None and server.lease["spec"]["holderIdentity"] == "b"


# --- terms: what fences a former leader's writes ---------------------------------------------------------------


async def test_a_takeover_gives_the_new_leader_a_higher_term_and_the_former_cannot_raise_its_own() -> None:
    server, clocks = FakeLeaseServer(), Clocks()
    first, second = elector(server, "a", clocks), elector(server, "b", clocks)
    assert await first.try_once() and first.term == 0
    assert not await second.try_once() and second.term is None
    clocks.elapsed += 16  # the first is paused past its Lease: it has not even noticed
    assert await second.try_once() and second.term == 1
    assert first.is_leader and first.term == 0
    assert await first.raise_term(above=1) is None, "its replace carries a stale resourceVersion"
    assert not first.is_leader and first.term is None
    assert server.lease is not None and server.lease["spec"]["leaseTransitions"] == 1


async def test_a_leader_whose_lease_was_created_again_raises_its_term_above_the_one_redis_holds() -> None:
    server, clocks = FakeLeaseServer(), Clocks()
    leader = elector(server, "a", clocks)
    assert await leader.try_once() and leader.term == 0  # a new Lease: its transitions start at 0 again
    assert await leader.raise_term(above=5) == 6
    assert await leader.raise_term(above=3) == 6, "already above: nothing written"
    clocks.elapsed += 2
    assert await leader.try_once() and leader.term == 6, "renewals keep the raised term"
    assert server.lease is not None and server.lease["spec"]["leaseTransitions"] == 6
