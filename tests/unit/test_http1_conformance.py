"""hoss.kube.http1 against h11, an independent HTTP/1.1 implementation, on both sides of the wire.

The server here reads every request through h11's server state machine, which raises on anything that is not a
well-formed HTTP/1.1 request (a missing Host, a body longer or shorter than its Content-Length, bytes after the
request, ...), and frames its answers with it as a conforming server would. Every answer hoss reads is read again
by an h11 client from the same bytes: hoss must see the status, the body and whether the connection may be kept that
h11 sees. test_http1.py pins the client's own byte-level behaviour (malformed answers, deadlines, the proxy); this
file checks it against the reference.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import h11
import orjson
import pytest

from hoss.kube import protobuf
from hoss.kube.events import scheduled_event, unschedulable_condition
from hoss.kube.http1 import Http1Pool
from hoss.kube.rest import STRATEGIC_MERGE_PATCH, KubeREST


@dataclass(frozen=True)
class Raw:
    """An answer the test writes byte for byte instead of h11 (h11 answers an HTTP/1.1 request only as HTTP/1.1);
    ``close``: the server closes the connection after it, else it reads the next request with a fresh h11 state."""

    data: bytes
    close: bool


Reply = Sequence[h11.Event] | Raw
"""The events of one answer, framed by h11 (a Response, its Data, an EndOfMessage), or a Raw one."""


@dataclass(frozen=True)
class Received:
    request: h11.Request
    body: bytes
    connection: int
    """Which of the server's connections (1, 2, ...) it came on."""

    def header(self, name: bytes) -> bytes | None:
        values = [value for key, value in self.request.headers if key == name]
        assert len(values) <= 1, f"{name!r} sent {len(values)} times"
        return values[0] if values else None


@dataclass
class H11Server:
    """An HTTP/1.1 server on 127.0.0.1 that speaks through h11; ``respond`` answers each request. ``sent`` holds
    each answer's bytes as written, beside ``received``; ``errors`` what h11 refused from a client."""

    respond: Callable[[Received], Reply]
    received: list[Received] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)
    errors: list[h11.ProtocolError] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await asyncio.sleep(0.01)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self._writers.append(writer)
        connection = h11.Connection(h11.SERVER)
        try:
            while True:
                event = await _next_event(connection, reader)
                if isinstance(event, h11.ConnectionClosed):
                    return
                assert isinstance(event, h11.Request), event  # h11's server gives nothing else between requests
                body = bytearray()
                while not isinstance(part := await _next_event(connection, reader), h11.EndOfMessage):
                    assert isinstance(part, h11.Data), part
                    body += part.data
                received = Received(event, bytes(body), number)
                self.received.append(received)
                reply = self.respond(received)
                if isinstance(reply, Raw):
                    data = reply.data
                else:
                    data = b"".join(connection.send(part) or b"" for part in reply)
                self.sent.append(data)
                writer.write(data)
                await writer.drain()
                if isinstance(reply, Raw):
                    if reply.close:
                        return
                    connection = h11.Connection(h11.SERVER)
                elif connection.our_state is h11.MUST_CLOSE:
                    return
                else:
                    connection.start_next_cycle()
        except h11.ProtocolError as error:
            self.errors.append(error)
        except ConnectionError:
            return  # the client went away: its pool was closed
        finally:
            writer.close()


async def _next_event(connection: h11.Connection, reader: asyncio.StreamReader) -> h11.Event:
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(65536))
        elif event is h11.PAUSED:
            raise h11.RemoteProtocolError("the client sent more before its request was answered")
        else:
            assert isinstance(event, h11.Event)
            return event


@dataclass(frozen=True)
class Read:
    status: int
    body: bytes
    reusable: bool


def h11_reads(received: Received, answer: bytes) -> Read:
    """How an h11 client that sent ``received``'s request (its method is what frames an answer) reads ``answer``;
    the connection ends after it only if h11 needs that end to finish the answer, which then cannot be reused."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method=received.request.method, target=received.request.target,
                            headers=[("Host", "hoss.test")]))
    client.send(h11.EndOfMessage())
    client.receive_data(answer)
    status, body, ended = 0, bytearray(), False
    while not isinstance(event := client.next_event(), h11.EndOfMessage):
        if event is h11.NEED_DATA:
            assert not ended, "h11 needs more than the answer and its connection's end"
            client.receive_data(b"")
            ended = True
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        else:
            assert isinstance(event, h11.InformationalResponse), event
    return Read(status, bytes(body), client.their_state is h11.DONE and not ended)


Serve = Callable[[Callable[[Received], Reply]], Awaitable[H11Server]]
"""Starts an H11Server answering with the function it is given."""


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Starts H11Servers; a test fails when h11 refused any request a client sent to one."""
    servers: list[H11Server] = []

    async def start(respond: Callable[[Received], Reply]) -> H11Server:
        server = H11Server(respond)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()
    assert [error for server in servers for error in server.errors] == [], "requests h11 found malformed"


@pytest.fixture
async def make_pool() -> AsyncIterator[Callable[[str], Http1Pool]]:
    pools: list[Http1Pool] = []

    def make(url: str) -> Http1Pool:
        pools.append(Http1Pool(url))
        return pools[-1]

    yield make
    for pool in pools:
        await pool.close()


async def call(pool: Http1Pool, method: str = "GET", target: str = "/x", body: bytes | None = None) -> Read:
    """One request through ``pool``; the answer as hoss read it, with whether its connection went back to the
    pool for the next request. For requests one after another: then the pool holds one connection at most, idle
    after a call only if the answer left it reusable."""
    head = pool.request_head(method, target, "", body)
    deadline = asyncio.get_running_loop().time() + 20  # an answer misread as longer than it is fails, not hangs
    status, answer = await pool.request(head, body, no_body=method == "HEAD", deadline=deadline)
    return Read(status, answer, bool(pool._idle))


def as_h11_reads(server: H11Server) -> list[Read]:
    return [h11_reads(received, answer) for received, answer in zip(server.received, server.sent, strict=True)]


def respond_with(*replies: Reply) -> Callable[[Received], Reply]:
    pending = iter(replies)
    return lambda received: next(pending)


def length_framed(body: bytes, status: int = 200, *headers: tuple[str, str]) -> list[h11.Event]:
    return [h11.Response(status_code=status, headers=[("Content-Length", str(len(body))), *headers]),
            h11.Data(data=body), h11.EndOfMessage()]


def chunked(pieces: Sequence[bytes], trailers: Sequence[tuple[str, str]] = ()) -> list[h11.Event]:
    """An answer without a length: h11 frames it in chunks, one a piece, for an HTTP/1.1 client."""
    return [h11.Response(status_code=200, headers=[]), *(h11.Data(data=piece) for piece in pieces),
            h11.EndOfMessage(headers=list(trailers))]


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


async def test_kube_rest_sends_every_hot_path_request_as_well_formed_http11(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    server = await serve(lambda received: length_framed(b'{"kind":"Status","status":"Success"}', 201))
    event = scheduled_event(namespace="team", name="web-0", uid="u-1", node="n7", component="hoss-worker-0")
    patch = unschedulable_condition("0/3 nodes are available: 3 Insufficient cpu.")
    async with KubeREST(server.url + "/prefix", authorization="Bearer t0k3n") as rest:
        await rest.create_binding("team", "web-0", "u-1", "n7", lane="1")
        await rest.create_event(event)
        await rest.patch_pod_status("team", "web 0", patch)
        await rest.get_pod("team", "we/ird?")
        await rest.request("GET", "/api/v1/pods", params={"fieldSelector": "spec.nodeName=n1,status.phase!=Failed"})
        await rest.request("DELETE", "/api/v1/namespaces/team/pods/web-0")

    sent = [(r.request.method, r.request.target, r.header(b"content-type"), r.body) for r in server.received]
    assert sent == [
        (b"POST", b"/prefix/api/v1/namespaces/team/pods/web-0/binding", protobuf.PROTOBUF.encode(),
         protobuf.binding("team", "web-0", "u-1", "n7", {"hoss.io/lane": "1"})),
        (b"POST", b"/prefix/api/v1/namespaces/team/events", protobuf.PROTOBUF.encode(), protobuf.event(event)),
        (b"PATCH", b"/prefix/api/v1/namespaces/team/pods/web%200/status", STRATEGIC_MERGE_PATCH.encode(),
         orjson.dumps(patch)),
        (b"GET", b"/prefix/api/v1/namespaces/team/pods/we%2Fird%3F", None, b""),
        (b"GET", b"/prefix/api/v1/pods?fieldSelector=spec.nodeName%3Dn1%2Cstatus.phase%21%3DFailed", None, b""),
        (b"DELETE", b"/prefix/api/v1/namespaces/team/pods/web-0", None, b""),
    ]
    for received in server.received:
        assert received.request.http_version == b"1.1"
        assert received.header(b"host") == f"127.0.0.1:{server.port}".encode()
        assert received.header(b"authorization") == b"Bearer t0k3n"
        assert received.header(b"accept") == b"application/json"
        has_body = received.request.method in (b"POST", b"PATCH")
        assert received.header(b"content-length") == (str(len(received.body)).encode() if has_body else None)
    assert server.connections == 1


async def test_length_framed_bodies_of_every_size_class_read_as_h11_reads_them_on_one_connection(
    serve: Serve, make_pool: Callable[[str], Http1Pool]
) -> None:
    # lengths around the one- and two-byte edges, past a socket read and past a megabyte
    sizes = [0, 1, 127, 128, 16_383, 16_384, 65_535, 65_537, 1_048_577]
    server = await serve(respond_with(*(length_framed(payload(size, seed=size)) for size in sizes)))
    pool = make_pool(server.url)
    reads = [await call(pool) for _ in sizes]
    assert reads == as_h11_reads(server)
    assert [read.body for read in reads] == [payload(size, seed=size) for size in sizes]
    assert server.connections == 1


async def test_chunked_bodies_with_trailers_read_as_h11_frames_them(
    serve: Serve, make_pool: Callable[[str], Http1Pool]
) -> None:
    replies = [
        chunked([b"hello", b" ", b"world"]),
        chunked([]),  # no chunk at all: only the last, empty one
        chunked([payload(size, seed=size) for size in (1, 15, 16, 255, 256, 4095, 4096, 70_000)]),
        chunked([b'{"kind":"Pod"}'], trailers=[("X-Checksum", "abc"), ("X-More", "1")]),
    ]
    server = await serve(respond_with(*replies))
    pool = make_pool(server.url)
    reads = [await call(pool) for _ in replies]
    assert all(b"Transfer-Encoding: chunked" in answer for answer in server.sent), "h11 chose chunks"
    assert reads == as_h11_reads(server)
    assert reads[0].body == b"hello world" and reads[1].body == b"" and reads[3].body == b'{"kind":"Pod"}'
    assert server.connections == 1


async def test_answers_without_a_body_leave_the_connection_ready_for_the_next_request(
    serve: Serve, make_pool: Callable[[str], Http1Pool]
) -> None:
    # 204 and 304 never have a body, whatever their headers say; nor has the answer to a HEAD: a client that read
    # the Content-Length as a body would wait for it, or read the next answer as its body.
    replies = [
        [h11.Response(status_code=204, headers=[], reason=b"No Content"), h11.EndOfMessage()],
        [h11.Response(status_code=304, headers=[("Content-Length", "5"), ("ETag", '"v1"')]), h11.EndOfMessage()],
        [h11.Response(status_code=200, headers=[("Content-Length", "42")]), h11.EndOfMessage()],
        length_framed(b"after"),
        [h11.Response(status_code=304, headers=[("Transfer-Encoding", "chunked")]), h11.EndOfMessage()],
        chunked([b"still in step"]),
    ]
    server = await serve(respond_with(*replies))
    pool = make_pool(server.url)
    methods = ["DELETE", "GET", "HEAD", "GET", "GET", "GET"]
    reads = [await call(pool, method) for method in methods]
    assert reads == as_h11_reads(server)
    assert [(read.status, read.body) for read in reads] == [
        (204, b""), (304, b""), (200, b""), (200, b"after"), (304, b""), (200, b"still in step")]
    assert server.connections == 1


async def test_connection_close_from_the_server_makes_each_answer_its_connections_last(
    serve: Serve, make_pool: Callable[[str], Http1Pool]
) -> None:
    replies = [
        length_framed(b"one", 200, ("Connection", "close")),
        [h11.Response(status_code=200, headers=[("Connection", "close")]), h11.Data(data=b"two"), h11.EndOfMessage()],
        length_framed(b"three"),
    ]
    server = await serve(respond_with(*replies))
    pool = make_pool(server.url)
    reads = [await call(pool) for _ in replies]
    assert reads == as_h11_reads(server)
    assert [(read.body, read.reusable) for read in reads] == [(b"one", False), (b"two", False), (b"three", True)]
    assert [received.connection for received in server.received] == [1, 2, 3], \
        "no request is written on a connection the server closes"


async def test_an_answer_without_length_is_read_to_the_connections_end_as_http10_frames_it(
    serve: Serve, make_pool: Callable[[str], Http1Pool]
) -> None:
    large = payload(300_000)
    replies: list[Reply] = [
        Raw(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"until\": \"the end\"}", close=True),
        Raw(b"HTTP/1.0 200 OK\r\n\r\n" + large, close=True),
        # HTTP/1.0 with a length and no keep-alive: the connection is not kept, though the server leaves it open
        Raw(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nfixed", close=False),
        Raw(b"HTTP/1.1 200 OK\r\nServer: old\r\n\r\nalso until the end", close=True),
        length_framed(b"fresh"),
    ]
    server = await serve(respond_with(*replies))
    pool = make_pool(server.url)
    reads = [await call(pool) for _ in replies]
    assert reads == as_h11_reads(server)
    assert [read.body for read in reads] == [b'{"until": "the end"}', large, b"fixed", b"also until the end",
                                             b"fresh"]
    assert [received.connection for received in server.received] == [1, 2, 3, 4, 5]


async def test_large_bodies_go_and_come_back_whole(
    serve: Serve, make_pool: Callable[[str], Http1Pool]
) -> None:
    def echo(received: Received) -> Reply:
        if received.request.target == b"/chunked":
            pieces = [received.body[at:at + 100_000] for at in range(0, len(received.body), 100_000)]
            return chunked(pieces)
        return length_framed(received.body)

    server = await serve(echo)
    pool = make_pool(server.url)
    sizes = {"/length": 5 * 1024 * 1024 + 3, "/chunked": 3 * 1024 * 1024 + 1}
    reads = [await call(pool, "POST", target, payload(size, seed=size)) for target, size in sizes.items()]
    assert [received.body for received in server.received] == [payload(size, seed=size) for size in sizes.values()]
    assert [received.header(b"content-length") for received in server.received] == [
        str(size).encode() for size in sizes.values()]
    assert reads == as_h11_reads(server)
    assert [read.body for read in reads] == [payload(size, seed=size) for size in sizes.values()]
    assert server.connections == 1
