"""The write fence on a real redis-server, as the resolver runs it: the webhook's pipelined client with many reviews
in flight at once never raises a false alarm, and a Redis restored (DUMP/RESTORE) from a copy taken right after a
write, younger than any stamp tick, is noticed by the next reviews: all refused, the stale copy counted once, the
ledger failing closed until the sync rebuilds it (hoss/ledger/fence.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from hoss.ledger.arguments import BoundPod
from hoss.ledger.client import Ledger
from hoss.ledger.redisclient import PipelinedRedis
from hoss.ledger.results import Confirmed, Conflict, LedgerNotReady
from tests.kube_objects import node_row

POD = {"cpu": 100, "pods": 1}
NODES = [node_row("n1", {"cpu": 64000, "pods": 1000})]


@pytest.fixture
async def webhook(ledger: Ledger, redis_url: str) -> AsyncIterator[Ledger]:
    """The resolver's two fenced ledgers: the sync's (redis-py) rebuilds, the webhook's (pipelined) is yielded."""
    sync = Ledger(redis.asyncio.Redis.from_url(redis_url, decode_responses=True), owns_client=True, fenced=True)
    await sync.rebuild(nodes=NODES, bound=[])
    review = Ledger(PipelinedRedis(redis_url), owns_client=True, fenced=True)
    yield review
    await review.close()
    await sync.close()


async def created(ledger: Ledger, uids: list[str]) -> list[object]:
    """The webhook's judgement of pods created on n1, all at once."""
    return list(await asyncio.gather(*(
        ledger.confirm(uid=uid, pod=f"ns/{uid}", node="n1", request=POD, owner="webhook", verify_after_seconds=30,
                       via="create") for uid in uids)))


async def test_reviews_in_flight_together_raise_no_false_alarm(webhook: Ledger) -> None:
    results = await created(webhook, [f"p{i}" for i in range(200)])
    assert all(isinstance(r, Confirmed) for r in results)
    assert await webhook.check_fence()
    assert "stale_ledger" not in await webhook.stats()


async def test_a_copy_taken_right_after_a_write_is_noticed_by_the_next_reviews_and_counted_once(
    webhook: Ledger, redis_url: str,
) -> None:
    await created(webhook, [f"a{i}" for i in range(20)])
    async with redis.asyncio.Redis.from_url(redis_url) as raw:
        keys = [key async for key in raw.scan_iter(match="{hoss}:*")]
        copy = {key: await raw.dump(key) for key in keys}
        await created(webhook, [f"b{i}" for i in range(20)])  # lost with the restore
        pipe = raw.pipeline(transaction=True)
        pipe.flushdb()
        for key, value in copy.items():
            if value is not None:
                pipe.restore(key, 0, value)
        await pipe.execute()
    assert await webhook.is_ready(), "the copy says it is ready"

    results = await created(webhook, [f"c{i}" for i in range(20)])
    assert all(isinstance(r, LedgerNotReady) for r in results), results
    assert (await webhook.stats())["stale_ledger"] == "1"

    truth = [BoundPod(uid=f"{p}{i}", pod=f"ns/{p}{i}", node="n1", request=POD) for p in "ab" for i in range(20)]
    async with Ledger.from_url(redis_url) as sync:
        await sync.rebuild(nodes=[node_row("n1", {"cpu": 4000, "pods": 1000})], bound=truth)
    assert isinstance((await created(webhook, ["d"]))[0], Conflict), "b's 20 pods are counted again"
    assert await webhook.check_fence()
