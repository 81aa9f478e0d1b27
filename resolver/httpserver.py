"""A small HTTP/1.1 server for the resolver's endpoints, on asyncio's transports (TLS by the event loop).

Why not aiohttp: the webhook answers one small JSON request per binding in the cluster, and a web framework's
per-request machinery (request and response objects, routing, middlewares, a task per request, header
multidicts) cost more CPU than judging the binding. This server does only what the resolver's clients need:

- HTTP/1.0 and 1.1, keep-alive (1.1's default; ``Connection: close`` honoured), one request at a time per
  connection (pipelined requests wait in the buffer, reading pauses while a handler runs), ``Expect:
  100-continue``;
- bodies sent with ``Content-Length`` only: ``Transfer-Encoding`` is answered 411 (the apiserver, kubelet probes
  and Prometheus all send a length or no body);
- limits: the request line and headers together at most ``max_header_bytes`` (431), at most 100 headers, a body
  at most ``max_body_bytes`` (the handler's ``too_large`` answer, 400 by default: the rest of that body, up to
  ``MAX_DRAIN_BYTES``, is then read and dropped before the connection closes, so that a client still sending it
  reads the answer rather than a reset connection); anything it cannot parse is answered 400 and the connection
  closed; a connection idle (or stuck mid-request) for ``idle_timeout_seconds`` is closed.

Handlers get a `Request` and return a `Response`; an exception in a handler is logged and answered 500.

Client certificates: when the TLS context asks for one (``verify_mode`` CERT_OPTIONAL or CERT_REQUIRED), the event
loop's TLS layer verifies it during the handshake, and a connection whose certificate does not verify never
reaches this server. The names of a verified certificate (its subject's common name, then its DNS subject
alternative names) are read once per connection, when it is made, and every request on it carries them as
``Request.client_names`` (None when the client presented no certificate), so a handler's check costs nothing more
per request.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAX_HEADERS = 100
REASONS = {
    100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 411: "Length Required", 413: "Content Too Large", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 503: "Service Unavailable", 505: "HTTP Version Not Supported",
}


@dataclass(slots=True)
class Request:
    method: str
    path: str
    """The target's path, without the query."""
    query: str
    headers: dict[str, str]
    """Lower-cased names; a repeated header keeps its last value."""
    body: bytes
    client_names: tuple[str, ...] | None = None
    """The verified client certificate's common name and DNS names; None without a verified certificate."""


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _render(response: Response, *, close: bool) -> bytes:
    head = [
        f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Unknown')}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    head.extend(f"{name}: {value}" for name, value in response.headers.items())
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body


def client_names(peercert: object) -> tuple[str, ...] | None:
    """The names in a certificate as ``SSLObject.getpeercert()`` returns it (verified only): subject common name
    first, then DNS subject alternative names; None when there is none (no certificate, or not verified)."""
    if not isinstance(peercert, dict) or not peercert:
        return None
    names = [
        value
        for rdn in peercert.get("subject", ())
        for key, value in rdn
        if key == "commonName"
    ]
    names += [value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    return tuple(names)


MAX_DRAIN_BYTES = 16 * 2**20
"""The most of a refused (too large) body read and dropped after the answer; a longer one is cut off at once."""


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._busy = False
        self._closing = False
        self._continued = False
        self._paused = False
        self._draining = 0
        """Bytes of a refused body still to be read and dropped before the connection closes."""
        self._idle: asyncio.TimerHandle | None = None
        self._active_at = 0.0
        self._client_names: tuple[str, ...] | None = None

    # --- transport callbacks ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport (asyncio's, or uvloop's)
        self._server.connections.add(self)
        self._server.accepted += 1
        # Read once per connection: the handshake is over when a TLS transport reports the connection made.
        self._client_names = client_names(transport.get_extra_info("peercert"))
        loop = asyncio.get_running_loop()
        self._active_at = loop.time()
        self._idle = loop.call_at(self._active_at + self._server.idle_timeout_seconds, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        if self._idle is not None:
            self._idle.cancel()

    def data_received(self, data: bytes) -> None:
        if self._draining:
            self._active_at = asyncio.get_running_loop().time()
            self._draining -= len(data)
            if self._draining <= 0:
                self._close()
            return
        self._buffer += data
        if not self._busy:
            self._next_request()
        elif len(self._buffer) > self._server.max_buffer_bytes and self._transport is not None:
            # A client sending ahead while its request is handled: stop reading until the answer is out.
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close once the peer is done sending (a pending answer is lost either way)

    # --- requests ----------------------------------------------------------------------------------------

    def _check_idle(self) -> None:
        # One timer per connection, moved on lazily: re-arming a timer per request would cost a heap entry each.
        loop = asyncio.get_running_loop()
        due = self._active_at + self._server.idle_timeout_seconds
        if self._busy or due > loop.time():
            self._idle = loop.call_at(max(due, loop.time() + 1.0), self._check_idle)
        else:
            self._close()

    def _close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def _fail(self, status: int, message: str) -> None:
        self._write(Response(status, message.encode(), "text/plain; charset=utf-8"), close=True)

    def _write(self, response: Response, *, close: bool) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.write(_render(response, close=close))
        if close:
            self._closing = True
            self._transport.close()

    def _next_request(self) -> None:
        """Start the handler of the next complete request in the buffer, if there is one."""
        if self._closing or self._transport is None:
            return
        try:
            parsed = self._parse()
        except _BadRequest as error:
            self._fail(error.status, str(error))
            return
        if parsed is None:
            return
        request, keep_alive = parsed
        self._busy = True
        self._server.requests += 1
        task = asyncio.get_running_loop().create_task(self._server.dispatch(request))
        self._server.handling.add(task)
        task.add_done_callback(self._server.handling.discard)
        task.add_done_callback(lambda done: self._answered(done, keep_alive))

    def _answered(self, task: asyncio.Task[Response], keep_alive: bool) -> None:
        self._busy = False
        if task.cancelled():
            self._close()
            return
        self._write(task.result(), close=not keep_alive)
        if self._transport is not None and not self._closing:
            self._active_at = asyncio.get_running_loop().time()
            if self._paused:
                self._paused = False
                self._transport.resume_reading()
            if self._buffer:
                self._next_request()

    def _parse(self) -> tuple[Request, bool] | None:
        """One complete request off the buffer, with whether the connection stays open; None while incomplete."""
        server = self._server
        end = self._buffer.find(b"\r\n\r\n", 0, server.max_header_bytes + 4)
        if end < 0:
            if len(self._buffer) > server.max_header_bytes:
                raise _BadRequest(431, "request line and headers too large")
            return None
        try:
            head = bytes(self._buffer[:end]).decode("latin-1")
        except UnicodeDecodeError as error:  # pragma: no cover - latin-1 decodes every byte
            raise _BadRequest(400, "undecodable request head") from error
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise _BadRequest(400, f"malformed request line {lines[0][:100]!r}")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _BadRequest(505, f"unsupported version {version[:20]!r}")
        if not target.startswith("/"):
            raise _BadRequest(400, "request target must be a path")
        if len(lines) - 1 > MAX_HEADERS:
            raise _BadRequest(431, f"more than {MAX_HEADERS} headers")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name[0] in " \t" or name[-1] in " \t":
                raise _BadRequest(400, f"malformed header line {line[:100]!r}")
            lowered = name.lower()
            value = value.strip(" \t")
            if lowered in headers and lowered == "content-length" and headers[lowered] != value:
                raise _BadRequest(400, "conflicting Content-Length headers")
            headers[lowered] = value
        if "transfer-encoding" in headers:
            raise _BadRequest(411, "send the body with a Content-Length")
        raw_length = headers.get("content-length", "0")
        if not raw_length.isdigit() or len(raw_length) > 18:
            raise _BadRequest(400, f"invalid Content-Length {raw_length[:30]!r}")
        length = int(raw_length)
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        path, _, query = target.partition("?")
        if length > server.max_body_bytes:
            arrived = len(self._buffer) - (end + 4)
            self._buffer.clear()  # the head, and as much of the refused body as is here
            request = Request(method, path, query, headers, b"", self._client_names)
            answer = server.too_large(request)
            rest = length - arrived
            if 0 < rest <= MAX_DRAIN_BYTES and self._transport is not None:
                # Closing with the body still arriving would reset the connection, and a client busy sending
                # would read the reset instead of the answer: answer, then drop the rest of the body, then close.
                self._transport.write(_render(answer, close=True))
                self._closing = True
                self._draining = rest
            else:
                self._write(answer, close=True)
            return None
        if len(self._buffer) < end + 4 + length:
            if not self._continued and headers.get("expect", "").lower() == "100-continue":
                assert self._transport is not None
                self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self._continued = True
            return None
        self._continued = False
        body = bytes(self._buffer[end + 4: end + 4 + length])
        del self._buffer[: end + 4 + length]
        return Request(method, path, query, headers, body, self._client_names), keep_alive


def _too_large(request: Request) -> Response:
    return Response(400, b"request body too large")


class HttpServer:
    """Routes ``(method, path)`` to handlers; `start` listens, `close` stops (waiting briefly for handlers)."""

    def __init__(
        self,
        routes: dict[tuple[str, str], Handler],
        *,
        max_body_bytes: int,
        max_header_bytes: int = 16384,
        idle_timeout_seconds: float = 120.0,
        too_large: Callable[[Request], Response] = _too_large,
    ) -> None:
        self.routes = routes
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.idle_timeout_seconds = idle_timeout_seconds
        self.max_buffer_bytes = max_header_bytes + max_body_bytes + 4
        self.too_large = too_large
        self.connections: set[_Connection] = set()
        self.accepted = 0
        """connections accepted so far"""
        self.requests = 0
        """requests answered so far"""
        self.handling: set[asyncio.Task[Response]] = set()
        self._server: asyncio.base_events.Server | None = None

    async def dispatch(self, request: Request) -> Response:
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            known = any(path == request.path for _method, path in self.routes)
            return Response(405 if known else 404, b"method not allowed" if known else b"not found")
        try:
            return await handler(request)
        except Exception:
            log.exception("handler of %s %s failed", request.method, request.path)
            return Response(500, b"internal error")

    async def start(self, host: str | Sequence[str], port: int, *, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on ``host``:``port`` (several hosts: each of them; port 0: any free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, ssl=ssl_context)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self, *, grace_seconds: float = 5.0) -> None:
        """Stop listening and close every connection; a request being handled gets up to ``grace_seconds``."""
        if self._server is not None:
            self._server.close()
        if self.handling:
            await asyncio.wait(set(self.handling), timeout=grace_seconds)
        for connection in list(self.connections):
            connection._close()
        if self._server is not None:
            await self._server.wait_closed()
