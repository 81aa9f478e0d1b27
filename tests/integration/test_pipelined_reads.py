"""The workers' blocking reads on pipelined connections of their own (`workers.core.Pipelined`), on a real
redis-server: the change stream and the work stream read through `resolver.redisclient.PipelinedRedis` give exactly
what redis-py's clients give, a read blocks until an entry arrives, and a blocked read holds up nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest
import redis.asyncio

from dispatcher.queue import WorkItem, WorkQueue
from resolver.ledger import Ledger
from resolver.redisclient import PipelinedRedis


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
        await asyncio.sleep(0.1)
        assert not waiting.done()
        writer = Ledger(client, scripts=cast(redis.asyncio.Redis, scripts))
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
    await asyncio.sleep(0.1)
    assert not waiting.done()
    [late_id] = await queue.enqueue_many([("w1", items[0])])
    assert await asyncio.wait_for(waiting, 5) == [(late_id, items[0])]
