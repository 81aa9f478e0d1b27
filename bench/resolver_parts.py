"""The per-review cost of the resolver's parts: its HTTP server, and its hand-written Redis client against the
library it replaces.

``python -m bench.resolver_parts`` measures, on this machine:

1. HTTP: CPU of the server process per request for aiohttp's web server (the webhook's, `resolver.server`), in a
   process of its own answering a handler that reads the body and answers a small JSON, driven by one keep-alive
   client with 16 connections and an AdmissionReview-sized body (2 KiB); the whole webhook, TLS and judging
   included, against an older checkout's is bench/webhook_cpu.py's;
2. Redis: CPU of the client per script call (EVALSHA of one small script, 64 calls in flight), for the webhook's
   pipelined client (`hoss.ledger.redisclient`) and for redis-py's asyncio client, against a redis-server of its own.

Only CPU seconds are compared (from /proc for the server process, ``time.process_time`` for the client), so a busy
machine slows the run but changes the figures little.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from redis.asyncio import Redis

from bench.measure import cpu_seconds
from dev.local.ports import free_port
from hoss.ledger.redisclient import PipelinedRedis

BODY = b'{"kind":"AdmissionReview","request":{"uid":"' + b"x" * 2000 + b'"}}'
ANSWER = b'{"allowed":true}'
SCRIPT = "return redis.call('HINCRBY', KEYS[1], 'n', 1)"


def _serve_aiohttp(port: int) -> None:
    async def review(request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(body=ANSWER if body else b"", content_type="application/json")

    app = web.Application()
    app.router.add_post("/validate", review)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def _drive_http(port: int, requests: int) -> None:
    connector = aiohttp.TCPConnector(limit=16)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> None:
            async with session.post(f"http://127.0.0.1:{port}/validate", data=BODY) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"server answered {response.status}")

        for start in range(0, requests, 256):
            await asyncio.gather(*(one() for _ in range(min(256, requests - start))))


def http_cost(serve: Callable[[int], None], requests: int) -> float:
    """Server CPU microseconds per request."""
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(target=serve, args=(port,), daemon=True)
    process.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        asyncio.run(_drive_http(port, 500))  # warm up
        assert process.pid is not None
        before = cpu_seconds(process.pid) or 0.0
        asyncio.run(_drive_http(port, requests))
        after = cpu_seconds(process.pid) or 0.0
    finally:
        process.terminate()
        process.join(5)
    return (after - before) / requests * 1e6


async def _redis_calls(call: Callable[[], Awaitable[Any]], calls: int) -> float:
    for _ in range(200):  # warm up: connect, load the script
        await call()
    started = time.process_time()
    for begin in range(0, calls, 64):
        await asyncio.gather(*(call() for _ in range(min(64, calls - begin))))
    return (time.process_time() - started) / calls * 1e6


async def redis_costs(url: str, calls: int) -> dict[str, float]:
    """Client CPU microseconds per script call, per client."""
    pipelined = PipelinedRedis(url)
    script = pipelined.register_script(SCRIPT)
    ours = await _redis_calls(lambda: script(keys=["{hoss}:bench:parts"]), calls)
    await pipelined.aclose()
    redis_py = Redis.from_url(url, decode_responses=True)
    theirs_script = redis_py.register_script(SCRIPT)
    theirs = await _redis_calls(lambda: theirs_script(keys=["{hoss}:bench:parts"]), calls)
    await redis_py.aclose()
    return {"hoss.ledger.redisclient": ours, "redis-py asyncio": theirs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.resolver_parts", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="HTTP requests (default 20000)")
    parser.add_argument("--calls", type=int, default=20000, help="Redis script calls per client (default 20000)")
    args = parser.parse_args(argv)
    print(f"HTTP server CPU per request ({args.requests} requests, 2 KiB body, 16 keep-alive connections):")
    print(f"   {'aiohttp web':<24} {http_cost(_serve_aiohttp, args.requests):8.1f} us")
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        print("redis-server not found: Redis client not measured", file=sys.stderr)
        return 1
    port = free_port()
    server = subprocess.Popen([redis_server, "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    try:
        time.sleep(0.5)
        costs = asyncio.run(redis_costs(f"redis://127.0.0.1:{port}/0", args.calls))
    finally:
        server.terminate()
        server.wait(5)
    print(f"Redis client CPU per script call ({args.calls} EVALSHA calls, 64 in flight):")
    for name, cost in costs.items():
        print(f"   {name:<24} {cost:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
