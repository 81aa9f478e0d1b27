"""The webhook's concurrent confirms share script calls (`hoss.ledger.confirm`), on a real redis-server through
the pipelined client the webhook uses: the answers are those of one call per confirm in the order they were made,
a caller that gave up before its call went is left out, and every caller of a failed call hears of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from dev.local.ports import free_port
from hoss.errors import LedgerUnavailable
from hoss.ledger.client import Ledger
from hoss.ledger.redisclient import PipelinedRedis
from hoss.ledger.results import Confirmed, Conflict, LedgerNotReady

NODE = {"cpu": 2000, "memory": 8 << 30, "pods": 110}
POD = {"cpu": 100, "pods": 1}


@pytest.fixture
async def webhook_ledger(client: redis.asyncio.Redis, redis_url: str) -> AsyncIterator[Ledger]:
    """A ledger as the webhook builds it for its reviews: on one pipelined connection."""
    async with Ledger(PipelinedRedis(redis_url), owns_client=True) as ledger:
        yield ledger


@pytest.fixture
async def ledger_of(client: redis.asyncio.Redis) -> Ledger:
    """The same ledger through redis-py, for what the test sets up and reads (as the sync does)."""
    ledger = Ledger(client)
    await ledger.rebuild(nodes=[("n1", NODE, {})], bound=[])
    return ledger


async def script_calls(client: redis.asyncio.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def foreign(ledger: Ledger, index: int) -> asyncio.Task[object]:
    """A foreign scheduler's binding of pod ``index`` to n1: fit-checked, no reservation."""
    return asyncio.create_task(ledger.confirm(uid=f"u{index}", pod=f"ns/p{index}", node="n1", request=POD,
                                              owner="apiserver", verify_after_seconds=30))


async def test_concurrent_confirms_share_calls_and_answer_as_one_call_each_in_order(
        webhook_ledger: Ledger, ledger_of: Ledger, client: redis.asyncio.Redis) -> None:
    await client.config_resetstat()
    # 40 bindings of 100m onto 2000m: room for 20.
    answers = await asyncio.gather(*(foreign(webhook_ledger, index) for index in range(40)))
    assert answers[:20] == [Confirmed(node="n1", foreign=True)] * 20, "the first 20 made fit, as in 20 calls"
    assert all(isinstance(answer, Conflict) and answer.resource == "cpu" for answer in answers[20:])
    assert (await ledger_of.node_usage(["n1"]))["n1"][1]["cpu"] == 2000
    calls = await script_calls(client)
    assert 1 <= calls <= 2, f"{calls} script calls for 40 concurrent confirms"

    # A confirm on its own goes at once, in a call of its own.
    await client.config_resetstat()
    assert isinstance(await foreign(webhook_ledger, 99), Conflict)
    assert await script_calls(client) == 1


async def test_a_confirm_whose_caller_gave_up_before_its_call_went_is_left_out(
        webhook_ledger: Ledger, ledger_of: Ledger, client: redis.asyncio.Redis) -> None:
    first = foreign(webhook_ledger, 1)
    await asyncio.sleep(0)  # the first is on its way
    given_up = foreign(webhook_ledger, 2)
    await asyncio.sleep(0)  # queued behind the first
    given_up.cancel()
    assert await first == Confirmed(node="n1", foreign=True)
    with pytest.raises(asyncio.CancelledError):
        await given_up
    assert await foreign(webhook_ledger, 3) == Confirmed(node="n1", foreign=True)
    # u1 and u3 are held; u2 never reached Redis.
    assert (await ledger_of.node_usage(["n1"]))["n1"][1]["cpu"] == 200
    assert await client.exists("{hoss}:pod:u2") == 0


async def test_a_ledger_not_ready_answers_every_gathered_confirm(webhook_ledger: Ledger) -> None:
    answers = await asyncio.gather(*(foreign(webhook_ledger, index) for index in range(5)))
    assert all(isinstance(answer, LedgerNotReady) for answer in answers)


async def test_every_caller_of_a_failed_call_hears_of_it() -> None:
    unreachable = PipelinedRedis(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.5)  # nothing listens
    async with Ledger(unreachable, owns_client=True) as ledger, asyncio.timeout(10):
        # (a safety deadline: a caller left waiting would hang here)
        answers = await asyncio.gather(*(foreign(ledger, index) for index in range(5)), return_exceptions=True)
    assert all(isinstance(answer, LedgerUnavailable) for answer in answers), answers
