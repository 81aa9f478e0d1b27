"""A worker with nothing to do stops reading the change stream, and catches up before its next decision: the
entries since the pause when they are few, one load of the ledger when they outnumber what the table holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from hoss.framework.feed import CATCH_UP_MIN_ENTRIES, NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.ledger.arguments import NodeRow
from hoss.ledger.client import Ledger
from hoss.ledger.results import Reserved
from tests.kube_objects import batch_pod, node_row
from tests.waiting import until

ALLOC = {"cpu": 400_000, "memory": 8 << 40, "pods": 5000}
REQUEST = {"cpu": 100, "pods": 1}
NODES = "abc"


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    """Three nodes with room for every pod the tests reserve."""
    return [node_row(name, ALLOC) for name in NODES]


@asynccontextmanager
async def following(ledger: Ledger, *, idle: Callable[[], bool],
                    pause_after_seconds: float) -> AsyncIterator[tuple[NodeFeed, NodeTable]]:
    """A feed following the ledger into a table of its own until the block ends."""
    table = NodeTable()
    feed = NodeFeed(ledger, table, block_ms=5, idle=idle, pause_after_seconds=pause_after_seconds)
    stopping = asyncio.Event()
    task = asyncio.create_task(feed.follow(stopping))
    try:
        yield feed, table
    finally:
        stopping.set()
        await asyncio.wait_for(task, timeout=5)


async def reserve(ledger: Ledger, uid: str, node: str) -> None:
    results = await ledger.reserve_batch([batch_pod(uid, node, cpu=REQUEST["cpu"], namespace="team")], owner="other",
                                         ttl_seconds=300)
    assert isinstance(results, list) and isinstance(results[0], Reserved)


async def expected_table(ledger: Ledger) -> tuple[dict[str, dict[str, int]], set[str]]:
    table = NodeTable()
    assert await NodeFeed(ledger, table).load()
    return {name: table.used_of(name) for name in NODES}, set(table.pods)


@pytest.mark.parametrize("changes", [5, CATCH_UP_MIN_ENTRIES + 20])
async def test_an_idle_worker_reads_nothing_then_catches_up_before_it_decides(ledger: Ledger, changes: int) -> None:
    idle = [True]
    async with following(ledger, idle=lambda: idle[0], pause_after_seconds=0.05) as (feed, table), \
            following(ledger, idle=lambda: False, pause_after_seconds=0.05) as (_busy, witness):
        await until(lambda: feed.pauses == 1 and not feed.current.is_set(), timeout=10, what="the idle feed to pause")
        applied, reads = feed.applied, feed.reads
        for n in range(changes):  # another worker's reservations, one entry each
            await reserve(ledger, f"p{n}", NODES[n % len(NODES)])
        # A busy worker's feed reads them all; the paused one, meanwhile, nothing.
        await until(lambda: len(witness.pods) == changes, timeout=10, what=f"a busy feed to apply {changes} entries")
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
        await until(lambda: "busy" in table.pods, timeout=10, what="the woken feed to apply a new entry")
        assert feed.pauses == 1


async def test_a_busy_worker_never_pauses_and_stopping_ends_a_pause(ledger: Ledger) -> None:
    # Started together with the same pause delay: once the idle one has paused, the busy one has been busy for
    # longer than that delay, and a few reads more leave it every chance to pause too.
    async with following(ledger, idle=lambda: False, pause_after_seconds=0.01) as (busy, _table):
        async with following(ledger, idle=lambda: True, pause_after_seconds=0.01) as (idle, _idle_table):
            await until(lambda: idle.pauses == 1, timeout=10, what="the idle feed to pause")
            reads = busy.reads
            await until(lambda: busy.reads >= reads + 3, timeout=10, what="the busy feed to read three times more")
            assert busy.pauses == 0 and busy.current.is_set()
        assert idle.current.is_set(), "nobody waits on a feed that stopped"
