"""The webhook's HTTPS server: aiohttp's web server on the serving TLS context, on each listening address, behind a
gate that bounds the connections it keeps.

What the webhook relies on from it: keep-alive (the apiserver keeps its connections to the webhook open, and a new
TLS connection costs far more than a review), a connection idle for ``idle_timeout_seconds`` closed (longer than
the apiserver's client keeps an idle connection, so the client closes first), and on `close` listening stops at
once while a request being handled gets ``grace_seconds`` to be answered. The counts /status shows are read from
the server and the TLS context, not kept per request.

What it bounds (aiohttp has no connection limit of its own, and a TLS connection costs the process up to a quarter
MiB of buffers for as long as it stays open, whatever it sends): the port accepts every TCP connection, counts it
until its socket is closed, and only then starts its TLS handshake (`ConnectionLimits`). A connection whose client
certificate the client CA verified (the apiserver's) is a client: at most ``clients`` of them, a new one beyond that
is closed after its handshake. Every other connection (in its handshake, or without a verified certificate: the
kubelet's probes, a reader of /status; every connection when reviews are not authenticated) is anonymous: at most
``anonymous`` of them, and one more closes the oldest. So a flood of connections that park (a handshake that never
ends, a request that never does) holds a bounded amount of memory and never the apiserver's connections, which it
cannot push out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

IDLE_TIMEOUT_SECONDS = 120.0
"""How long a kept-alive connection may stay idle, and a request's body take to arrive (`resolver.app`)."""
GRACE_SECONDS = 5.0
"""How long `WebhookServer.close` lets a request being handled finish."""
LINGER_SECONDS = 10.0
"""How long the rest of a body that was refused unread (too large, or too slow) is still read and dropped before the
connection closes (at most the idle timeout): a client still sending it reads the answer, not a reset connection."""
BACKLOG = 1024
"""Connections the kernel holds for the port until they are accepted."""
ACCEPT_RETRY_SECONDS = 0.1
"""How long accepting pauses after it failed (out of file descriptors, say) before it tries again."""
REFUSAL_LOG_SECONDS = 60.0
"""Connections closed by the limits are logged at most once per this period (with how many since the last line)."""


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections the webhook's port keeps open at once (see the module's docstring)."""

    clients: int = 512
    """Connections whose client certificate the client CA verified (the apiserver's); beyond, a new one is closed
    after its handshake."""
    anonymous: int = 128
    """Every other connection, in its TLS handshake or without a verified certificate; one more closes the oldest.
    When reviews are not authenticated every connection is anonymous, and ``clients`` bounds them instead."""
    handshake_timeout_seconds: float = 10.0
    """How long a TLS handshake may take before the connection is closed."""
    shutdown_timeout_seconds: float = 5.0
    """How long a connection being closed waits for the client's TLS goodbye before it is dropped."""


class BodyBudget:
    """The bytes of the request bodies being read at once, at most ``limit``: a body takes its size before it is read
    (`take`: at once when there is room and nobody waits, else in turn) and gives it back once read (`give`). A size
    above the limit takes the whole budget."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def take(self, size: int) -> int:
        """Take ``size`` bytes (at most the limit) once they are free; returns how many were taken."""
        size = min(max(size, 0), self.limit)
        if not self._waiting and self.taken + size <= self.limit:
            self.taken += size
            return size
        turn = (size, asyncio.get_running_loop().create_future())
        self._waiting.append(turn)
        try:
            await turn[1]
        except BaseException:
            if turn[1].done() and not turn[1].cancelled():
                self.give(size)  # granted, then cancelled before it could read
            else:
                self._waiting.remove(turn)
                self._serve()
            raise
        return size

    def give(self, size: int) -> None:
        self.taken -= size
        self._serve()

    @property
    def waiting(self) -> int:
        """Bodies waiting for their share."""
        return len(self._waiting)

    def _serve(self) -> None:
        while self._waiting:
            size, waiter = self._waiting[0]
            if self.taken + size > self.limit:
                return
            self._waiting.popleft()
            self.taken += size
            waiter.set_result(None)


class _Connection:
    """One accepted connection: its socket, in its handshake (``task``) until ``transport`` is set."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.task: asyncio.Task[None] | None = None
        self.started = False
        """Whether the handshake's task ran at all (one cancelled before it ran never took the socket over)."""
        self.transport: asyncio.Transport | None = None

    @property
    def open(self) -> bool:
        """Until its socket is closed: a connection in its TLS goodbye still holds its buffers."""
        return self.sock.fileno() != -1

    def close(self) -> None:
        """Close it now: the socket shut down (no TLS goodbye to wait for), then its transport or its handshake."""
        with contextlib.suppress(OSError):  # already closed by its transport
            self.sock.shutdown(socket.SHUT_RDWR)
        if self.transport is not None:
            self.transport.abort()
        elif self.task is not None:
            self.task.cancel()

    def ended(self, task: asyncio.Task[None]) -> None:
        """The handshake's task is over: a socket it never took over is closed here."""
        if not self.started:
            self.sock.close()


class _Pool:
    """Open connections of one kind, oldest first (closed ones leave it when next counted)."""

    def __init__(self) -> None:
        self._open: collections.OrderedDict[_Connection, None] = collections.OrderedDict()

    def add(self, connection: _Connection) -> None:
        self._open[connection] = None

    def discard(self, connection: _Connection) -> None:
        self._open.pop(connection, None)

    def count(self) -> int:
        for connection in [c for c in self._open if not c.open]:
            del self._open[connection]
        return len(self._open)

    def close_oldest(self) -> None:
        connection, _ = self._open.popitem(last=False)
        connection.close()


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log, where a request the client malformed (not HTTP as RFC 9112 writes it: a Content-Length
    that is no number, a header line too long) is one debug line without a traceback; every other error keeps
    its traceback. aiohttp answers such a request 400 and closes the connection either way."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if isinstance(error, HttpProcessingError):
            message = str(error.message).strip().splitlines()[0] if error.message else type(error).__name__
            peer = args[0] if args else "a client"  # aiohttp's line: "Error handling request from %s", the peer
            self.logger.debug("answered %d to a malformed request from %s: %s", error.code, peer, message)
            return
        super().log(level, msg, *args, **kwargs)


class WebhookServer:
    """Serves ``app`` over TLS on ``host``:``port`` (`start`) until `close`, within ``limits``; ``authenticate``:
    reviews need a client certificate (a verified one makes a connection a client's)."""

    def __init__(self, app: web.Application, *, idle_timeout_seconds: float = IDLE_TIMEOUT_SECONDS,
                 grace_seconds: float = GRACE_SECONDS, limits: ConnectionLimits | None = None,
                 authenticate: bool = False) -> None:
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout_seconds,
                                     lingering_time=min(LINGER_SECONDS, idle_timeout_seconds),
                                     shutdown_timeout=grace_seconds, logger=_ServerLog(log, {}))
        self.limits = limits if limits is not None else ConnectionLimits()
        self._authenticate = authenticate
        self._context: ssl.SSLContext | None = None
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._clients = _Pool()
        self._anonymous = _Pool()
        self._handshakes: set[asyncio.Task[None]] = set()
        self.closed_by_limits = 0
        """Connections closed because a limit was reached (an anonymous one pushed out, a client's beyond its cap)."""
        self._unlogged = 0
        self._logged_at = -REFUSAL_LOG_SECONDS

    async def start(self, host: str | Sequence[str], port: int, *, ssl_context: ssl.SSLContext) -> int:
        """Listen on ``host``:``port`` (several hosts: each of them, on one port; port 0: a free one); returns the
        port. The context is used as it is, so a certificate loaded into it later serves new handshakes."""
        await self._runner.setup()
        self._context = ssl_context
        loop = asyncio.get_running_loop()
        for one in [host] if isinstance(host, str) else list(host):
            family = socket.AF_INET6 if ":" in one else socket.AF_INET
            listener = socket.create_server((one, port), family=family, backlog=BACKLOG)
            listener.setblocking(False)
            self._listeners.append(listener)
            port = int(listener.getsockname()[1])
            self._accepting.append(loop.create_task(self._accept_loop(listener), name=f"webhook-accept-{one}"))
        return port

    async def close(self) -> None:
        """Stop listening and close every connection; a request being handled gets ``grace_seconds``."""
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        for listener in self._listeners:
            listener.close()
        for task in list(self._handshakes):
            task.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        await self._runner.cleanup()

    async def _accept_loop(self, listener: socket.socket) -> None:
        """Take each connection as it is accepted, before its TLS handshake: counted from the first byte."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                connection, _peer = await loop.sock_accept(listener)
            except OSError as error:  # out of file descriptors, or a connection reset before it was taken
                self._closed(f"cannot accept a connection: {error}")
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            self._admit(connection)

    def _admit(self, sock: socket.socket) -> None:
        cap = self.limits.anonymous if self._authenticate else self.limits.clients
        while self._anonymous.count() >= cap:
            self._anonymous.close_oldest()
            self._closed("the oldest anonymous connection closed for a new one")
        connection = _Connection(sock)
        connection.task = asyncio.get_running_loop().create_task(self._handshake(connection))
        self._anonymous.add(connection)
        self._handshakes.add(connection.task)
        connection.task.add_done_callback(self._handshakes.discard)
        connection.task.add_done_callback(connection.ended)

    async def _handshake(self, connection: _Connection) -> None:
        """TLS on the accepted connection, aiohttp's handler on it once the handshake is done; then counted as a
        client's (its certificate verified) or an anonymous one."""
        connection.started = True
        assert self._context is not None and self._runner.server is not None
        try:
            transport, _protocol = await asyncio.get_running_loop().connect_accepted_socket(
                self._runner.server, connection.sock, ssl=self._context,
                ssl_handshake_timeout=self.limits.handshake_timeout_seconds,
                ssl_shutdown_timeout=self.limits.shutdown_timeout_seconds)
        except (OSError, ssl.SSLError, TimeoutError):
            self._anonymous.discard(connection)  # the loop closed it
            return
        connection.transport = transport
        if self._authenticate and transport.get_extra_info("peercert"):
            self._anonymous.discard(connection)
            if self._clients.count() >= self.limits.clients:
                connection.close()
                self._closed(f"a client's connection closed: {self.limits.clients} are open")
                return
            self._clients.add(connection)

    def _closed(self, why: str) -> None:
        self.closed_by_limits += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= REFUSAL_LOG_SECONDS:
            log.warning("connection limit reached: %s (%d connections closed by the limits since the last such line;"
                        " %d clients', %d anonymous open)", why, self._unlogged, self._clients.count(),
                        self._anonymous.count())
            self._logged_at, self._unlogged = now, 0

    @property
    def accepted(self) -> int:
        """Connections accepted so far: TLS handshakes completed on the serving context (OpenSSL counts them)."""
        return 0 if self._context is None else int(self._context.session_stats()["accept_good"])

    @property
    def open_connections(self) -> int:
        server = self._runner.server
        return 0 if server is None else len(server.connections)

    @property
    def requests(self) -> int:
        """Requests received so far."""
        server = self._runner.server
        return 0 if server is None else server.requests_count
