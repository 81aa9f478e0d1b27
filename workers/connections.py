"""A worker's Redis connections: one blocking pool for ordinary calls and pipelined connections for the scripts
and the blocking reads."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import BlockingConnectionPool, Redis

from hoss.ledger.redisclient import PipelinedRedis

REDIS_CONNECTIONS = 256
"""Most Redis connections a worker opens. Its bindings (up to ``max_binds_in_flight``) may each release a
reservation at once when the apiserver refuses them, beside the blocking reads of its stream and of the change
stream; redis-py's default pool (100) raised on the 101st instead of waiting."""
REDIS_WAIT_SECONDS = 20.0


def connect_redis(url: str) -> Redis:
    """The worker's Redis client: a pool that waits up to ``REDIS_WAIT_SECONDS`` for a free connection when all
    ``REDIS_CONNECTIONS`` are busy, instead of failing the call."""
    pool = BlockingConnectionPool.from_url(url, decode_responses=True, max_connections=REDIS_CONNECTIONS,
                                           timeout=REDIS_WAIT_SECONDS)
    return Redis.from_pool(pool)  # closing the client closes its pool


@dataclass
class Pipelined:
    """A worker's pipelined Redis connections (`hoss.ledger.redisclient`, a fraction of redis-py's CPU per call): one
    for the ledger's and the queue's scripts, and one of its own for each blocking read (the change stream, the
    work stream), which would hold up every other call on a shared connection. `connect_redis`'s pool keeps the
    rest (pipelined reads, heartbeats)."""

    scripts: PipelinedRedis
    changes: PipelinedRedis
    work: PipelinedRedis

    @classmethod
    def connect(cls, url: str) -> Pipelined:
        """Connections to ``url``, each opened at its first call."""
        return cls(PipelinedRedis(url), PipelinedRedis(url), PipelinedRedis(url))

    async def aclose(self) -> None:
        for client in (self.scripts, self.changes, self.work):
            await client.aclose()
