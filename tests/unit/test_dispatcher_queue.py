"""The dispatcher -> worker protocol on fakeredis: send, read, acknowledge, heartbeat expiry and reclaim."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from hoss.ledger.client import Ledger
from hoss.queue import DISPATCHED, GangMember, WorkerInfo, WorkItem, WorkQueue, queue_key, worker_key
from tests.waiting import until


@pytest.fixture
def now() -> list[float]:
    """The wall clock the queue stamps heartbeats with; a test moves it."""
    return [1_700_000_000.0]


@pytest.fixture
def queue(fake_redis: fakeredis.FakeAsyncRedis, now: list[float]) -> WorkQueue:
    return WorkQueue(fake_redis, clock=lambda: now[0])


def item(n: int, policy: str = "default") -> WorkItem:
    return WorkItem(uid=f"uid-{n}", namespace="team", name=f"pod-{n}", policy=policy)


async def test_worker_reads_what_was_enqueued_in_order(queue: WorkQueue) -> None:
    await queue.ensure_group("a")
    for n in range(3):
        await queue.enqueue("a", item(n))
    read = await queue.read("a", count=10, block_ms=10)
    assert [work.uid for _id, work in read] == ["uid-0", "uid-1", "uid-2"]
    assert await queue.dispatched() == {"uid-0": "a", "uid-1": "a", "uid-2": "a"}


async def test_work_item_round_trips_with_gang_members(queue: WorkQueue) -> None:
    gang = WorkItem(
        uid="g-0", namespace="team", name="train-0", policy="gang", gang="team/train",
        members=(GangMember("g-0", "team", "train-0"), GangMember("g-1", "team", "train-1")),
        min_available=2, attempt=3,
    )
    await queue.ensure_group("a")
    await queue.enqueue("a", gang)
    [(_id, read)] = await queue.read("a", count=1, block_ms=10)
    assert read == gang
    assert await queue.dispatched() == {"g-0": "a", "g-1": "a"}


async def test_ack_removes_the_item_from_the_stream_and_the_dispatched_map(queue: WorkQueue) -> None:
    await queue.ensure_group("a")
    await queue.enqueue("a", item(1))
    await queue.enqueue("a", item(2))
    (first_id, first), _second = await queue.read("a", count=2, block_ms=10)
    await queue.ack("a", first_id, [first.uid])
    assert await queue.depth("a") == 1
    assert await queue.dispatched() == {"uid-2": "a"}
    # Nothing is pending for redelivery after a restart either, except the unacknowledged item.
    assert [work.uid for _id, work in await queue.read("a", count=10, block_ms=10, pending=True)] == ["uid-2"]


async def test_reclaim_returns_delivered_unacked_and_undelivered_items_and_deletes_the_stream(
    queue: WorkQueue,
) -> None:
    await queue.heartbeat(WorkerInfo(id="a", policies=["default"]), ttl_seconds=30)
    await queue.ensure_group("a")
    for n in range(4):
        await queue.enqueue("a", item(n))
    delivered = await queue.read("a", count=2, block_ms=10)
    done_id, done = delivered[0]
    await queue.ack("a", done_id, [done.uid])

    reclaimed = await queue.reclaim("a")

    # uid-1 was delivered and not acknowledged; uid-2 and uid-3 were never delivered; uid-0 was finished.
    assert [work.uid for work in reclaimed] == ["uid-1", "uid-2", "uid-3"]
    assert not await queue.redis.exists(queue_key("a"))
    assert not await queue.redis.exists(worker_key("a"))
    assert await queue.workers() == ([], set())


async def test_a_worker_that_stops_beating_is_dead(queue: WorkQueue) -> None:
    await queue.heartbeat(WorkerInfo(id="quiet", policies=["default"]), ttl_seconds=0.3)
    await queue.heartbeat(WorkerInfo(id="steady", policies=["default"]), ttl_seconds=30)
    live, dead = await queue.workers()
    assert sorted(w.id for w in live) == ["quiet", "steady"]
    assert dead == set()

    async def quiet_is_dead() -> tuple[bool, str]:
        live, dead = await queue.workers()
        return dead == {"quiet"}, f"live {sorted(w.id for w in live)}, dead {sorted(dead)}"

    # A heartbeat is a key that expires on the Redis server's clock: wait for it.
    await until(quiet_is_dead, timeout=10, what="quiet's 0.3 s heartbeat to expire")
    live, _dead = await queue.workers()
    assert [w.id for w in live] == ["steady"]


async def test_heartbeat_publishes_what_the_worker_says_about_itself(queue: WorkQueue) -> None:
    info = WorkerInfo(id="a", policies=["default", "gpu"], queue_depth=3, in_flight=2, capacity=64,
                      counters={"bound": 10, "conflicts": 1}, ready=2, decide_rate=412.5)
    await queue.heartbeat(info, ttl_seconds=30)
    [seen], _dead = await queue.workers()
    assert seen.policies == ["default", "gpu"]
    assert (seen.queue_depth, seen.in_flight, seen.capacity) == (3, 2, 64)
    assert (seen.ready, seen.decide_rate) == (2, 412.5)
    assert seen.counters == {"bound": 10, "conflicts": 1}
    assert seen.heartbeat_unix > 0


async def test_the_binding_budget_is_shared_by_the_workers_that_have_bindings_to_post(
    queue: WorkQueue, now: list[float]
) -> None:
    def beat(worker: str, *, binding: bool) -> Any:
        return queue.heartbeat(WorkerInfo(id=worker, policies=["default"]), ttl_seconds=30, binding=binding)

    await beat("idle-1", binding=False)
    await beat("idle-2", binding=False)
    assert queue.binding_workers == 1, "idle workers do not take a share: the one that starts binding has it all"
    await beat("busy-1", binding=True)
    assert queue.binding_workers == 1
    await beat("busy-2", binding=True)
    assert queue.binding_workers == 2
    await beat("idle-1", binding=False)
    assert queue.binding_workers == 3, "a worker with nothing to bind counts itself, for when it has"
    await beat("busy-1", binding=False)
    await beat("busy-2", binding=True)
    assert queue.binding_workers == 1, "a worker that finished binding gives its share back at its next beat"
    await queue.deregister("busy-2")
    await beat("dying", binding=True)
    now[0] += 31  # past the heartbeat TTL every worker has
    await beat("busy-1", binding=True)
    assert queue.binding_workers == 1, "deregistered and long-silent workers hold no share"


async def test_forget_drops_uids_from_the_dispatched_map(queue: WorkQueue) -> None:
    await queue.enqueue("a", item(1))
    await queue.enqueue("a", item(2))
    await queue.forget(["uid-1"])
    await queue.forget([])
    assert await queue.redis.hgetall(DISPATCHED) == {"uid-2": "a"}


async def test_a_pod_that_leaves_the_pending_set_gives_up_the_room_held_for_it(queue: WorkQueue) -> None:
    ledger = Ledger(queue.redis)
    await ledger.rebuild(nodes=[("n1", {"cpu": 4000, "pods": 110}, {}, "")], bound=[])
    await queue.ensure_group("a")
    await queue.enqueue("a", item(1))
    await ledger.nominate(uid="uid-1", node="n1", priority=100, request={"cpu": 4000, "pods": 1}, ttl_seconds=60)
    await ledger.nominate(uid="uid-9", node="n1", priority=100, request={"cpu": 1, "pods": 1}, ttl_seconds=60)
    assert await queue.mark_gone(["uid-1"]) == 1
    assert set(await ledger.nominations()) == {"uid-9"}
