"""Fixtures for integration tests: one real redis-server per test session; per test a flushed database with a
client, a ledger and the work queue on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio

from dev.local.ports import free_port
from hoss.ledger.client import Ledger
from hoss.queue import WorkQueue
from tests.integration.redis_server import start_redis_server, stop_redis_server


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def redis_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """URL of a real redis-server on a free loopback port, without persistence, stopped after the session."""
    workdir = tmp_path_factory.mktemp("redis")
    log = workdir / "redis.log"
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    arguments = [
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(workdir),
        "--logfile", str(log),
    ]  # fmt: skip
    process = await start_redis_server(arguments, url=url, log=log)
    try:
        yield url
    finally:
        await stop_redis_server(process)


@pytest.fixture
async def ledger(redis_url: str) -> AsyncIterator[Ledger]:
    """A ledger on an emptied database (not rebuilt: not ready until the test rebuilds it)."""
    async with redis.asyncio.Redis.from_url(redis_url) as client:
        await client.flushdb()
    async with Ledger.from_url(redis_url) as fresh:
        yield fresh


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A client on the session's redis-server (decode_responses), flushed before the test."""
    connection = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    await connection.flushdb()
    yield connection
    await connection.aclose()


@pytest.fixture
def queue(client: redis.asyncio.Redis) -> WorkQueue:
    """The dispatcher <-> worker protocol on `client`'s flushed database."""
    return WorkQueue(client)
