"""The webhook's HTTPS server: aiohttp's web server on the serving TLS context, on each listening address.

What the webhook relies on from it: keep-alive (the apiserver keeps its connections to the webhook open, and a new
TLS connection costs far more than a review), a connection idle for ``idle_timeout_seconds`` closed (longer than
the apiserver's client keeps an idle connection, so the client closes first), and on `close` listening stops at
once while a request being handled gets ``grace_seconds`` to be answered. The counts /status shows are read from
the server and the TLS context, not kept per request.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

from aiohttp import web

IDLE_TIMEOUT_SECONDS = 120.0
"""How long a kept-alive connection may stay idle, and a request's body take to arrive (`resolver.app`)."""
GRACE_SECONDS = 5.0
"""How long `WebhookServer.close` lets a request being handled finish."""
LINGER_SECONDS = 10.0
"""How long the rest of a body that was refused unread (too large, or too slow) is still read and dropped before the
connection closes (at most the idle timeout): a client still sending it reads the answer, not a reset connection."""


class WebhookServer:
    """Serves ``app`` over TLS on ``host``:``port`` (`start`) until `close`."""

    def __init__(self, app: web.Application, *, idle_timeout_seconds: float = IDLE_TIMEOUT_SECONDS,
                 grace_seconds: float = GRACE_SECONDS) -> None:
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout_seconds,
                                     lingering_time=min(LINGER_SECONDS, idle_timeout_seconds),
                                     shutdown_timeout=grace_seconds)
        self._context: ssl.SSLContext | None = None

    async def start(self, host: str | Sequence[str], port: int, *, ssl_context: ssl.SSLContext) -> int:
        """Listen on ``host``:``port`` (several hosts: each of them, on one port; port 0: a free one); returns the
        port. The context is used as it is, so a certificate loaded into it later serves new handshakes."""
        await self._runner.setup()
        self._context = ssl_context
        hosts = [host] if isinstance(host, str) else list(host)
        for one in hosts:
            await web.TCPSite(self._runner, one, port, ssl_context=ssl_context).start()
            port = int(self._runner.addresses[0][1])
        return port

    async def close(self) -> None:
        """Stop listening and close every connection; a request being handled gets ``grace_seconds``."""
        await self._runner.cleanup()

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
