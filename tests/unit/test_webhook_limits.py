"""What the webhook's port keeps open and reads at once (resolver/server.py): connections stuck in their handshake or
without a client certificate push out the oldest of their kind beyond their limit and never the apiserver's; the
apiserver's own beyond theirs are closed; an unauthenticated review is refused and its connection closed before its
body is read; the bodies read at once wait for their share; a request that is not HTTP gets 400 and one log line.

Each scenario runs on asyncio's own loop and on uvloop (what the resolver runs on): the port's TLS is started by
the server itself on each accepted connection (``loop.start_tls``), and the two loops implement it apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import uvloop

from deploy import pki
from hoss.ledger.client import Ledger
from resolver.app import build_server
from resolver.server import BodyBudget
from resolver.settings import ResolverSettings
from resolver.state import WebhookState
from resolver.tls import tls_context
from tests.unit.webhooks import NODE_ROOM, review
from tests.waiting import until

CLIENT_HELLO_START = bytes.fromhex("160301020001" "0001fc0303")
"""The first bytes of a TLS ClientHello: a handshake that has begun and stops there."""
Runner = Callable[[Coroutine[Any, Any, None]], None]
LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


@dataclass
class Port:
    port: int
    state: WebhookState
    server_ca: pki.KeyPair
    client_ca: pki.KeyPair
    directory: Path

    def tls(self, *, apiserver: bool) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.server_ca.cert))
        if apiserver:
            pair = pki.issue(self.client_ca, directory=self.directory, name="apiserver", common_name="kube-apiserver")
            context.load_cert_chain(pair.cert, pair.key)
        return context

    async def connect(self, *, apiserver: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls(apiserver=apiserver))

    async def handshaking(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection that begins its TLS handshake and stops."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(CLIENT_HELLO_START)
        await writer.drain()
        return reader, writer


@contextlib.asynccontextmanager
async def webhook_port(directory: Path, **settings: Any) -> AsyncIterator[Port]:
    """The webhook on a free port, reviews authenticated by a client CA of its own, the ledger on fakeredis."""
    server_ca = pki.ensure_ca(directory / "server-ca")
    serving = pki.issue(server_ca, directory=directory, name="serving", common_name="hoss-resolver",
                        ip_addresses=("127.0.0.1",), server=True)
    client_ca = pki.ensure_ca(directory / "client-ca", common_name="webhook-client-ca")
    config = ResolverSettings(tls_cert_file=str(serving.cert), tls_key_file=str(serving.key),
                              client_ca_file=str(client_ca.cert), **settings)
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    ledger = Ledger(redis)
    await ledger.rebuild(nodes=[("n1", NODE_ROOM, {})], bound=[])
    state = WebhookState(settings=config, ledger=ledger)
    server = build_server(state)
    port = await server.start("127.0.0.1", 0, ssl_context=tls_context(
        config.tls_cert_file, config.tls_key_file, config.client_ca_file))
    try:
        yield Port(port, state, server_ca, client_ca, directory)
    finally:
        await server.close()
        await redis.aclose()


def request(body: bytes, *, length: int | None = None) -> bytes:
    return (b"POST /validate-binding HTTP/1.1\r\nHost: hoss\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body) if length is None else length).encode() + b"\r\n\r\n" + body)


REVIEW = json.dumps(review(pod_name="small", uid="u-small", node="n1")).encode()


async def answer(reader: asyncio.StreamReader) -> int:
    """The status of the next answer on a connection (its body read too)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.lower().startswith(
        "content-length:")), 0)
    await reader.readexactly(length)
    return int(head.split(" ", 2)[1])


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the webhook closed the connection: its end, read (any answer before it dropped)."""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while await reader.read(65536):
            pass
    return True


async def review_answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(request(REVIEW))
    await writer.drain()
    return await answer(reader)


def scenario(run: Runner, body: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await body()

    run(main())


@LOOPS
def test_connections_stuck_in_their_handshake_push_out_the_oldest_and_never_the_apiservers(
    run: Runner, tmp_path: Path
) -> None:
    async def body() -> None:
        async with webhook_port(tmp_path, max_anonymous_connections=4) as port:
            reader, writer = await port.connect(apiserver=True)
            assert await review_answered(reader, writer) == 200
            stuck = [await port.handshaking() for _ in range(10)]
            for early_reader, _writer in stuck[:6]:
                assert await asyncio.wait_for(closed(early_reader), 5)
            assert await review_answered(reader, writer) == 200, "the apiserver's connection stays"
            late = await port.connect(apiserver=True)
            assert await review_answered(*late) == 200, "and a new one of the apiserver's is taken in"
            assert port.state.server is not None and port.state.server.closed_by_limits >= 6
            for connection in (*stuck, late, (reader, writer)):
                connection[1].close()

    scenario(run, body)


@LOOPS
def test_connections_without_a_client_certificate_beyond_the_limit_push_out_the_oldest(
    run: Runner, tmp_path: Path
) -> None:
    async def body() -> None:
        async with webhook_port(tmp_path, max_anonymous_connections=3) as port:
            readers = []
            for _ in range(5):
                reader, writer = await port.connect(apiserver=False)
                writer.write(b"POST /validate-binding HTTP/1.1\r\nHost: hoss\r\nX-Slow: ")  # headers that never end
                await writer.drain()
                readers.append((reader, writer))
            for reader, _writer in readers[:2]:
                assert await asyncio.wait_for(closed(reader), 5)
            newest, writer = readers[-1]
            writer.write(b"x\r\nContent-Length: 0\r\n\r\n")
            assert await answer(newest) == 401
            for _reader, writer in readers:
                writer.close()

    scenario(run, body)


@LOOPS
def test_the_apiservers_connections_beyond_their_limit_are_closed_after_the_handshake(
    run: Runner, tmp_path: Path
) -> None:
    async def body() -> None:
        async with webhook_port(tmp_path, max_connections=2) as port:
            kept = [await port.connect(apiserver=True) for _ in range(2)]
            extra_reader, extra_writer = await port.connect(apiserver=True)
            assert await asyncio.wait_for(closed(extra_reader), 5)
            for reader, writer in kept:
                assert await review_answered(reader, writer) == 200
                writer.close()
            extra_writer.close()

    scenario(run, body)


@LOOPS
def test_a_review_without_a_client_certificate_is_refused_before_its_body_is_read(
    run: Runner, tmp_path: Path
) -> None:
    async def body() -> None:
        async with webhook_port(tmp_path) as port:
            reader, writer = await port.connect(apiserver=False)
            writer.write(request(b"{", length=1 << 20))  # a body announced at 1 MiB, one byte of it sent
            await writer.drain()
            assert await answer(reader) == 401, "answered with 1 byte of the body sent"
            assert port.state.body_budget.taken == 0, "no share of the bodies' budget taken: the body is not read"
            writer.close()

    scenario(run, body)


@LOOPS
def test_a_content_length_that_is_no_number_gets_400_and_one_line_in_the_log(
    run: Runner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="resolver.server")

    async def body() -> None:
        async with webhook_port(tmp_path) as port:
            for length in ("²".encode(), b"12a", b"-1", b"1, 2"):
                reader, writer = await port.connect(apiserver=True)
                writer.write(b"POST /validate-binding HTTP/1.1\r\nHost: hoss\r\nContent-Length: " + length
                             + b"\r\n\r\n{}")
                await writer.drain()
                assert await answer(reader) == 400, length
                writer.close()

    scenario(run, body)
    assert not [r for r in caplog.records if r.exc_info], "no traceback for a client's malformed request"
    lines = [r.getMessage() for r in caplog.records if r.name == "resolver.server"]
    assert len(lines) == 4 and all("answered 400 to a malformed request" in line for line in lines), lines


@LOOPS
def test_bodies_wait_for_their_share_of_the_budget_and_are_judged_once_it_frees(run: Runner, tmp_path: Path) -> None:
    async def body() -> None:
        whole = REVIEW.ljust(1024)  # the smallest budget there is, all of it
        async with webhook_port(tmp_path, max_pending_body_bytes=len(whole), max_body_bytes=4096) as port:
            slow_reader, slow_writer = await port.connect(apiserver=True)
            slow_writer.write(request(whole[:10], length=len(whole)))  # takes the whole budget, sends slowly
            await slow_writer.drain()
            budget = port.state.body_budget
            await until(lambda: budget.taken == len(whole), timeout=5, what="the slow body to take the budget")
            quick = await port.connect(apiserver=True)
            waiting = asyncio.create_task(review_answered(*quick))
            await until(lambda: budget.waiting == 1, timeout=5, what="the next body to wait for the budget")
            slow_writer.write(whole[10:])
            assert await answer(slow_reader) == 200
            assert await waiting == 200
            assert budget.taken == 0
            slow_writer.close()
            quick[1].close()

    scenario(run, body)


async def test_a_body_budget_serves_in_turn_and_a_cancelled_waiter_passes_its_turn() -> None:
    budget = BodyBudget(100)
    assert await budget.take(60) == 60
    first = asyncio.create_task(budget.take(50))
    second = asyncio.create_task(budget.take(30))
    await until(lambda: budget.waiting == 2, timeout=5, what="both to wait")
    first.cancel()
    await until(second.done, timeout=5, what="the second to be served once the first gave up")
    assert second.result() == 30 and budget.taken == 90
    budget.give(60)
    budget.give(30)
    assert budget.taken == 0 and await budget.take(500) == 100, "a body above the limit takes all of it"
