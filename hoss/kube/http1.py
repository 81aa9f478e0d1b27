"""A small HTTP/1.1 client for the apiserver hot path: a pool of keep-alive connections, one request at a time on
each, request and response bodies as bytes.

Why not aiohttp: a worker posts a Binding and an Event for every pod it places, and aiohttp's general machinery
(URL objects, header multidicts, payload registry, tracing, per-request timers) cost about as much Python time per
call as everything else a worker does for the pod. Here a request is one pre-formatted bytes write on an
asyncio Protocol, and the response parser reads only what the apiserver sends: a status line, headers, and a body
framed by Content-Length, chunked transfer coding, or the connection's end.

Errors: a connection that fails, closes before its response is complete, or sends something that is not HTTP/1.x
raises ConnectionError (an OSError); a TLS failure raises ssl.SSLError (also an OSError); a missed deadline (the
request's ``deadline``, or the caller's own timeout) raises TimeoutError and closes the connection in use, which is
never reused with a response outstanding.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

MAX_HEAD_BYTES = 64 * 1024
KEEPALIVE_SECONDS = 60.0

_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _UNTIL_CLOSE = range(6)


class ProtocolError(ConnectionError):
    """The peer sent something that is not a well-formed HTTP/1.x response."""


def _authority(host: str, port: int, default_port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default_port else f"{shown}:{port}"


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``exchange`` sends a request and waits for its whole response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._no_body = False
        self._phase = _HEAD
        self._status = 0
        self._keep = True
        self._length = 0
        self._body = bytearray()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self.close()
            return
        self._buffer += data
        try:
            self._advance()
        except (ProtocolError, ValueError) as error:
            self._fail(error if isinstance(error, ProtocolError) else ProtocolError(f"malformed response: {error}"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._phase == _UNTIL_CLOSE:
            self._body += self._buffer
            waiter.set_result((self._status, bytes(self._body), False))
            return
        reason = f": {exc}" if exc is not None else ""
        waiter.set_exception(ConnectionError(f"the server closed the connection before its response ended{reason}"))

    # requests

    def exchange(self, request: bytes, *, no_body: bool = False) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Write ``request``; the future gives (status, body, whether the connection may be reused)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise ConnectionError("the connection is closed")
        self._waiter = asyncio.get_running_loop().create_future()
        self._no_body = no_body
        self._phase = _HEAD
        self._body = bytearray()
        self.transport.write(request)
        return self._waiter

    def expire(self, waiter: asyncio.Future[tuple[int, bytes, bool]]) -> None:
        """The deadline of the exchange whose future is ``waiter`` passed: fail it and close the connection (its
        answer may still come, and must not be read as the next request's). Nothing when it was answered."""
        if waiter is self._waiter and not waiter.done():
            self._fail(TimeoutError("no answer before the deadline"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("the connection was closed"))

    def _fail(self, error: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self.close()

    def _finish(self) -> None:
        keep = self._keep and not self._buffer  # leftover bytes: framing lost, do not reuse
        assert self._waiter is not None
        self._waiter.set_result((self._status, bytes(self._body), keep))
        self._phase = _HEAD

    # the response parser

    def _advance(self) -> None:
        buffer = self._buffer
        while True:
            phase = self._phase
            if phase == _HEAD:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise ProtocolError(f"response head longer than {MAX_HEAD_BYTES} bytes")
                    return
                head = bytes(buffer[:end])
                del buffer[:end + 4]
                self._head(head)
                if self._phase == _HEAD:  # an informational (1xx) response: the real one follows
                    continue
                if self._phase == -1:
                    self._finish()
                    return
            elif phase == _BODY:
                if len(buffer) < self._length:
                    return
                self._body += buffer[:self._length]
                del buffer[:self._length]
                self._finish()
                return
            elif phase == _CHUNK_SIZE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise ProtocolError("chunk size line too long")
                    return
                size = int(bytes(buffer[:end]).split(b";", 1)[0].strip(), 16)
                del buffer[:end + 2]
                if size < 0:
                    raise ProtocolError("negative chunk size")
                self._length = size
                self._phase = _CHUNK_DATA if size else _TRAILER
            elif phase == _CHUNK_DATA:
                if len(buffer) < self._length + 2:
                    return
                if buffer[self._length:self._length + 2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                self._body += buffer[:self._length]
                del buffer[:self._length + 2]
                self._phase = _CHUNK_SIZE
            elif phase == _TRAILER:
                if buffer[:2] == b"\r\n":
                    del buffer[:2]
                    self._finish()
                    return
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise ProtocolError("trailer too long")
                    return
                del buffer[:end + 4]
                self._finish()
                return
            else:  # _UNTIL_CLOSE: connection_lost completes the body
                return

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        version, status = parts[0], int(parts[1])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise ProtocolError(f"malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            return  # stay in _HEAD
        self._status = status
        connection = headers.get(b"connection", b"").lower()
        self._keep = connection != b"close" if version == b"HTTP/1.1" else connection == b"keep-alive"
        if self._no_body or status in (204, 304):
            self._phase = -1
        elif b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            self._phase = _CHUNK_SIZE
        elif b"content-length" in headers:
            self._length = int(headers[b"content-length"])
            if self._length < 0:
                raise ProtocolError("negative Content-Length")
            self._phase = _BODY if self._length else -1
        else:
            self._keep = False
            self._phase = _UNTIL_CLOSE


class Http1Pool:
    """Keep-alive HTTP/1.1 connections to one server (``url``: scheme, host and port), at most ``limit`` at once;
    a caller over the limit waits for a free one. ``proxy`` (``http://[user:password@]host:port``) tunnels every
    connection through an HTTP proxy with CONNECT, as HTTPS_PROXY asks."""

    def __init__(
        self, url: str, *, tls: ssl.SSLContext | None = None, server_hostname: str | None = None, limit: int = 100,
        keepalive_seconds: float = KEEPALIVE_SECONDS, proxy: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server URL {url!r}: expected http(s)://host[:port]")
        if limit < 1:
            raise ValueError(f"connection limit {limit}: must be at least 1")
        default_port = 443 if parts.scheme == "https" else 80
        self.host = parts.hostname
        self.port = parts.port or default_port
        self.authority = _authority(self.host, self.port, default_port)
        self._tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        self._server_hostname = server_hostname
        self._keepalive = keepalive_seconds
        self._clock = clock
        self._proxy = _proxy_target(proxy) if proxy else None
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def request(
        self, head: bytes, body: bytes | None = None, *, no_body: bool = False, deadline: float | None = None
    ) -> tuple[int, bytes]:
        """Send ``head`` (request line and headers, ending in a blank line) and ``body``; (status, body).

        The head must carry Host and, with a body, Content-Length (`request_head` writes both). ``deadline`` (the
        event loop's clock) raises TimeoutError when it passes, whether the request is waiting for a connection
        or for its answer; without one, the caller bounds the call."""
        if self._closed:
            raise ConnectionError("the HTTP pool is closed")
        payload = head if body is None else head + body
        slots = self._slots
        if slots.locked():
            async with asyncio.timeout_at(deadline):  # None: no deadline
                await slots.acquire()
        else:
            await slots.acquire()
        try:
            connection = self._take_idle()
            if connection is None:
                async with asyncio.timeout_at(deadline):
                    connection = await self._open()
            try:
                answered = connection.exchange(payload, no_body=no_body)
                # One timer on the loop instead of a timeout context per call: the hot path (a free slot, an idle
                # connection) pays for nothing else.
                timer = None if deadline is None else \
                    asyncio.get_running_loop().call_at(deadline, connection.expire, answered)
                try:
                    status, answer, keep = await answered
                finally:
                    if timer is not None:
                        timer.cancel()
            except BaseException:
                self._discard(connection)
                raise
            if keep and not connection.closed and not self._closed:
                connection.idle_since = self._clock()
                self._idle.append(connection)
            else:
                self._discard(connection)
            return status, answer
        finally:
            slots.release()

    def request_head(self, method: str, target: str, headers: str, body: bytes | None) -> bytes:
        """The head of one request: ``target`` is the encoded path and query, ``headers`` CRLF-ended lines."""
        length = f"Content-Length: {len(body)}\r\n" if body is not None else ""
        return f"{method} {target} HTTP/1.1\r\nHost: {self.authority}\r\n{headers}{length}\r\n".encode("latin-1")

    def _take_idle(self) -> _Connection | None:
        now = self._clock()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < self._keepalive:
                return connection
            self._discard(connection)
        return None

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self._all.discard(connection)

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        server_hostname = (self._server_hostname or self.host) if self._tls is not None else None
        if self._proxy is None:
            _, connection = await loop.create_connection(
                _Connection, self.host, self.port, ssl=self._tls, server_hostname=server_hostname)
            self._all.add(connection)
            return connection
        proxy_host, proxy_port, _ = self._proxy
        _, connection = await loop.create_connection(_Connection, proxy_host, proxy_port)
        self._all.add(connection)
        try:
            await self._tunnel(connection)
            if self._tls is not None:
                assert connection.transport is not None
                connection.transport = await loop.start_tls(
                    connection.transport, connection, self._tls, server_hostname=server_hostname)
        except BaseException:
            self._discard(connection)
            raise
        return connection

    async def _tunnel(self, connection: _Connection) -> None:
        assert self._proxy is not None
        proxy_host, proxy_port, authorization = self._proxy
        target = _authority(self.host, self.port, -1)
        extra = f"Proxy-Authorization: {authorization}\r\n" if authorization else ""
        head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n".encode("latin-1")
        status, _, keep = await connection.exchange(head, no_body=True)
        if not 200 <= status <= 299 or not keep:
            raise ConnectionError(f"proxy {proxy_host}:{proxy_port} refused CONNECT {target}: HTTP {status}")

    async def close(self) -> None:
        self._closed = True
        for connection in list(self._all):
            connection.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks


def _proxy_target(proxy: str) -> tuple[str, int, str | None]:
    """Host, port and Proxy-Authorization of an ``http://`` proxy URL."""
    parts = urlsplit(proxy)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"proxy {proxy!r}: only http://host:port proxies are supported")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    return parts.hostname, parts.port or 80, authorization
