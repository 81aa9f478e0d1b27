"""The HTTP/2 client against an independent HTTP/2 server (the h2 library, over TLS with ALPN): many requests on one
connection, the server's stream limit, flow control both ways, deadlines, refused and unprocessed streams, a lost
connection, and KubeREST choosing HTTP/2 or falling back to HTTP/1.1. The header decoding is checked against the
hpack library's encoder."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import hpack
import orjson
import pytest

from resolver import protobuf
from resolver.http2 import (
    Http2Client,
    NoHttp2,
    ProtocolError,
    alpn_context,
    encode_header,
    huffman_digits,
    response_status,
)
from resolver.kube import KubeError
from resolver.rest import KubeREST, http2_allowed
from tests.unit.h2_server import Drop, GoAway, H2Request, H2Server, Hang, Refuse, ok
from tests.unit.tls_apiserver import TLSApiserver


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[H2Server]:
    server = H2Server(tmp_path)
    await server.start()
    yield server
    await server.stop()


def _rest(server: H2Server, **kwargs: object) -> KubeREST:
    return KubeREST(server.url, tls=server.client_tls(), authorization="Bearer t0k3n", http2=True,
                    **kwargs)  # type: ignore[arg-type]


# --- header decoding ----------------------------------------------------------------------------------------------


def test_the_status_is_read_however_an_encoder_writes_it() -> None:
    for huffman in (False, True):
        encoder = hpack.Encoder()
        encoder.header_table_size = 0  # what this client announces: the encoder says so first, then never indexes
        for code in ("200", "201", "404", "409", "500", "503"):
            block = encoder.encode([(":status", code), ("content-type", "application/json"),
                                    ("audit-id", "8b1a9953c4611296a827abf8c47804d7")], huffman=huffman)
            assert response_status(block) == int(code), (code, huffman)
    # A literal name spelled out, raw or Huffman-coded, and a never-indexed field.
    encoder = hpack.Encoder()
    encoder.header_table_size = 0
    block = b"".join(encoder.encode([(":status", "409")], huffman=h) for h in (True,))
    assert response_status(block) == 409
    assert response_status(b"\x00" + encode_header_name(":status", huffman=False) + b"\x03429") == 429
    assert response_status(b"\x00" + encode_header_name(":status", huffman=True) + b"\x03429") == 429
    assert response_status(b"\x1e\x03418") == 418  # never indexed, name index 14
    assert response_status(encoder.encode([("cache-control", "no-cache")])) is None  # trailers


def encode_header_name(name: str, *, huffman: bool) -> bytes:
    value = hpack.huffman.HuffmanEncoder(hpack.huffman_constants.REQUEST_CODES,
                                         hpack.huffman_constants.REQUEST_CODES_LENGTH).encode(name.encode()) \
        if huffman else name.encode()
    return bytes((len(value) | (0x80 if huffman else 0),)) + value


def test_a_dynamic_table_the_client_refused_is_a_protocol_error() -> None:
    encoder = hpack.Encoder()  # table size left at 4,096: it indexes, and the second block refers back
    encoder.encode([(":status", "201"), ("audit-id", "x")])
    second = encoder.encode([(":status", "201"), ("audit-id", "x")])
    with pytest.raises(ProtocolError, match="dynamic table"):
        response_status(second)
    with pytest.raises(ProtocolError, match="table size 4096"):
        response_status(b"\x3f\xe1\x1f")  # a table size update to 4,096
    with pytest.raises(ProtocolError, match="three digits"):
        response_status(b"\x0e\x02ok")
    with pytest.raises(ProtocolError, match="cut short"):
        response_status(b"\x0e\x05ab")
    with pytest.raises(ProtocolError, match="three digits"):
        huffman_digits(b"\x18\x7f")  # 'a' (00011) is not a digit


def test_request_headers_decode_to_what_was_meant() -> None:
    fields = [(":method", "PATCH"), (":method", "GET"), (":scheme", "https"), (":authority", "10.0.0.1:6443"),
              (":path", "/api/v1/namespaces/a/pods/b/status?x=1"), ("accept", "application/json"),
              ("authorization", "Bearer " + "t" * 300), ("content-type", "application/json"),
              ("content-length", "12"), ("user-agent", "hoss"), ("x-other", "v")]
    block = b"".join(encode_header(name, value) for name, value in fields)
    assert [(str(name), str(value)) for name, value in hpack.Decoder().decode(block)] == fields


# --- the client against a server --------------------------------------------------------------------------------


async def test_many_requests_share_one_connection(server: H2Server) -> None:
    server.max_streams = 1000
    async with _rest(server, limit=300) as rest:
        assert rest.protocol == "h2"
        binding = rest.create_binding("default", "p-1", "uid-1", "node-1", lane="3")
        gets = [rest.get_pod("default", f"p-{i}") for i in range(250)]
        patches = [rest.patch_pod_status("default", f"p-{i}", {"status": {"phase": "Running"}}) for i in range(49)]
        answers = await asyncio.gather(binding, *gets, *patches)
    assert server.connections == 1 and server.max_in_flight > 100
    assert answers[1] == {"kind": "Pod", "metadata": {"name": "p-0"}}
    assert answers[-1] == {"status": {"phase": "Running"}}
    (bound,) = [r for r in server.seen if r.headers[":path"].endswith("/binding")]
    assert bound.headers[":method"] == "POST" and bound.headers["content-type"] == protobuf.PROTOBUF
    assert bound.headers["authorization"] == "Bearer t0k3n" and bound.headers["accept"] == "application/json"
    assert bound.headers[":authority"] == f"127.0.0.1:{server.port}" and bound.headers[":scheme"] == "https"
    assert bound.body == protobuf.binding("default", "p-1", "uid-1", "node-1", {"hoss.io/lane": "3"})
    assert bound.headers["content-length"] == str(len(bound.body))
    patch = next(r for r in server.seen if r.headers[":method"] == "PATCH")
    assert patch.headers[":path"] == "/api/v1/namespaces/default/pods/p-0/status"
    assert orjson.loads(patch.body) == {"status": {"phase": "Running"}}


async def test_the_servers_stream_limit_is_kept_and_more_connections_opened(server: H2Server) -> None:
    server.max_streams = 10
    started = asyncio.Event()

    async def slow(request: H2Request) -> tuple[int, bytes]:
        started.set()
        await asyncio.sleep(0.05)
        return await ok(request)

    server.respond = slow
    async with _rest(server, limit=25) as rest:
        await asyncio.gather(*(rest.get_pod("default", f"p-{i}") for i in range(100)))
    assert server.max_in_flight == 10  # per connection, never above its SETTINGS
    assert 3 <= server.connections <= 4  # 25 in flight at most: three connections' worth (a fourth may race)


async def test_large_bodies_both_ways_wait_for_the_windows(server: H2Server) -> None:
    big = {"items": ["x" * 1000] * 300}  # ~300 KB: above the server's 65,535-octet default windows

    async def echo_big(request: H2Request) -> tuple[int, bytes]:
        return 201, request.body + b" " * 200_000  # and a response well over one frame

    server.respond = echo_big
    async with _rest(server) as rest:
        answers = await asyncio.gather(*(rest.request("POST", "/api/v1/things", body=big) for _ in range(3)))
    assert all(answer == big for answer in answers)
    assert [len(r.body) for r in server.seen] == [len(orjson.dumps(big))] * 3


async def test_a_deadline_resets_the_stream_and_the_connection_goes_on(server: H2Server) -> None:
    async def hang_first(request: H2Request) -> tuple[int, bytes]:
        if request.headers[":path"].endswith("/slow"):
            raise Hang
        return await ok(request)

    server.respond = hang_first
    async with _rest(server) as rest:
        with pytest.raises(TimeoutError, match="no answer before the deadline"):
            await rest.request("GET", "/api/v1/namespaces/default/pods/slow", timeout=0.3)
        assert await rest.get_pod("default", "fast") == {"kind": "Pod", "metadata": {"name": "fast"}}
        for _ in range(50):
            if server.resets:
                break
            await asyncio.sleep(0.01)
    assert server.resets == [(1, 8)]  # stream 1 reset with CANCEL
    assert server.connections == 1


async def test_a_refused_stream_is_sent_again(server: H2Server) -> None:
    tries: list[int] = []

    async def refuse_once(request: H2Request) -> tuple[int, bytes]:
        tries.append(request.stream_id)
        if len(tries) == 1:
            raise Refuse
        return await ok(request)

    server.respond = refuse_once
    async with _rest(server) as rest:
        assert await rest.create_binding("default", "p", "u", "n") != {}
    assert len(tries) == 2 and len([r for r in server.seen if r.body]) == 2


async def test_streams_a_goaway_leaves_unprocessed_go_on_a_new_connection(server: H2Server) -> None:
    held = asyncio.Event()

    async def away(request: H2Request) -> tuple[int, bytes]:
        name = request.headers[":path"].rsplit("/", 1)[-1]
        if name == "first":
            await held.wait()
        elif name == "second" and request.connection == 1:
            held.set()  # "first" is answered ...
            await asyncio.sleep(0.05)
            raise GoAway(back=2)  # ... and the GOAWAY names it last: "second" was not processed
        return await ok(request)

    server.respond = away
    async with _rest(server) as rest:
        first = asyncio.ensure_future(rest.get_pod("default", "first"))
        await asyncio.sleep(0.1)
        second = await rest.get_pod("default", "second")
        assert await first == {"kind": "Pod", "metadata": {"name": "first"}}
    assert second == {"kind": "Pod", "metadata": {"name": "second"}}
    assert server.connections == 2


async def test_a_lost_connection_fails_its_requests_and_the_next_one_reconnects(server: H2Server) -> None:
    async def drop(request: H2Request) -> tuple[int, bytes]:
        if request.connection == 1:
            raise Drop
        return await ok(request)

    server.respond = drop
    async with _rest(server) as rest:
        with pytest.raises(ConnectionError):
            await rest.get_pod("default", "a")
        assert await rest.get_pod("default", "b") == {"kind": "Pod", "metadata": {"name": "b"}}
    assert server.connections == 2


async def test_pings_are_answered_and_errors_read(server: H2Server) -> None:
    async def conflict(request: H2Request) -> tuple[int, bytes]:
        return 409, orjson.dumps({"kind": "Status", "message": "pod p is already assigned to node n", "code": 409})

    server.respond = conflict
    async with _rest(server) as rest:
        with pytest.raises(KubeError, match="409: pod p is already assigned") as caught:
            await rest.create_binding("default", "p", "u", "n")
        assert caught.value.status == 409
        server.ping_all()
        for _ in range(50):
            if server.pings_answered:
                break
            await asyncio.sleep(0.01)
    assert server.pings_answered == 1


async def test_a_server_without_h2_gets_http1(tmp_path: Path) -> None:
    apiserver = TLSApiserver(tmp_path)  # aiohttp: no ALPN, HTTP/1.1 only
    await apiserver.start()
    try:
        async with await KubeREST.connect(str(apiserver.kubeconfig())) as rest:
            assert rest.protocol == "h2"  # offered until the server says otherwise
            assert await rest.get_pod("default", "p") == {"kind": "Pod", "metadata": {"name": "p"}}
            assert rest.protocol == "http/1.1"
        client = Http2Client(apiserver.url, tls=alpn_context(_client_tls(apiserver)))
        with pytest.raises(NoHttp2, match="not h2"):
            await client.request(client.block("GET", "/", []))
        await client.close()
    finally:
        await apiserver.stop()


def _client_tls(apiserver: TLSApiserver) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(apiserver.ca.cert))
    context.load_cert_chain(str(apiserver.client.cert), str(apiserver.client.key))
    return context


def test_disable_http2_is_honoured_like_client_go() -> None:
    assert http2_allowed({}) is True
    assert http2_allowed({"DISABLE_HTTP2": "true"}) is False
    assert KubeREST("http://127.0.0.1:1", http2=True).protocol == "http/1.1"  # no TLS: no h2c
