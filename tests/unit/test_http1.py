"""hoss.kube.http1 against raw sockets that answer byte for byte as a test tells them: every framing an HTTP/1.1
server may use, keep-alive and its end, broken and malformed responses, the connection limit, and a CONNECT proxy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from hoss.kube.http1 import Http1Pool, ProtocolError
from hoss.kube.rest import KubeREST
from tests.unit.tls_apiserver import TLSApiserver

Handler = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request (head and Content-Length body) or None at the connection's end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


@dataclass
class RawServer:
    """A TCP server on 127.0.0.1; ``handle`` answers each request and says whether to keep the connection."""

    handle: Handler
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    server: asyncio.base_events.Server | None = None
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while (request := await read_request(reader)) is not None:
                self.requests.append(request)
                if not await self.handle(request, reader, writer):
                    break
        finally:
            writer.close()

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await asyncio.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def in_turn(*replies: bytes, keep: Callable[[bytes], bool] = lambda reply: True) -> Handler:
    """Each request gets the next of ``replies``; the connection stays while ``keep(reply)``."""
    pending = iter(replies)

    async def handle(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        reply = next(pending)
        writer.write(reply)
        return keep(reply)
    return handle


def answer(raw: bytes, *, keep: bool = True) -> Handler:
    async def handle(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return keep
    return handle


@pytest.fixture
async def make_pool() -> AsyncIterator[Callable[..., Http1Pool]]:
    pools: list[Http1Pool] = []

    def make(url: str, **options: object) -> Http1Pool:
        pool = Http1Pool(url, **options)  # type: ignore[arg-type]
        pools.append(pool)
        return pool
    yield make
    for pool in pools:
        await pool.close()


async def get(pool: Http1Pool, target: str = "/x", body: bytes | None = None) -> tuple[int, bytes]:
    method = "GET" if body is None else "POST"
    return await pool.request(pool.request_head(method, target, "Accept: application/json\r\n", body), body)


async def test_the_request_is_one_well_formed_http11_message(make_pool: Callable[..., Http1Pool]) -> None:
    async with RawServer(answer(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}")) as server:
        pool = make_pool(server.url)
        assert await get(pool, "/api/v1/a%2Fb?x=1", b'{"k":1}') == (201, b"{}")
    assert server.requests == [
        f"POST /api/v1/a%2Fb?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAccept: application/json\r\n"
        f"Content-Length: 7\r\n\r\n{{\"k\":1}}".encode()
    ]


async def test_keep_alive_reuses_one_connection_and_connection_close_ends_it(
    make_pool: Callable[..., Http1Pool]
) -> None:
    async with RawServer(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na")) as server:
        pool = make_pool(server.url)
        for _ in range(4):
            assert await get(pool) == (200, b"a")
        assert server.connections == 1

    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nb"
    async with RawServer(answer(closing, keep=False)) as server:
        pool = make_pool(server.url)
        for _ in range(3):
            assert await get(pool) == (200, b"b")
        assert server.connections == 3, "a response saying Connection: close is the connection's last"


async def test_chunked_bodies_with_extensions_and_trailers_are_joined(make_pool: Callable[..., Http1Pool]) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: y\r\n\r\n")
    plain_end = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    replies = iter([chunked, plain_end, chunked])

    async def handle(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        raw = next(replies)
        for index in range(0, len(raw), 3):  # the body arrives in pieces that split every frame
            writer.write(raw[index:index + 3])
            await writer.drain()
            await asyncio.sleep(0)
        return True

    async with RawServer(handle) as server:
        pool = make_pool(server.url)
        assert await get(pool) == (200, b"hello world")
        assert await get(pool) == (200, b"abc")
        assert await get(pool) == (200, b"hello world")
        assert server.connections == 1


async def test_a_body_without_length_ends_with_the_connection(make_pool: Callable[..., Http1Pool]) -> None:
    async with RawServer(answer(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", keep=False)) as server:
        pool = make_pool(server.url)
        assert await get(pool) == (200, b"until the end")
        assert await get(pool) == (200, b"until the end")
        assert server.connections == 2


async def test_informational_responses_are_skipped_and_204_has_no_body(make_pool: Callable[..., Http1Pool]) -> None:
    handle = in_turn(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                     b"HTTP/1.1 204 No Content\r\n\r\n")
    async with RawServer(handle) as server:
        pool = make_pool(server.url)
        assert await get(pool) == (200, b"ok")
        assert await get(pool) == (204, b"")
        assert server.connections == 1


async def test_a_connection_closed_mid_response_raises_and_is_not_reused(make_pool: Callable[..., Http1Pool]) -> None:
    handle = in_turn(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
                     b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfine", keep=lambda reply: reply.endswith(b"fine"))
    async with RawServer(handle) as server:
        pool = make_pool(server.url)
        with pytest.raises(ConnectionError, match="closed the connection"):
            await get(pool)
        assert await get(pool) == (200, b"fine")
        assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_replaced(make_pool: Callable[..., Http1Pool]) -> None:
    async def handle(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk")
        await writer.drain()
        return False  # the server closes right after answering, without saying so

    async with RawServer(handle) as server:
        pool = make_pool(server.url)
        assert await get(pool) == (200, b"k")
        await asyncio.sleep(0.05)  # the close reaches the idle connection
        assert await get(pool) == (200, b"k")
        assert server.connections == 2


async def test_idle_connections_older_than_the_keepalive_are_not_used(make_pool: Callable[..., Http1Pool]) -> None:
    now = [0.0]
    async with RawServer(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk")) as server:
        pool = make_pool(server.url, keepalive_seconds=30.0, clock=lambda: now[0])
        await get(pool)
        now[0] = 29.0
        await get(pool)
        assert server.connections == 1
        now[0] = 60.0
        await get(pool)
        assert server.connections == 2


@pytest.mark.parametrize("reply", [b"SPDY/3 200 OK\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n",
                                   b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
                                   b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
async def test_a_malformed_response_raises_protocol_error(make_pool: Callable[..., Http1Pool], reply: bytes) -> None:
    async with RawServer(answer(reply)) as server:
        pool = make_pool(server.url)
        with pytest.raises(ProtocolError):
            await get(pool)


async def test_no_more_than_limit_connections_and_callers_over_it_wait(make_pool: Callable[..., Http1Pool]) -> None:
    in_flight = [0, 0]

    async def slow(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await asyncio.sleep(0.02)
        in_flight[0] -= 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk")
        return True

    async with RawServer(slow) as server:
        pool = make_pool(server.url, limit=3)
        results = await asyncio.gather(*(get(pool) for _ in range(12)))
        assert results == [(200, b"k")] * 12
        assert server.connections == 3
        assert in_flight[1] == 3


OK_K = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk"


def first_held(release: asyncio.Event, first: bytes = OK_K) -> Handler:
    """Answers every request with 200 ``k``; the first only once ``release`` is set, and with ``first``."""
    answered = 0

    async def handle(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        nonlocal answered
        answered += 1
        if answered == 1:
            await release.wait()
            writer.write(first)
        else:
            writer.write(OK_K)
        return True
    return handle


async def test_a_cancelled_request_closes_its_connection(make_pool: Callable[..., Http1Pool]) -> None:
    release = asyncio.Event()
    async with RawServer(first_held(release)) as server:
        pool = make_pool(server.url)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await get(pool)
        release.set()
        assert await get(pool) == (200, b"k"), "the late answer to the first request never reaches the second"
        assert server.connections == 2


def _deadline(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_a_deadline_fails_an_unanswered_request_and_its_late_answer_reaches_no_one(
    make_pool: Callable[..., Http1Pool]
) -> None:
    release = asyncio.Event()
    async with RawServer(first_held(release, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")) as server:
        pool = make_pool(server.url, limit=1)
        head = pool.request_head("GET", "/x", "", None)
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError, match="no answer before the deadline"):
            async with asyncio.timeout(5):  # a guard: a deadline not kept fails here, without that message
                await pool.request(head, deadline=_deadline(0.1))
        assert 0.09 <= asyncio.get_running_loop().time() - started < 1.0
        release.set()
        # the slot came back, and the next request gets a connection of its own and its own answer
        assert await pool.request(head, deadline=_deadline(5)) == (200, b"k")
        assert server.connections == 2


async def test_a_deadline_bounds_the_wait_for_a_connection_slot(make_pool: Callable[..., Http1Pool]) -> None:
    release = asyncio.Event()

    async def slow(request: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await release.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk")
        return True

    async with RawServer(slow) as server:
        pool = make_pool(server.url, limit=1)
        head = pool.request_head("GET", "/x", "", None)
        holder = asyncio.create_task(pool.request(head))
        await asyncio.sleep(0.05)
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5):  # a guard: a wait the deadline does not end takes 5 s
                await pool.request(head, deadline=_deadline(0.1))
        assert asyncio.get_running_loop().time() - started < 1.0
        assert len(server.requests) == 1, "the timed-out request never reached the server"
        release.set()
        assert await holder == (200, b"k")
        # the timed-out waiter took no slot with it: the one slot serves the next request on the same connection
        assert await pool.request(head, deadline=_deadline(5)) == (200, b"k")
        assert server.connections == 1


async def test_an_answer_in_time_keeps_its_connection_after_the_deadline_passes(
    make_pool: Callable[..., Http1Pool]
) -> None:
    async with RawServer(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk")) as server:
        pool = make_pool(server.url)
        head = pool.request_head("GET", "/x", "", None)
        assert await pool.request(head, deadline=_deadline(0.05)) == (200, b"k")
        await asyncio.sleep(0.1)  # past the first request's deadline: its timer must not touch the idle connection
        assert await pool.request(head, deadline=_deadline(5)) == (200, b"k")
        assert server.connections == 1


async def test_requests_tunnel_through_a_connect_proxy_with_its_credentials(
    make_pool: Callable[..., Http1Pool]
) -> None:
    tunnels: list[bytes] = []
    async with RawServer(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nvi")) as server:
        proxy_server = await asyncio.start_server(connect_proxy(tunnels), "127.0.0.1", 0)
        proxy_port = proxy_server.sockets[0].getsockname()[1]
        try:
            pool = make_pool(server.url, proxy=f"http://me:s%40cret@127.0.0.1:{proxy_port}")
            assert await get(pool) == (200, b"vi")
            assert await get(pool) == (200, b"vi")
        finally:
            proxy_server.close()
            await close_tunnels()
    [tunnel] = tunnels
    assert tunnel.startswith(f"CONNECT 127.0.0.1:{server.port} HTTP/1.1\r\n".encode())
    assert b"Proxy-Authorization: Basic bWU6c0BjcmV0\r\n" in tunnel  # me:s@cret


async def test_a_proxy_refusing_the_tunnel_is_a_connection_error(make_pool: Callable[..., Http1Pool]) -> None:
    async with RawServer(answer(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")) as proxy:
        pool = make_pool("http://127.0.0.1:1", proxy=proxy.url)
        with pytest.raises(ConnectionError, match=r"refused CONNECT 127\.0\.0\.1:1: HTTP 407"):
            await get(pool)


def connect_proxy(tunnels: list[bytes]) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """An HTTP CONNECT proxy's connection handler; it records each CONNECT request's head in ``tunnels``."""
    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        tunnels.append(head)
        host, port = head.split(b" ")[1].decode().rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        OPEN.extend((writer, upstream_writer))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    sink.write(data)
            sink.close()
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
    return proxy


OPEN: list[asyncio.StreamWriter] = []


async def close_tunnels() -> None:
    for writer in OPEN:
        writer.close()
    OPEN.clear()
    await asyncio.sleep(0.01)


async def test_kube_rest_reaches_a_tls_apiserver_through_the_proxy_with_mutual_tls(tmp_path: Path) -> None:
    apiserver = TLSApiserver(tmp_path)
    await apiserver.start()
    tunnels: list[bytes] = []
    proxy_server = await asyncio.start_server(connect_proxy(tunnels), "127.0.0.1", 0)
    proxy_port = proxy_server.sockets[0].getsockname()[1]
    try:
        configuration = client.Configuration()
        await config.load_kube_config(config_file=str(apiserver.kubeconfig()), client_configuration=configuration,
                                      persist_config=False)
        configuration.proxy = f"http://127.0.0.1:{proxy_port}"
        async with KubeREST.from_configuration(configuration) as rest:
            await rest.create_binding("team", "web-0", "uid-1", "n7")
            assert (await rest.get_pod("team", "web-0"))["kind"] == "Pod"
    finally:
        proxy_server.close()
        await close_tunnels()
        await apiserver.stop()
    assert len(tunnels) == 1, "one tunnel, kept alive"
    assert [seen.client_cn for seen in apiserver.seen] == ["hoss-worker", "hoss-worker"], "TLS ends at the apiserver"


@pytest.mark.parametrize(("url", "options", "message"), [
    ("ftp://host", {}, "server URL 'ftp://host'"),
    ("https://host", {"limit": 0}, "connection limit 0"),
    ("https://host", {"proxy": "socks5://p:1080"}, "proxy 'socks5://p:1080'"),
])
def test_bad_settings_name_the_value(url: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Http1Pool(url, **options)  # type: ignore[arg-type]


def test_the_host_header_brackets_ipv6_and_omits_default_ports() -> None:
    assert Http1Pool("https://[fd00::1]:443").authority == "[fd00::1]"
    assert Http1Pool("https://[fd00::1]:6443").authority == "[fd00::1]:6443"
    assert Http1Pool("http://kube:80").authority == "kube"
