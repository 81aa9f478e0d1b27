"""Fencing the dispatcher leader (hoss/queue.py, Fencing): every write only the leader may make carries its term,
and once a leader of a later term wrote, Redis refuses the former leader's sends, marks, resends, forgetting and
reclaiming, and nothing of them happens. Against a real redis-server, as the Lua scripts run there."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis.asyncio

from dispatcher.core import Dispatcher
from dispatcher.roles import cancel_and_wait
from hoss.queue import DISPATCHED, Fence, Fenced, WorkItem, WorkQueue, queue_key, term_key
from tests.integration.dispatching import beat, pending_pod, settings, stream_items
from tests.waiting import until

KEY = term_key("hoss-system/hoss-dispatcher")


class Term:
    """A replica's term as its elector says it: a number while it leads, None once it does not."""

    def __init__(self, value: int | None) -> None:
        self.value = value

    def __call__(self) -> int | None:
        return self.value


def leader(client: redis.asyncio.Redis, term: int | None) -> WorkQueue:
    return WorkQueue(client, fence=Fence(key=KEY, term=Term(term)))


def item(n: int) -> WorkItem:
    return WorkItem(uid=f"uid-{n}", namespace="team", name=f"pod-{n}", policy="default")


async def test_once_a_later_leader_claimed_its_term_every_write_of_the_former_is_refused(
    client: redis.asyncio.Redis,
) -> None:
    former, later = leader(client, 3), leader(client, 4)
    await former.enqueue_many([("w1", item(1))])
    await later.claim_term()
    writes = [former.enqueue_many([("w1", item(2))]), former.mark_gone(["uid-1"]), former.forget(["uid-1"]),
              former.resend_changed("w1", item(1)), former.reclaim("w1")]
    for write in writes:
        with pytest.raises(Fenced) as refused:
            await write
        assert (refused.value.term, refused.value.newer) == (3, 4)
    assert [i.uid for i in await stream_items(former, "w1")] == ["uid-1"], "nothing was sent, resent or taken"
    assert await client.hgetall(DISPATCHED) == {"uid-1": "w1"}, "nothing was marked or forgotten"
    assert await client.get(KEY) == "4"
    assert [i.uid for i in await later.reclaim("w1")] == ["uid-1"], "the later leader writes"


async def test_a_later_leaders_first_write_claims_its_term_and_an_earlier_term_never_lowers_it(
    client: redis.asyncio.Redis,
) -> None:
    former, later = leader(client, 3), leader(client, 4)
    await later.enqueue_many([("w1", item(1))])
    with pytest.raises(Fenced):
        await former.claim_term()
    assert await client.get(KEY) == "4"


async def test_a_redis_that_lost_the_term_takes_the_next_writers_and_still_orders_the_leaders(
    client: redis.asyncio.Redis,
) -> None:
    former, later = leader(client, 3), leader(client, 4)
    await later.claim_term()
    await client.delete(KEY)  # Redis came back empty
    await former.enqueue_many([("w1", item(1))])
    await later.enqueue_many([("w1", item(2))])
    with pytest.raises(Fenced):
        await former.enqueue_many([("w1", item(3))])
    assert [i.uid for i in await stream_items(later, "w1")] == ["uid-1", "uid-2"]


async def test_a_replica_that_does_not_lead_writes_nothing(client: redis.asyncio.Redis) -> None:
    with pytest.raises(Fenced) as refused:
        await leader(client, None).enqueue_many([("w1", item(1))])
    assert refused.value.newer is None
    assert await client.exists(queue_key("w1"), DISPATCHED, KEY) == 0


async def test_a_dispatcher_whose_writes_are_refused_counts_them_and_asks_its_elector_about_the_later_term(
    client: redis.asyncio.Redis,
) -> None:
    queue = leader(client, 3)
    await beat(queue, "w1")
    asked: list[int] = []

    async def fenced(newer: int) -> None:  # the elector's raise_term, in the service
        asked.append(newer)

    dispatcher = Dispatcher(queue=queue, settings=settings(), rng=random.Random(11), on_fenced=fenced)
    await dispatcher.on_list([pending_pod(1)])
    dispatcher.synced.set()
    await leader(client, 7).claim_term()
    leading = asyncio.create_task(dispatcher.lead())
    try:
        await until(lambda: len(asked) >= 2, timeout=10, what="the claim and a round to be refused")
    finally:
        await cancel_and_wait(leading)
    assert set(asked) == {7}
    assert dispatcher.metrics.registry.get_sample_value("hoss_dispatcher_fenced_writes_total") == len(asked)
    assert await stream_items(queue, "w1") == [] and await client.hgetall(DISPATCHED) == {}
