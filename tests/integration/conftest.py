"""Fixtures for integration tests: one real redis-server per test session, and a flushed ledger per test."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

from dev.local.ports import free_port
from hoss.ledger.client import Ledger

_STARTUP_SECONDS = 10.0
_STOP_SECONDS = 10.0


def _wait_for_ping(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _STARTUP_SECONDS
    with redis.Redis.from_url(url, socket_connect_timeout=0.5) as client:
        while True:
            if process.poll() is not None:
                pytest.fail(f"redis-server exited with {process.returncode} at startup:\n{log.read_text()}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass  # not listening yet; polled until the deadline below
            if time.monotonic() > deadline:
                pytest.fail(f"redis-server did not answer PING within {_STARTUP_SECONDS}s:\n{log.read_text()}")
            time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real redis-server on a free loopback port, without persistence, stopped after the session."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not on PATH; `make deps` installs it (Debian package redis-server)")
    workdir = tmp_path_factory.mktemp("redis")
    log = workdir / "redis.log"
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    command = [
        binary,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(workdir),
        "--logfile", str(log),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_for_ping(url, process, log)
        yield url
    finally:
        _stop(process)


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
