"""An in-process HTTPS server speaking HTTP/2 only (the h2 library's state machine, an implementation independent of
`resolver.http2`), for the HTTP/2 client's tests: it records every request and answers as each test tells it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.settings import SettingCodes

from deploy.local import pki


@dataclass
class H2Request:
    connection: int  # which connection (1, 2, ...) it came on
    stream_id: int
    headers: dict[str, str]
    body: bytes = b""


class Refuse(Exception):
    """Answer the stream with RST_STREAM REFUSED_STREAM."""


class Hang(Exception):
    """Never answer."""


class GoAway(Exception):
    """Send GOAWAY with last_stream_id = this stream's id - ``back`` (and do not answer this one)."""

    def __init__(self, back: int) -> None:
        super().__init__(back)
        self.back = back


class Drop(Exception):
    """Close the TCP connection without a word."""


Answer = tuple[int, bytes]
Responder = Callable[[H2Request], Awaitable[Answer]]


async def ok(request: H2Request) -> Answer:
    """201 with the request body for a request with one (for a protobuf body, such as a Binding, a Success Status in
    JSON, as the apiserver answers a client that accepts JSON), else 200 and a small JSON object."""
    if request.headers.get("content-type") == "application/vnd.kubernetes.protobuf":
        return 201, b'{"kind":"Status","apiVersion":"v1","status":"Success","code":201}'
    if request.body:
        return 201, request.body
    return 200, b'{"kind":"Pod","metadata":{"name":"' + request.headers[":path"].rsplit("/", 1)[-1].encode() + b'"}}'


@dataclass
class H2Server:
    directory: Path
    respond: Responder = ok
    max_streams: int | None = None  # SETTINGS_MAX_CONCURRENT_STREAMS to announce
    seen: list[H2Request] = field(default_factory=list)
    resets: list[tuple[int, int]] = field(default_factory=list)  # (stream id, error code) the client sent
    pings_answered: int = 0
    connections: int = 0
    max_in_flight: int = 0  # on any one connection
    port: int = 0
    _server: asyncio.base_events.Server | None = None

    def __post_init__(self) -> None:
        self.ca = pki.ensure_ca(self.directory / "ca")
        self.serving = pki.issue(self.ca, directory=self.directory, name="h2server", common_name="kube-apiserver",
                                 ip_addresses=("127.0.0.1",), server=True)
        self.client = pki.issue(self.ca, directory=self.directory, name="h2client", common_name="hoss-worker")
        self.protocols: list[_Protocol] = []

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client_tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        context.load_cert_chain(str(self.client.cert), str(self.client.key))
        return context

    async def start(self) -> None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca.cert))
        tls.load_cert_chain(str(self.serving.cert), str(self.serving.key))
        tls.set_alpn_protocols(["h2"])
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Protocol(self), "127.0.0.1", 0, ssl=tls)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for protocol in self.protocols:
            if protocol.transport is not None:
                protocol.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def ping_all(self) -> None:
        for protocol in self.protocols:
            protocol.ping()


class _Protocol(asyncio.Protocol):
    def __init__(self, server: H2Server) -> None:
        self.server = server
        server.connections += 1
        self.number = server.connections
        server.protocols.append(self)
        self.h2 = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        self.transport: asyncio.Transport | None = None
        self.requests: dict[int, H2Request] = {}
        self.in_flight = 0
        self.pending: dict[int, bytes] = {}  # response bodies waiting for the client's window
        self.answering: set[asyncio.Future[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.h2.initiate_connection()
        if self.server.max_streams is not None:
            self.h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: self.server.max_streams})
        self.flush()

    def flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.h2.data_to_send())

    def ping(self) -> None:
        self.h2.ping(b"12345678")
        self.flush()

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, RequestReceived):
                headers = {str(k): str(v) for k, v in event.headers}
                self.requests[event.stream_id] = H2Request(self.number, event.stream_id, headers)
                self.in_flight += 1
                self.server.max_in_flight = max(self.server.max_in_flight, self.in_flight)
            elif isinstance(event, DataReceived):
                self.requests[event.stream_id].body += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, StreamEnded):
                request = self.requests[event.stream_id]
                self.server.seen.append(request)
                self.answering.add(task := asyncio.ensure_future(self.answer(request)))
                task.add_done_callback(self.answering.discard)
            elif isinstance(event, StreamReset):
                self.server.resets.append((event.stream_id, event.error_code))
                self.pending.pop(event.stream_id, None)
                self.in_flight -= 1
            elif isinstance(event, WindowUpdated):
                self.send_pending()
            elif isinstance(event, ConnectionTerminated):
                pass
            elif type(event).__name__ == "PingAckReceived":
                self.server.pings_answered += 1
        self.flush()

    async def answer(self, request: H2Request) -> None:
        try:
            status, body = await self.server.respond(request)
        except Refuse:
            self.h2.reset_stream(request.stream_id, ErrorCodes.REFUSED_STREAM)
            self.in_flight -= 1
        except Hang:
            return
        except GoAway as away:
            self.h2.close_connection(last_stream_id=request.stream_id - away.back)
        except Drop:
            assert self.transport is not None
            self.transport.abort()
            return
        else:
            if request.stream_id in self.h2.streams and not self.h2.streams[request.stream_id].closed:
                self.h2.send_headers(request.stream_id, [(":status", str(status)),
                                                         ("content-type", "application/json"),
                                                         ("audit-id", f"a-{request.stream_id}-{len(body)}")])
                self.pending[request.stream_id] = body
                self.send_pending()
                self.in_flight -= 1
        self.flush()

    def send_pending(self) -> None:
        for stream_id in list(self.pending):
            body = self.pending[stream_id]
            while body:
                size = min(len(body), self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
                if size <= 0:
                    break
                self.h2.send_data(stream_id, body[:size])
                body = body[size:]
            if body:
                self.pending[stream_id] = body
            else:
                del self.pending[stream_id]
                self.h2.end_stream(stream_id)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
