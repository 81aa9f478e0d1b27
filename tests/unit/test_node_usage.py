"""A worker's usage per node: the ledger's totals from the change stream, plus what the worker counts itself until
the stream's entries hold it (a decision's tentative placement, a reservation whose entry the feed has not
applied yet). A reservation's reply and the feed's read of its entry come on different connections, in either
order; both orders must end with the ledger's totals, counted once."""

from __future__ import annotations

import pytest

from hoss.framework.feed import NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.ledger.arguments import GangMember, NodeRow
from hoss.ledger.client import Ledger
from hoss.ledger.results import GangReserved, Reserved
from tests.kube_objects import batch_pod, node_row, raw_node

REQUEST = {"cpu": 1000, "pods": 1}


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    return [node_row("a"), node_row("b")]


async def loaded(ledger: Ledger) -> tuple[NodeTable, NodeFeed]:
    table = NodeTable()
    feed = NodeFeed(ledger, table, block_ms=1)
    assert await feed.load()
    return table, feed


async def reserve(ledger: Ledger, uid: str, node: str) -> Reserved:
    results = await ledger.reserve_batch([batch_pod(uid, node, cpu=REQUEST["cpu"], namespace="team")], owner="w",
                                         ttl_seconds=30)
    assert isinstance(results, list)
    [result] = results
    assert isinstance(result, Reserved) and result.change
    return result


async def test_a_reservation_whose_entry_comes_after_the_reply_is_counted_once(ledger: Ledger) -> None:
    table, feed = await loaded(ledger)
    table.hold_locally("a", REQUEST)  # the decision's tentative placement
    result = await reserve(ledger, "p1", "a")
    table.drop_locally("a", REQUEST)
    table.expect("a", REQUEST, result.change, feed.position)
    assert table.used_of("a") == REQUEST  # counted while its entry is on the way
    await feed.step()
    assert table.used_of("a") == REQUEST  # the entry's totals hold it now, not twice
    await ledger.release("p1")
    await feed.step()
    assert table.used_of("a") == {}


async def test_a_reservation_whose_entry_comes_before_the_reply_is_counted_once(ledger: Ledger) -> None:
    table, feed = await loaded(ledger)
    table.hold_locally("a", REQUEST)
    result = await reserve(ledger, "p1", "a")
    await feed.step()  # the feed read the entry first: totals hold the pod, the tentative count stays on top
    assert table.used_of("a") == {"cpu": 2000, "pods": 2}
    table.drop_locally("a", REQUEST)
    table.expect("a", REQUEST, result.change, feed.position)
    assert table.used_of("a") == REQUEST


async def test_a_gang_reserved_while_the_feed_ran_ahead_is_counted_once(ledger: Ledger) -> None:
    table, feed = await loaded(ledger)
    members = [GangMember(uid=f"g{i}", pod=f"team/g{i}", node=node, request=REQUEST)
               for i, node in enumerate("aab")]
    result = await ledger.reserve_gang(members=members, owner="w", ttl_seconds=30)
    assert isinstance(result, GangReserved) and result.change
    await feed.step()
    for member in members:
        table.expect(member.node, member.request, result.change, feed.position)
    assert table.used_of("a") == {"cpu": 2000, "pods": 2} and table.used_of("b") == REQUEST


async def test_totals_from_other_workers_keep_the_local_count_on_top_until_its_entry_arrives(
    ledger: Ledger
) -> None:
    table, feed = await loaded(ledger)
    mine = await reserve(ledger, "mine", "a")
    table.expect("a", REQUEST, mine.change, "0-0")  # as if the reply came before any entry was applied
    await reserve(ledger, "theirs", "a")  # another worker's reservation: its entry carries totals with both
    await feed.step()
    assert table.used_of("a") == {"cpu": 2000, "pods": 2}


def test_a_node_that_left_takes_its_local_count_with_it() -> None:
    table = NodeTable()
    table.upsert_node(raw_node("a"))
    table.hold_locally("a", REQUEST)
    table.expect("a", REQUEST, "5-0", "1-0")
    table.remove_node("a")
    table.upsert_node(raw_node("a"))
    table.settle("9-0")
    table.drop_locally("a", REQUEST)
    assert table.used_of("a") == {}
