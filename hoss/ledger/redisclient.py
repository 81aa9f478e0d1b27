"""A lean Redis client for the webhook's ledger calls: one connection, commands pipelined, hiredis both ways.

Every binding in the cluster costs the webhook one ledger script call. redis-py's asyncio client spends far more
CPU on a call than Redis does (a connection checked out of and back into a pool, retry and observability
wrappers, a Python packer, a task per send when a socket timeout is set), and its pool refuses a call outright
("Too many connections") when a burst of reviews has more calls in flight than it has connections. Here each call
is: pack with hiredis, write, and a future that the connection's reply parser (hiredis) resolves; calls made
together share the connection and its round trips, in order.

Authentication: a URL with a user and password (``redis://user:password@host``, an ACL user) sends ``AUTH user
password`` first on every new connection; ``rediss://`` connects over TLS with the URL's ssl options (see
`PipelinedRedis._ssl_context`).

`PipelinedRedis` is a `hoss.ledger.connection.LedgerClient`, as redis-py's client is: ``register_script`` (EVALSHA,
loading the script on NOSCRIPT), ``evalsha_ro`` and ``script_load`` (read-only scripts), ``exists``, ``get``,
``delete``, ``hgetall``, ``xrange``, ``xread``, ``pipeline`` (commands sent in one write, in MULTI ... EXEC for a
transaction) and ``aclose``, with the replies redis-py gives with decoded responses, except that stream entries keep
their fields as flat lists (the ledger's decoders read both; a dict per entry would cost the workers' change-stream
reads). ``execute`` and ``execute_many`` send any command (the workers' blocking work-stream reads on connections of
their own, the dispatcher's MULTI ... EXEC sends).
Errors are redis-py's (ConnectionError, TimeoutError, ResponseError, NoScriptError), so the ledger turns them into
LedgerUnavailable as it does for redis-py's. There is no per-call timeout: callers bound their calls (the webhook
uses asyncio.timeout); a call cancelled that way leaves its reply to be read and dropped. A lost connection fails
every call in flight, and the next call connects again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import ssl
from collections.abc import Sequence
from typing import Any, Self

import hiredis
from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import KeyT, StreamIdT


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader(encoding="utf-8", replyError=ResponseError)
        self.pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.lost = asyncio.get_running_loop().create_future()
        """Done once the transport is gone (a TLS one only after its shutdown)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport, as created in _connect

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            reply = self.reader.gets()
            if reply is False:
                return
            if not self.pending:  # a reply nobody asked for: the stream is out of step
                self._fail(RedisConnectionError("unexpected reply from Redis"))
                return
            future = self.pending.popleft()
            if future.done():
                continue  # its caller gave up (cancelled); the reply is dropped
            if isinstance(reply, ResponseError):
                message = str(reply)
                future.set_exception(NoScriptError(message) if message.startswith("NOSCRIPT") else reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        self._fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed by the server'}"))

    def _fail(self, error: Exception) -> None:
        self.closed = True
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(error)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class _Script:
    def __init__(self, client: PipelinedRedis, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()  # Redis names scripts by their SHA-1

    async def __call__(self, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> Any:
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return await self.client.execute(*command)
        except NoScriptError:
            await self.client.execute("SCRIPT", "LOAD", self.source)
            return await self.client.execute(*command)


class Pipeline:
    """Commands queued to go in one write (`PipelinedRedis.execute_many`), in MULTI ... EXEC when `transaction`;
    `execute` answers their replies in order and raises the first error, as redis-py's pipeline does."""

    def __init__(self, client: PipelinedRedis, *, transaction: bool) -> None:
        self._client = client
        self._transaction = transaction
        self._commands: list[tuple[Any, ...]] = []

    def get(self, key: str) -> Self:
        return self._queue("GET", key)

    def incr(self, key: str) -> Self:
        return self._queue("INCR", key)

    def hmget(self, key: str, fields: Sequence[str]) -> Self:
        return self._queue("HMGET", key, *fields)

    def hincrby(self, key: str, field: str, amount: int) -> Self:
        return self._queue("HINCRBY", key, field, amount)

    def hset(self, key: str, field: str, value: str) -> Self:
        return self._queue("HSET", key, field, value)

    def _queue(self, *command: Any) -> Self:
        self._commands.append(command)
        return self

    async def execute(self) -> list[Any]:
        commands, self._commands = self._commands, []
        if not commands:
            return []
        if not self._transaction:
            return await self._client.execute_many(commands)
        replies = await self._client.execute_many([("MULTI",), *commands, ("EXEC",)])
        executed = replies[-1]
        if not isinstance(executed, list):
            raise ResponseError(f"the transaction was not executed ({executed!r})")
        for reply in executed:
            if isinstance(reply, ResponseError):
                raise reply
        return executed


class PipelinedRedis:
    """One pipelined connection to the Redis at ``url`` (``redis://``, ``rediss://`` or ``unix://``, with user,
    password and database as redis-py reads them), opened at the first call."""

    def __init__(self, url: str, *, connect_timeout: float = 2.0) -> None:
        self._options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
        self._tls = url.startswith("rediss://")
        self._connect_timeout = connect_timeout
        self._protocol: _Protocol | None = None
        self._connecting = asyncio.Lock()

    def register_script(self, source: str) -> _Script:
        return _Script(self, source)

    async def evalsha_ro(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return await self.execute("EVALSHA_RO", sha, numkeys, *keys_and_args)

    async def script_load(self, source: str) -> str:
        return str(await self.execute("SCRIPT", "LOAD", source))

    async def exists(self, *keys: str) -> int:
        return int(await self.execute("EXISTS", *keys))

    async def get(self, key: str) -> str | None:
        value = await self.execute("GET", key)
        return None if value is None else str(value)

    async def delete(self, *keys: str) -> int:
        return int(await self.execute("DEL", *keys))

    async def hgetall(self, key: str) -> dict[str, str]:
        flat = await self.execute("HGETALL", key)
        return dict(zip(flat[0::2], flat[1::2], strict=True))

    async def xrange(self, key: str, *, count: int | None = None) -> list[Any]:
        """The stream's entries from the first, at most `count`: [id, [field, value, ...]] each."""
        return list(await self.execute("XRANGE", key, "-", "+", *(() if count is None else ("COUNT", count))))

    async def xread(self, streams: dict[KeyT, StreamIdT], count: int | None = None,
                    block: int | None = None) -> list[Any] | None:
        """Entries after each stream's id: [stream, [[id, [field, value, ...]], ...]] per stream with any, None
        when a `block` (ms) passed with none."""
        options = [*(() if count is None else ("COUNT", count)), *(() if block is None else ("BLOCK", block))]
        reply = await self.execute("XREAD", *options, "STREAMS", *streams.keys(), *streams.values())
        return None if reply is None else list(reply)

    def pipeline(self, transaction: bool = True) -> Pipeline:
        return Pipeline(self, transaction=transaction)

    async def execute(self, *args: Any) -> Any:
        """Send one command; its reply (strings decoded as UTF-8), or the error Redis answered."""
        protocol = await self._connected()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        protocol.pending.append(future)
        assert protocol.transport is not None
        protocol.transport.write(hiredis.pack_command(args))
        return await future

    async def execute_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send several commands in one write, so nothing another caller sends comes between them (a MULTI ...
        EXEC block stays whole); their replies in order. The first error Redis answered is raised."""
        protocol = await self._connected()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in commands]
        protocol.pending.extend(futures)
        assert protocol.transport is not None
        protocol.transport.write(b"".join(hiredis.pack_command(tuple(command)) for command in commands))
        return list(await asyncio.gather(*futures))

    async def _connected(self) -> _Protocol:
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connect()
        return protocol

    async def aclose(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
            await _gone(protocol)

    async def _connect(self) -> _Protocol:
        async with self._connecting:
            if self._protocol is not None and not self._protocol.closed:
                return self._protocol
            loop = asyncio.get_running_loop()
            options = self._options
            try:
                async with asyncio.timeout(self._connect_timeout):
                    if "path" in options:
                        transport, protocol = await loop.create_unix_connection(_Protocol, options["path"])
                    else:
                        transport, protocol = await loop.create_connection(
                            _Protocol, options.get("host", "localhost"), int(options.get("port", 6379)),
                            ssl=self._ssl_context() if self._tls else None,
                        )
                    # Some loops (uvloop) call connection_made only after create_connection has returned.
                    protocol.transport = transport
                    self._protocol = protocol
                    if options.get("password"):
                        username = options.get("username")
                        await self.execute("AUTH", *([username] if username else []), options["password"])
                    if int(options.get("db") or 0):
                        await self.execute("SELECT", int(options["db"]))
            except TimeoutError as error:
                await self._drop()
                raise RedisTimeoutError(f"no connection to Redis within {self._connect_timeout}s") from error
            except OSError as error:
                await self._drop()
                raise RedisConnectionError(f"cannot connect to Redis: {error}") from error
            except BaseException:
                await self._drop()
                raise
            return protocol

    async def _drop(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
            await _gone(protocol)

    def _ssl_context(self) -> ssl.SSLContext:
        """TLS as redis-py reads it from a rediss:// URL: ``ssl_ca_certs`` (the server's CA; default: the system's),
        ``ssl_certfile`` and ``ssl_keyfile`` (a client certificate, for a server that asks for one),
        ``ssl_check_hostname`` and ``ssl_cert_reqs``."""
        options = self._options
        context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
        if options.get("ssl_certfile"):
            context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
        if str(options.get("ssl_check_hostname", True)).lower() in ("false", "0", "no"):
            context.check_hostname = False
        if str(options.get("ssl_cert_reqs", "required")).lower() in ("none", str(int(ssl.CERT_NONE))):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


async def _gone(protocol: _Protocol, timeout: float = 1.0) -> None:
    """Wait (briefly, never failing) until a closed connection's transport is gone: a TLS transport closes its
    socket only after the TLS shutdown."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(protocol.lost), timeout)
