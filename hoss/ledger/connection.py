"""The ledger's Redis connection: what the ledger needs of a Redis client, and the redis-py client it runs on.

`LedgerClient` is exactly what `hoss.ledger.client.Ledger` calls on its client, typed so that both of hoss's clients
satisfy it as they are: redis-py's ``redis.asyncio.Redis`` (the resolver's sync, the dispatcher, the workers, the
rescheduler) and the pipelined `hoss.ledger.redisclient.PipelinedRedis` (the webhook's reviews, the workers'
scripts and blocking reads). Parameters are positional-only where the two name them differently.

`ledger_redis` makes the redis-py client with connections that pack commands with hiredis's C packer: redis-py's
asyncio connections pack in Python, which for a ledger script call (a dozen arguments and more) costs several times
the rest of the call. The connection classes are declared once here, one per kind of URL.

Every Redis failure of a ledger call surfaces as `hoss.errors.LedgerUnavailable`, its cause kept (`redis_call`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.exceptions import RedisError
from redis.typing import KeyT, StreamIdT

from hoss.errors import LedgerUnavailable

T = TypeVar("T")


class LedgerScript(Protocol):
    """A registered Lua script: EVALSHA, loading the script first when Redis does not know it (NOSCRIPT)."""

    def __call__(self, keys: Sequence[str], args: Sequence[str | int]) -> Awaitable[Any]: ...


class ScriptClient(Protocol):
    """What running Lua scripts needs (the ledger's, and the work queue's): EVALSHA through registered scripts, and
    EVALSHA_RO with SCRIPT LOAD for the read-only ones (`hoss.ledger.scripts`)."""

    def register_script(self, script: str, /) -> LedgerScript: ...

    def evalsha_ro(self, sha: str, numkeys: int, /, *keys_and_args: str | int) -> Awaitable[Any]: ...

    def script_load(self, script: str, /) -> Awaitable[str]: ...


class StreamReader(Protocol):
    """What following the change stream needs: XREAD, whose reply holds each entry's fields as a dict (redis-py)
    or a flat list (`PipelinedRedis`); `hoss.ledger.replies.decode_change` reads both."""

    # redis-py's `streams` is a dict invariant in its key and id types, so the protocol names them as it does.
    def xread(self, streams: dict[KeyT, StreamIdT], count: int | None = None,
              block: int | None = None) -> Awaitable[Any]: ...


class LedgerPipeline(Protocol):
    """Commands queued to go in one round trip (in MULTI ... EXEC when the pipeline is a transaction)."""

    def get(self, name: str, /) -> object: ...

    def incr(self, name: str, /) -> object: ...

    def hmget(self, name: str, keys: Sequence[str], /) -> object: ...

    def hincrby(self, name: str, key: str, amount: int, /) -> object: ...

    def hset(self, name: str, key: str, value: str, /) -> object: ...

    def execute(self) -> Awaitable[list[Any]]: ...


class LedgerClient(ScriptClient, StreamReader, Protocol):
    """Everything `hoss.ledger.client.Ledger` calls on its Redis client. Replies are decoded text (or bytes, which
    the ledger's decoders read too)."""

    def get(self, name: str, /) -> Awaitable[str | bytes | None]: ...

    def exists(self, name: str, /) -> Awaitable[int]: ...

    def delete(self, name: str, /) -> Awaitable[int]: ...

    # Any keys: a mapping is invariant in its key type, and redis-py's are bytes | str where PipelinedRedis's are str.
    def hgetall(self, name: str, /) -> Awaitable[Mapping[Any, str | bytes]]: ...

    def xrange(self, name: str, /, *, count: int | None = None) -> Awaitable[Any]: ...

    def pipeline(self, transaction: bool = True) -> LedgerPipeline: ...

    def aclose(self) -> Awaitable[None]: ...


async def redis_call(awaitable: Awaitable[T]) -> T:
    """The result of a ledger call; a Redis failure (connection, timeout, error reply) raises LedgerUnavailable."""
    try:
        return await awaitable
    except RedisError as exc:
        raise LedgerUnavailable(f"ledger Redis failed: {exc}") from exc


class HiredisPacker:
    """Connection mixin: commands are packed by hiredis's C packer, into the bytes redis-py's packer makes."""

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if isinstance(first, str) and " " in first:
            args = (*first.split(), *args[1:])  # "SCRIPT LOAD" and the like are sent as separate words
        return [hiredis.pack_command(args)]


class HiredisConnection(HiredisPacker, Connection):
    """A TCP connection (``redis://``) whose commands hiredis packs."""


class HiredisSSLConnection(HiredisPacker, SSLConnection):
    """A TLS connection (``rediss://``) whose commands hiredis packs."""


class HiredisUnixConnection(HiredisPacker, UnixDomainSocketConnection):
    """A Unix socket connection (``unix://``) whose commands hiredis packs."""


HIREDIS_PACKED: Final[Mapping[type[AbstractConnection], type[AbstractConnection]]] = {
    Connection: HiredisConnection,
    SSLConnection: HiredisSSLConnection,
    UnixDomainSocketConnection: HiredisUnixConnection,
}
"""The hiredis-packing class of each connection class redis-py picks for a URL's scheme."""


def ledger_redis(url: str, **options: Any) -> Redis:
    """A redis-py client for the ledger at ``url`` (replies decoded) whose connections pack commands with hiredis.

    ``options`` are redis-py's connection options; the URL's own (its query string, user, password, database)
    win over them, as in ``Redis.from_url``. Closing the client closes its connection pool."""
    url_options: dict[str, Any] = dict(parse_url(url))
    # parse_url names the class for the scheme (TLS for rediss://), and from_url would let it override ours.
    scheme_class = url_options.pop("connection_class", Connection)
    pool = ConnectionPool(connection_class=HIREDIS_PACKED[scheme_class], decode_responses=True,
                          **{**options, **url_options})
    return Redis.from_pool(pool)
