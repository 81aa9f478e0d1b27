"""The resolver's ledger clients on a real redis-server: redis-py with commands packed by hiredis ("SCRIPT LOAD"
split as redis-py splits it), and the webhook's pipelined client: every ledger call the webhook makes, many at
once over one connection, a cancelled call, a lost connection and an error reply."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.connection import Connection

from hoss.errors import LedgerUnavailable
from hoss.ledger.arguments import Placement
from hoss.ledger.client import Ledger
from hoss.ledger.connection import HiredisConnection, ledger_redis, redis_call
from hoss.ledger.redisclient import PipelinedRedis
from hoss.ledger.results import Confirmed, Conflict, LedgerNotReady, NeedRequest, Reserved
from tests.integration.redis_server import blocked_in_redis

ROOM = {"cpu": 4000, "memory": 8 << 30, "pods": 110}


def test_hiredis_packs_exactly_what_redis_py_packs() -> None:
    plain = Connection()
    fast = HiredisConnection()
    for args in [
        ("EVALSHA", "f" * 40, 1, "{hoss}:ready", "{hoss}", "w", 60000, "ns/é", 2.5, b"raw"),
        ("SCRIPT LOAD", "return 1"),
        ("PING",),
    ]:
        assert b"".join(fast.pack_command(*args)) == b"".join(plain.pack_command(*args)), args


async def test_the_resolvers_ledger_operations_over_hiredis_packed_connections(redis_url: str) -> None:
    for options in ({}, {"socket_timeout": None}):
        client = ledger_redis(redis_url, **options)
        ledger = Ledger(client, owns_client=True)
        try:
            await client.flushdb()
            await ledger.rebuild(nodes=[("n1", ROOM, {})], bound=[])
            reserved = await ledger.reserve(uid="a", pod="ns/a", node="n1", request={"cpu": 100, "pods": 1},
                                            owner="w", ttl_seconds=30)
            assert reserved == Reserved(node="n1")
            assert await ledger.confirm(uid="a", pod="ns/a", node="n1", request=None, owner="w",
                                        verify_after_seconds=30) == Confirmed(node="n1", foreign=False)
            assert await ledger.confirm(uid="b", pod="ns/b", node="n1", request=None, owner="w",
                                        verify_after_seconds=30) == NeedRequest()
            await ledger.bind_many([Placement(uid=u, pod=f"ns/{u}", node="n1", request={"cpu": 10, "pods": 1})
                                    for u in ("a", "c", "d")])
            assert await ledger.release_many(["c", "zz"]) == 1
            assert {e.uid: e.state for e in await ledger.entries()} == {"a": "bound", "d": "bound"}
            assert await ledger.is_ready()
        finally:
            await ledger.close()


async def pipelined_ledger(redis_url: str) -> tuple[Ledger, PipelinedRedis]:
    admin = ledger_redis(redis_url)
    await admin.flushdb()
    await Ledger(admin).rebuild(nodes=[("n1", ROOM, {})], bound=[])
    await admin.script_flush()  # so the first call meets NOSCRIPT and loads the script
    await admin.aclose()
    client = PipelinedRedis(redis_url)
    return Ledger(client, owns_client=True), client


async def test_the_webhooks_ledger_calls_over_one_pipelined_connection(redis_url: str) -> None:
    ledger, _client = await pipelined_ledger(redis_url)
    try:
        assert await ledger.is_ready()
        assert await ledger.epoch()
        results = await asyncio.gather(*(
            ledger.confirm(uid=f"u{i}", pod=f"ns/u{i}", node="n1", request={"cpu": 10, "pods": 1}, owner="w",
                           verify_after_seconds=30)
            for i in range(200)
        ))
        assert results == [Confirmed(node="n1", foreign=True)] * 110 + [
            Conflict(node="n1", resource="pods", wanted=1, free=0)] * 90
        assert await ledger.confirm(uid="u0", pod="ns/u0", node="n1", request=None, owner="w",
                                    verify_after_seconds=30) == Confirmed(node="n1", foreign=False)
        await ledger.mark_not_ready()
        assert not await ledger.is_ready()
        assert isinstance(await ledger.confirm(uid="x", pod="ns/x", node="n1", request=None, owner="w",
                                               verify_after_seconds=30), LedgerNotReady)
    finally:
        await ledger.close()


async def test_a_cancelled_call_or_a_lost_connection_leaves_the_client_usable(redis_url: str) -> None:
    ledger, client = await pipelined_ledger(redis_url)
    admin = ledger_redis(redis_url)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.001):
                await client.execute("BLPOP", "nothing-here", "0.05")
        assert await client.execute("PING") == "PONG", "the late reply of the cancelled call is dropped"
        waiting = asyncio.create_task(redis_call(client.execute("BLPOP", "nothing-here", "2")))
        await blocked_in_redis(admin)
        await admin.client_kill_filter(_type="normal", skipme=True)
        with pytest.raises(LedgerUnavailable, match="connection to Redis lost"):
            await waiting
        assert await ledger.is_ready(), "the next call connects again"
        with pytest.raises(LedgerUnavailable, match="ERR"):
            await redis_call(client.execute("NOSUCHCOMMAND"))
    finally:
        await admin.aclose()
        await ledger.close()
