"""Recovery on a real redis-server: a worker whose queue is taken away comes back by itself, a stuck worker is
passed over, acknowledgements never drop another worker's pods, and Redis failures are classified."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio
from redis.exceptions import BusyLoadingError, ConnectionError, OutOfMemoryError, ReadOnlyError, ResponseError

from bench.pipeline import drive, node_object, pod_object, prepare_ledger, run_worker, worker_settings
from dev.local.plane import POLICIES_FILE
from dispatcher.core import Dispatcher
from dispatcher.settings import DispatcherSettings
from hoss.errors import LedgerUnavailable
from hoss.queue import DISPATCHED, QueueLost, WorkerInfo, WorkItem, WorkQueue, classify, queue_key
from tests.waiting import until

pytestmark = pytest.mark.integration


def test_redis_failures_are_classified_as_outage_lost_queue_or_bug() -> None:
    for outage in (ConnectionError("reset"), BusyLoadingError("loading"), OutOfMemoryError("oom"),
                   ReadOnlyError("replica"), ResponseError("BUSY Redis is busy running a script"),
                   ResponseError("Command # 1 (EVALSHA) of pipeline caused error: MASTERDOWN link down")):
        assert isinstance(classify(outage), LedgerUnavailable), outage
    assert isinstance(classify(ResponseError("NOGROUP No such key 'q' or consumer group 'hoss'")), QueueLost)
    assert classify(ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")) is None
    assert classify(ResponseError("BUSYGROUP Consumer Group name already exists")) is None


async def test_a_worker_whose_stream_vanished_reads_nogroup_as_queue_lost_and_registers_again(
    client: redis.asyncio.Redis,
) -> None:
    queue = WorkQueue(client)
    await queue.ensure_group("w")
    await queue.reclaim("w")
    with pytest.raises(QueueLost):
        await queue.read("w", count=10, block_ms=10)
    await queue.enqueue("w", WorkItem(uid="u1", namespace="ns", name="p1", policy="default"))
    with pytest.raises(QueueLost):  # the dispatcher's XADD made a stream without the group
        await queue.read("w", count=10, block_ms=10)
    await queue.ensure_group("w")
    assert [item.uid for _id, item in await queue.read("w", count=10, block_ms=10)] == ["u1"]


async def test_an_acknowledgement_never_drops_a_pod_another_worker_now_holds(client: redis.asyncio.Redis) -> None:
    queue = WorkQueue(client)
    await queue.ensure_group("old")
    message = await queue.enqueue("old", WorkItem(uid="u1", namespace="ns", name="p1", policy="default"))
    await queue.read("old", count=10, block_ms=10)
    await queue.reclaim("old")  # declared dead: its pod goes to another worker
    await queue.enqueue("new", WorkItem(uid="u1", namespace="ns", name="p1", policy="default"))
    await queue.ack("old", message, ["u1"])  # the old worker comes back and finishes what it held
    assert await client.hgetall(DISPATCHED) == {"u1": "new"}
    await queue.ensure_group("new")
    [(new_id, _item)] = await queue.read("new", count=10, block_ms=10)
    await queue.ack("new", new_id, ["u1"])
    assert await client.hgetall(DISPATCHED) == {}
    assert await client.xlen(queue_key("new")) == 0


async def test_a_worker_that_heartbeats_but_reads_nothing_is_passed_over_and_its_work_moves(
    client: redis.asyncio.Redis,
) -> None:
    queue = WorkQueue(client)
    now = [100.0]
    dispatcher = Dispatcher(queue=queue, settings=DispatcherSettings(identity="t", stall_seconds=10, pack_depth=5),
                            clock=lambda: now[0])  # 20 pods: each worker takes 5, the rest are spread
    await dispatcher.on_list([pod_object(n) | {"spec": {**pod_object(n)["spec"], "schedulerName": "hoss"}}
                              for n in range(20)])
    dispatcher.synced.set()
    for worker in ("stuck", "fine"):
        await queue.heartbeat(WorkerInfo(id=worker, policies=["default"], progress=5), ttl_seconds=60)
    await dispatcher.tick()
    mine = {owner for owner in (await queue.dispatched()).values()}
    assert mine == {"stuck", "fine"}
    now[0] += 11  # "fine" read its work meanwhile; "stuck" did not move
    await queue.heartbeat(WorkerInfo(id="fine", policies=["default"], progress=9), ttl_seconds=60)
    report = await dispatcher.tick()
    assert report.dead_workers == ["stuck"]
    assert set((await queue.dispatched()).values()) == {"fine"}
    assert [w.id for w in dispatcher.workers] == ["fine"]


async def test_a_worker_whose_queue_was_taken_away_mid_run_recreates_it_and_every_pod_is_bound(
    client: redis.asyncio.Redis, redis_url: str
) -> None:
    await prepare_ledger(client, [node_object(f"n{i:02d}", cpu="4", pods="110") for i in range(10)])
    stop = asyncio.Event()
    settings = [worker_settings(f"w{i}", redis_url, str(POLICIES_FILE), seed=i) for i in (1, 2)]
    workers = [asyncio.create_task(run_worker(s, stop)) for s in settings]
    queue = WorkQueue(client)

    async def take_w1_queue_away() -> None:
        # What a reclaim does to a worker declared dead while it was only paused: its stream, group and
        # dispatched entries vanish; the dispatcher sends those pods again.
        async def w1_working() -> tuple[bool, str]:
            owners = set((await queue.dispatched()).values())
            return "w1" in owners, f"pods dispatched to {sorted(owners)}"

        await until(w1_working, timeout=60, what="w1 to be given pods")
        await queue.reclaim("w1")
        owned = [uid for uid, owner in (await queue.dispatched()).items() if owner == "w1"]
        await queue.forget(owned)

    try:
        chaos = asyncio.create_task(take_w1_queue_away())
        run = await drive(client, [pod_object(n) for n in range(300)], expected_workers=2, timeout=90)
        await chaos
    finally:
        stop.set()
        finished = await asyncio.gather(*workers)
    assert run.bound == 300
    assert finished[0].requeues >= 1, "w1 must have noticed its queue was gone"


async def test_a_heartbeat_says_when_its_key_was_gone_and_has_group_sees_the_queue_vanish(
    client: redis.asyncio.Redis,
) -> None:
    queue = WorkQueue(client)
    info = WorkerInfo(id="w", policies=["default"])
    assert not await queue.heartbeat(info, ttl_seconds=60), "the first beat finds no earlier one"
    assert await queue.heartbeat(info, ttl_seconds=60)
    await queue.ensure_group("w")
    assert await queue.has_group("w")
    await queue.reclaim("w")  # declared dead
    assert not await queue.has_group("w")
    assert not await queue.heartbeat(info, ttl_seconds=60), "the beat after a reclaim finds its key gone"
