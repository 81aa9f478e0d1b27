"""The write fence (hoss/ledger/fence.py, 'The write fence' in common.lua) on a fakeredis ledger: a fenced writer
notices a Redis that came back without writes it made, however young the copy and whatever other writers did since;
the ledger is marked not ready and counted stale, and the writer goes on once it is rebuilt."""

from __future__ import annotations

import fakeredis

from hoss.ledger.arguments import BoundPod
from hoss.ledger.client import Ledger
from hoss.ledger.fence import FENCE_PREFIX, WriteFence
from hoss.ledger.results import Confirmed, Conflict, LedgerNotReady, Reserved
from tests.kube_objects import node_row

POD = {"cpu": 1000, "pods": 1}
NODES = [node_row("n1", {"cpu": 2000, "pods": 10}), node_row("n2", {"cpu": 16000, "pods": 30})]

Copy = dict[bytes | str, bytes]


async def copy_of(redis: fakeredis.FakeAsyncRedis) -> Copy:
    """Every key, as a snapshot of Redis would keep it."""
    raw = fakeredis.FakeAsyncRedis(connection_pool=redis.connection_pool, decode_responses=False)
    return {key: value for key in await raw.keys("*") if (value := await raw.dump(key)) is not None}


async def restore(redis: fakeredis.FakeAsyncRedis, copy: Copy) -> None:
    """Redis comes back with `copy`, which still says the ledger is ready."""
    raw = fakeredis.FakeAsyncRedis(connection_pool=redis.connection_pool, decode_responses=False)
    await raw.flushdb()
    for key, value in copy.items():
        await raw.restore(key, 0, value)


async def create_on_n1(ledger: Ledger, uid: str) -> object:
    """The webhook's judgement of a pod created on n1 asking `POD`."""
    return await ledger.confirm(uid=uid, pod=f"ns/{uid}", node="n1", request=POD, owner="webhook",
                                verify_after_seconds=30, via="create")


def test_a_fence_counts_only_the_answers_of_its_own_counter_and_starts_over_when_renewed() -> None:
    fence = WriteFence()
    first = fence.key
    assert first.startswith(FENCE_PREFIX)
    fence.answer(first)
    fence.answer(first)
    fence.renew()
    fence.answer(first)  # a call made under the counter given up
    assert (fence.key != first, fence.answered) == (True, 0)


async def test_a_write_redis_lost_is_noticed_at_the_next_write_and_the_ledger_fails_closed_until_rebuilt(
    fake_redis: fakeredis.FakeAsyncRedis,
) -> None:
    webhook = Ledger(fake_redis, fenced=True)
    await webhook.rebuild(nodes=NODES, bound=[])
    assert await create_on_n1(webhook, "a") == Confirmed(node="n1", foreign=True)
    copy = await copy_of(fake_redis)  # younger than any stamp tick: taken right after a write
    assert await create_on_n1(webhook, "b") == Confirmed(node="n1", foreign=True)
    await restore(fake_redis, copy)
    assert await webhook.is_ready(), "the copy says it is ready"

    assert isinstance(await create_on_n1(webhook, "c"), LedgerNotReady), "b's room is not free"
    assert not await webhook.is_ready()
    assert (await webhook.stats())["stale_ledger"] == "1"

    # The sync rebuilds from the apiserver, which has a and b; the writer goes on, with no alarm after that.
    truth = [BoundPod(uid=uid, pod=f"ns/{uid}", node="n1", request=POD) for uid in ("a", "b")]
    await webhook.rebuild(nodes=NODES, bound=truth)
    assert isinstance(await create_on_n1(webhook, "c"), Conflict)
    assert await webhook.check_fence()
    assert (await webhook.stats())["stale_ledger"] == "1"


async def test_other_writers_after_the_restore_cannot_hide_the_loss(fake_redis: fakeredis.FakeAsyncRedis) -> None:
    webhook = Ledger(fake_redis, fenced=True)
    other_replica = Ledger(fake_redis, fenced=True)
    worker = Ledger(fake_redis)
    await webhook.rebuild(nodes=NODES, bound=[])
    copy = await copy_of(fake_redis)
    assert await create_on_n1(webhook, "a") == Confirmed(node="n1", foreign=True)
    await restore(fake_redis, copy)
    for i in range(5):
        result = await worker.reserve(uid=f"w{i}", pod=f"ns/w{i}", node="n2", request=POD, owner="w",
                                      ttl_seconds=30)
        assert isinstance(result, Reserved)
        assert isinstance(await other_replica.confirm(uid=f"o{i}", pod=f"ns/o{i}", node="n2", request=POD,
                                                      owner="webhook", verify_after_seconds=30, via="create"),
                          Confirmed)
    assert not await webhook.check_fence(), "the check alone notices, with no write to make"
    assert (await webhook.stats())["stale_ledger"] == "1"


async def test_a_writer_that_lost_nothing_never_raises_an_alarm(fake_redis: fakeredis.FakeAsyncRedis) -> None:
    webhook = Ledger(fake_redis, fenced=True)
    await webhook.rebuild(nodes=NODES, bound=[])
    for i in range(20):
        await webhook.confirm(uid=f"p{i}", pod=f"ns/p{i}", node="n2", request={"cpu": 100, "pods": 1},
                              owner="webhook", verify_after_seconds=30, via="create", dry_run=i % 2 == 0)
    assert await webhook.check_fence()
    assert "stale_ledger" not in await webhook.stats()
