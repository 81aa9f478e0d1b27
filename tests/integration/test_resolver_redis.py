"""The resolver's ledger clients on a real redis-server: commands packed by hiredis, every ledger operation the
resolver makes, a client without a socket timeout, and "SCRIPT LOAD" split as redis-py splits it."""

from __future__ import annotations

from redis.asyncio.connection import Connection

from resolver.ledger import Confirmed, Ledger, NeedRequest, Placement, Reserved
from resolver.webhook import HiredisPack, ledger_redis

ROOM = {"cpu": 4000, "memory": 8 << 30, "pods": 110}


def test_hiredis_packs_exactly_what_redis_py_packs() -> None:
    plain = Connection()
    fast = type("Fast", (HiredisPack, Connection), {})()
    for args in [
        ("EVALSHA", "f" * 40, 1, "{hoss}:ready", "{hoss}", "w", 60000, "ns/é", 2.5, b"raw"),
        ("SCRIPT LOAD", "return 1"),
        ("PING",),
    ]:
        assert b"".join(fast.pack_command(*args)) == b"".join(plain.pack_command(*args)), args


async def test_the_resolvers_ledger_operations_over_hiredis_packed_connections(redis_url: str) -> None:
    for options in ({}, {"socket_timeout": None}):
        ledger = Ledger(ledger_redis(redis_url, **options), owns_client=True)
        try:
            await ledger._redis.flushdb()
            await ledger.rebuild(nodes=[("n1", ROOM, {})], bound=[])
            reserved = await ledger.reserve(uid="a", pod="ns/a", node="n1", request={"cpu": 100, "pods": 1},
                                            owner="w", ttl_seconds=30)
            assert reserved == Reserved(node="n1")
            assert await ledger.confirm(uid="a", pod="ns/a", node="n1", request=None, owner="w",
                                        ttl_seconds=30) == Confirmed(node="n1", foreign=False)
            assert await ledger.confirm(uid="b", pod="ns/b", node="n1", request=None, owner="w",
                                        ttl_seconds=30) == NeedRequest()
            await ledger.bind_many([Placement(uid=u, pod=f"ns/{u}", node="n1", request={"cpu": 10, "pods": 1})
                                    for u in ("a", "c", "d")])
            assert await ledger.release_many(["c", "zz"]) == 1
            assert {e.uid: e.state for e in await ledger.entries()} == {"a": "bound", "d": "bound"}
            assert await ledger.is_ready()
        finally:
            await ledger.close()
