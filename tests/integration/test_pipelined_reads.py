"""Pipelined connections (`hoss.ledger.redisclient.PipelinedRedis`) where redis-py's pool was, on a real redis-server:
the workers' blocking reads of the change stream and the work stream (`workers.connections.Pipelined`) give exactly what
redis-py gives, a read blocks until an entry arrives and holds up nothing else; the dispatcher's sends leave exactly
what redis-py's transaction left, and fail as it does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from hoss.errors import LedgerUnavailable
from hoss.ledger.arguments import Placement
from hoss.ledger.client import Ledger
from hoss.ledger.keys import STATS_KEY
from hoss.ledger.redisclient import PipelinedRedis
from hoss.queue import DISPATCHED, WORKERS, WorkItem, WorkQueue, queue_key
from tests.integration.redis_server import blocked_in_redis


@pytest.fixture
async def pipelined(redis_url: str) -> AsyncIterator[PipelinedRedis]:
    client = PipelinedRedis(redis_url)
    yield client
    await client.aclose()


async def test_change_stream_reads_match_redis_py_and_block_until_an_entry(
    client: redis.asyncio.Redis, redis_url: str, pipelined: PipelinedRedis
) -> None:
    plain = Ledger(client)
    await plain.rebuild(nodes=[("n1", {"cpu": 4000, "pods": 10}, {}), ("n2", {"cpu": 2000, "pods": 10}, {"z": "a"})],
                        bound=[])
    await plain.sync_node(node="n2", allocatable={"cpu": 3000, "pods": 10}, labels={"z": "b"})
    reading = Ledger(client, reads=pipelined)
    expected = await plain.changes("0-0")
    assert len(expected) >= 2, "the rebuild and the node change are on the stream"
    assert await reading.changes("0-0") == expected
    assert await reading.changes("0-0", count=1) == expected[:1]
    assert pipelined._protocol is not None, "the reads went through the pipelined connection"

    # A blocked read on its own connection waits for the next entry; the scripts' connection is not held up.
    scripts = PipelinedRedis(redis_url)
    try:
        waiting = asyncio.create_task(reading.changes(expected[-1].id, block_ms=5000))
        await blocked_in_redis(client)
        assert not waiting.done()
        writer = Ledger(client, scripts=scripts)
        await writer.sync_node(node="n1", allocatable={"cpu": 8000, "pods": 10})
        arrived = await asyncio.wait_for(waiting, 5)
        assert arrived, "the node change woke the read"
        assert arrived == (await plain.changes(expected[-1].id))[:len(arrived)]
        last = (await plain.changes(expected[-1].id))[-1].id
        assert await reading.changes(last, block_ms=50) == [], "a block that times out reads nothing"
    finally:
        await scripts.aclose()


async def test_work_stream_reads_match_redis_py_new_and_pending(
    client: redis.asyncio.Redis, pipelined: PipelinedRedis
) -> None:
    queue = WorkQueue(client)
    reading = WorkQueue(client, reads=pipelined)
    await queue.ensure_group("w1")
    items = [WorkItem(uid=f"u{i}", namespace="ns", name=f"p{i}", policy="default", pod=f'{{"n":{i}}}', digest=f"d{i}")
             for i in range(3)]
    ids = await queue.enqueue_many([("w1", item) for item in items])

    new = await reading.read("w1", count=10, block_ms=100)
    assert new == list(zip(ids, items, strict=True))
    assert pipelined._protocol is not None, "the read went through the pipelined connection"
    assert await reading.read("w1", count=10, block_ms=50) == [], "nothing new: the block times out"
    assert await reading.read("w1", count=10, block_ms=0, pending=True) == \
        await queue.read("w1", count=10, block_ms=0, pending=True) == new

    waiting = asyncio.create_task(reading.read("w1", count=10, block_ms=5000))
    await blocked_in_redis(client)
    assert not waiting.done()
    [late_id] = await queue.enqueue_many([("w1", items[0])])
    assert await asyncio.wait_for(waiting, 5) == [(late_id, items[0])]


async def test_dispatch_sends_on_the_pipelined_connection_leave_what_redis_py_leaves(
    client: redis.asyncio.Redis, pipelined: PipelinedRedis
) -> None:
    items = [WorkItem(uid=f"u{i}", namespace="ns", name=f"p{i}", policy="default", pod=f'{{"n":{i}}}', digest=f"d{i}")
             for i in range(4)]
    assignments = [("w1", items[0]), ("w2", items[1]), ("w1", items[2]), ("w2", items[3])]

    async def state() -> tuple[object, ...]:
        streams = {w: [fields for _id, fields in cast(list[tuple[str, dict[str, str]]],
                                                        await client.xrange(queue_key(w)))] for w in ("w1", "w2")}
        return streams, await client.hgetall(DISPATCHED), await client.smembers(WORKERS)

    ids = await WorkQueue(client).enqueue_many(assignments)
    expected = await state()
    await client.flushdb()
    sent = await WorkQueue(client, pipelined=pipelined).enqueue_many(assignments)
    assert await state() == expected
    assert [await client.xrange(queue_key(w), s, s) != [] for (w, _item), s in zip(assignments, sent, strict=True)] \
        == [True] * 4, "each id names its item in its worker's stream"
    assert len(sent) == len(ids) == 4


async def test_a_dispatch_send_redis_refuses_raises_as_redis_py_does(
    client: redis.asyncio.Redis, pipelined: PipelinedRedis
) -> None:
    item = WorkItem(uid="u1", namespace="ns", name="p1", policy="default", pod="{}", digest="d")
    for queue in (WorkQueue(client), WorkQueue(client, pipelined=pipelined)):
        await client.flushdb()
        await client.set(queue_key("w2"), "not a stream")  # the second XADD fails inside the transaction
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await queue.enqueue_many([("w1", item), ("w2", item)])


async def test_the_ledgers_plain_reads_and_writes_on_a_pipelined_connection_match_redis_py(
    client: redis.asyncio.Redis, pipelined: PipelinedRedis
) -> None:
    """A ledger whose one client is pipelined (as the webhook's) answers every call that is not a script as redis-py
    does: the stats, their counting (MULTI ... EXEC), the watchdog's tick, bound entries and the change stream's
    first id; a command Redis refuses inside the transaction raises LedgerUnavailable through both."""
    plain, piped = Ledger(client), Ledger(pipelined)
    await plain.rebuild(nodes=[("n1", {"cpu": 4000, "pods": 10}, {})],
                        bound=[Placement(uid="b1", pod="ns/b1", node="n1", request={"cpu": 100, "pods": 1})])
    await plain.reserve(uid="a1", pod="ns/a1", node="n1", request={"cpu": 100, "pods": 1}, owner="w", ttl_seconds=30)

    await piped.count("audit_drift", 2, "two entries repaired")
    await plain.count("audit_drift", 1, "one more")
    assert await piped.stats() == await plain.stats() == {"audit_drift": "3", "last_audit_drift": "one more"}
    epoch, stamp = await piped.tick()
    assert (epoch, stamp + 1) == await plain.tick()
    assert epoch == await plain.epoch()
    assert await piped.bound_nodes(["b1", "a1", "gone"]) == await plain.bound_nodes(["b1", "a1", "gone"]) \
        == {"b1": "n1"}
    assert await piped.bound_nodes([]) == {}
    assert await piped.first_change() == await plain.first_change() is not None

    await client.hset(STATS_KEY, "broken", "not a number")
    for ledger in (plain, piped):
        with pytest.raises(LedgerUnavailable, match="not an integer"):
            await ledger.count("broken", 1, "what")
    assert await piped.stats() == await plain.stats()
    assert (await plain.stats())["last_broken"] == "what", "the transaction ran its other command, as Redis does"
