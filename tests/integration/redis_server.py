"""A redis-server of the integration tests' own: started as a child process, used once it answers PING, stopped
after (killed if it does not stop in time); and what it says of its clients (`blocked_in_redis`) and its clock
(`redis_clock_past`)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from asyncio.subprocess import DEVNULL, STDOUT, Process
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.waiting import until

STARTUP_SECONDS = 10.0
STOP_SECONDS = 10.0


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not on PATH; `make deps` installs it (Debian package redis-server)")
    return binary


async def start_redis_server(arguments: Sequence[str], *, url: str, log: Path) -> Process:
    """Start redis-server with ``arguments`` (its ``--logfile`` is ``log``) and return once it answers PING on
    ``url``; fail the test with its log when it exits or stays silent."""
    process = await asyncio.create_subprocess_exec(redis_server_binary(), *arguments, stdin=DEVNULL, stdout=DEVNULL,
                                                   stderr=STDOUT)

    async def answers() -> tuple[bool, str]:
        if process.returncode is not None:
            pytest.fail(f"redis-server exited with {process.returncode} at startup:\n"
                        f"{await asyncio.to_thread(log.read_text)}")
        try:
            async with redis.asyncio.Redis.from_url(url, socket_connect_timeout=0.5) as client:
                return bool(await client.ping()), "PONG"
        except RedisConnectionError as error:
            return False, str(error)

    try:
        await until(answers, timeout=STARTUP_SECONDS, what=f"redis-server to answer PING (its log: {log})")
    except BaseException:
        await stop_redis_server(process)
        raise
    return process


async def stop_redis_server(process: Process) -> None:
    with contextlib.suppress(ProcessLookupError):  # it may have exited already
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), STOP_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()


async def blocked_in_redis(client: redis.asyncio.Redis, count: int = 1) -> None:
    """Wait until Redis holds ``count`` clients blocked in a command (XREAD, BLPOP...), as INFO clients counts them:
    a blocking call made elsewhere has reached Redis and waits there."""
    async def blocked() -> tuple[bool, str]:
        now = int((await client.info("clients"))["blocked_clients"])
        return now == count, f"{now} blocked clients"

    await until(blocked, timeout=10, what=f"{count} client(s) to block in Redis")


async def redis_clock_past(url: str, ms: int) -> None:
    """Wait until the Redis server's clock (TIME, which the ledger's scripts stamp deadlines and admissions with)
    is past ``ms``."""
    async with redis.asyncio.Redis.from_url(url) as client:
        async def past() -> tuple[bool, str]:
            seconds, micros = await client.time()
            now = seconds * 1000 + micros // 1000
            return now > ms, f"the Redis clock at {now} ms"

        await until(past, timeout=10, what=f"the Redis clock to pass {ms} ms")
