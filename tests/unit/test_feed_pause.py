"""A worker with nothing to do stops reading the change stream, and catches up before its next decision: the
entries since the pause when they are few, one load of the ledger when they outnumber what the table holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import fakeredis
import pytest

from hoss.framework.feed import CATCH_UP_MIN_ENTRIES, NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.ledger.arguments import BatchPod
from hoss.ledger.client import Ledger
from hoss.ledger.results import Reserved
from hoss.model import compact
from tests.unit.kube_objects import raw_node
from tests.unit.tls_apiserver import until

ALLOC = {"cpu": 400_000, "memory": 8 << 40, "pods": 5000}
REQUEST = {"cpu": 100, "pods": 1}
NODES = "abc"


@pytest.fixture
async def ledger() -> AsyncIterator[Ledger]:
    redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    ledger = Ledger(redis)
    await ledger.rebuild(nodes=[(name, ALLOC, {}, compact.encode(compact.compact_node(raw_node(name))).decode())
                                for name in NODES], bound=[])
    yield ledger
    await redis.aclose()


async def reserve(ledger: Ledger, uid: str, node: str) -> None:
    results = await ledger.reserve_batch([BatchPod(uid=uid, pod=f"team/{uid}", digest="", candidates=[node],
                                                   request=REQUEST)], owner="other", ttl_seconds=300)
    assert isinstance(results, list) and isinstance(results[0], Reserved)


async def expected_table(ledger: Ledger) -> tuple[dict[str, dict[str, int]], set[str]]:
    table = NodeTable()
    assert await NodeFeed(ledger, table).load()
    return {name: table.used_of(name) for name in NODES}, set(table.pods)


@pytest.mark.parametrize("changes", [5, CATCH_UP_MIN_ENTRIES + 20])
async def test_an_idle_worker_reads_nothing_then_catches_up_before_it_decides(ledger: Ledger, changes: int) -> None:
    idle = [True]
    table = NodeTable()
    feed = NodeFeed(ledger, table, block_ms=5, idle=lambda: idle[0], pause_after_seconds=0.05)
    stopping = asyncio.Event()
    task = asyncio.create_task(feed.follow(stopping))
    try:
        await until(lambda: feed.pauses == 1 and not feed.current.is_set())
        applied, reads = feed.applied, feed.reads
        for n in range(changes):  # another worker's reservations, one entry each
            await reserve(ledger, f"p{n}", NODES[n % len(NODES)])
        await asyncio.sleep(0.1)
        assert (feed.applied, feed.reads) == (applied, reads), "a paused feed reads nothing"
        assert all(table.used_of(name) == {} for name in NODES), "so its table is behind the ledger"

        idle[0] = False  # work arrived: the decision waits for the table to be current
        await asyncio.wait_for(feed.ready(), timeout=5)

        used, pods = await expected_table(ledger)
        assert {name: table.used_of(name) for name in NODES} == used
        assert set(table.pods) == pods and len(pods) == changes
        # A few entries are applied; more than the table holds (nodes + pods) are replaced by one load.
        assert feed.catch_up_loads == (0 if changes < CATCH_UP_MIN_ENTRIES else 1)
        await reserve(ledger, "busy", "a")  # a busy worker follows the stream again
        await until(lambda: "busy" in table.pods)
        assert feed.pauses == 1
    finally:
        stopping.set()
        await asyncio.wait_for(task, timeout=5)


async def test_a_busy_worker_never_pauses_and_stopping_ends_a_pause(ledger: Ledger) -> None:
    table = NodeTable()
    busy = NodeFeed(ledger, table, block_ms=5, idle=lambda: False, pause_after_seconds=0.01)
    stopping = asyncio.Event()
    task = asyncio.create_task(busy.follow(stopping))
    await asyncio.sleep(0.2)
    assert busy.pauses == 0 and busy.current.is_set()
    stopping.set()
    await asyncio.wait_for(task, timeout=5)

    idle = NodeFeed(ledger, NodeTable(), block_ms=5, idle=lambda: True, pause_after_seconds=0.01)
    stopping = asyncio.Event()
    task = asyncio.create_task(idle.follow(stopping))
    await until(lambda: idle.pauses == 1)
    stopping.set()
    await asyncio.wait_for(task, timeout=5)
    assert idle.current.is_set(), "nobody waits on a feed that stopped"
