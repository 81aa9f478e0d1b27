"""A small HTTP/2 client (RFC 9113) for the apiserver's hot path: many requests in flight on one TLS connection.

Why: over HTTP/1.1 every request in flight holds a connection of its own, so a worker with 200 bindings in flight
opens 200 TLS connections, each handshake costing its one thread 1.3-2.2 ms of CPU, all inside the first burst of
pods it gets (docs/architecture.md, "A worker's first burst pays for its connections"). kube-scheduler, like every
client-go program, sends everything over one HTTP/2 connection.

What it does and does not do:
- requests and responses with bodies; as many streams per connection as the server's SETTINGS allow, and another
  connection when every open one is full (the apiserver allows 100 or 1,000 streams per connection);
- header compression without a dynamic table: this client announces a header table of size 0, so the server can
  only send static-table references and literals, and the decoder keeps no state. Of a response's headers only
  ``:status`` is read; the others are skipped by their lengths (never Huffman-decoded);
- flow control: the client opens its receive windows to the maximum at once and tops the connection's up as data
  arrives; request bodies wait for the server's windows;
- a stream the server refuses (RST_STREAM REFUSED_STREAM) or leaves unprocessed by a GOAWAY is sent again on
  another connection; anything else that breaks a stream fails that request with ConnectionError;
- a request's deadline resets its stream (CANCEL) and raises TimeoutError; a late answer reaches no one;
- no server push (disabled), no priorities, no trailers (read past), no h2c (cleartext) and no proxies: KubeREST
  uses HTTP/1.1 (`resolver.http1`) for those, and for a server whose ALPN does not choose h2.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import Callable
from urllib.parse import urlsplit

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 1, 2, 3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 4, 5
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = (
    0x0, 0x1, 0x3, 0x6, 0x7, 0x8, 0x9)
WINDOW_MAX = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
MAX_STREAM_ID = 2**31 - 1
# Until the server's SETTINGS say otherwise: RFC 9113 leaves the count unlimited, client-go assumes 100.
INITIAL_MAX_STREAMS = 100
# The connection's receive window is topped up once this much has arrived since the last top-up.
RECEIVE_TOP_UP = 2**30
OPEN_ATTEMPTS = 3  # a request refused unprocessed is sent at most this many times

# The static table's :status entries (RFC 7541 Appendix A, indices 8-14).
STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}
STATUS_NAMES = range(8, 15)  # a name reference to any :status entry names :status (Go's encoder uses 14)
STATIC_ENTRIES = 61
# Huffman codes of the ten digits (RFC 7541 Appendix B): ``:status`` is three digits, so a Huffman-coded status
# value needs no more of the code than this.
_DIGIT_CODES = {(0x0, 5): "0", (0x1, 5): "1", (0x2, 5): "2", (0x19, 6): "3", (0x1a, 6): "4", (0x1b, 6): "5",
                (0x1c, 6): "6", (0x1d, 6): "7", (0x1e, 6): "8", (0x1f, 6): "9"}
# ``:status`` as a literal name, Huffman-coded (a server may send the name spelled out instead of indexed).
_STATUS_NAME_HUFFMAN = bytes.fromhex("b8848d36a3")

# Static-table name indices of the request headers this client sends (RFC 7541 Appendix A).
_NAME_INDEX = {":authority": 1, ":method": 2, ":path": 4, ":scheme": 6, "accept": 19, "authorization": 23,
               "content-length": 28, "content-type": 31, "user-agent": 58}
_FULL_INDEX = {(":method", "GET"): 2, (":method", "POST"): 3, (":scheme", "http"): 6, (":scheme", "https"): 7}
_NEVER_INDEXED = frozenset({"authorization"})


class ProtocolError(ConnectionError):
    """The server broke HTTP/2; the connection is closed (``code``: the error code its GOAWAY carries)."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Unprocessed(ConnectionError):
    """The server did not process the request (REFUSED_STREAM, or above a GOAWAY's last stream): safe to send
    again."""


class NoHttp2(ConnectionError):
    """The server's ALPN did not choose h2."""


# --- HPACK, without a dynamic table ------------------------------------------------------------------------------


def encode_integer(value: int, prefix_bits: int, flags: int = 0) -> bytes:
    """RFC 7541 5.1: ``value`` in a ``prefix_bits`` prefix of the first octet, whose other bits are ``flags``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((flags | value,))
    out = bytearray((flags | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_string(value: bytes) -> bytes:
    """A string literal, not Huffman-coded."""
    return encode_integer(len(value), 7) + value


def encode_header(name: str, value: str) -> bytes:
    """One header field for a decoder that keeps no dynamic table entry of ours: an indexed field when the static
    table has name and value, else a literal without indexing (never indexed for credentials), its name indexed
    when the static table has it."""
    full = _FULL_INDEX.get((name, value))
    if full is not None:
        return encode_integer(full, 7, 0x80)
    flags = 0x10 if name in _NEVER_INDEXED else 0x00
    index = _NAME_INDEX.get(name)
    encoded = value.encode("latin-1")
    if index is not None:
        return encode_integer(index, 4, flags) + encode_string(encoded)
    return bytes((flags,)) + encode_string(name.encode("ascii")) + encode_string(encoded)


def decode_integer(data: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """RFC 7541 5.1: (value, the offset after it)."""
    limit = (1 << prefix_bits) - 1
    try:
        value = data[at] & limit
        at += 1
        if value < limit:
            return value, at
        shift = 0
        while True:
            octet = data[at]
            at += 1
            value += (octet & 0x7F) << shift
            shift += 7
            if not octet & 0x80:
                return value, at
            if shift > 28:
                raise ProtocolError("HPACK integer too long")
    except IndexError:
        raise ProtocolError("HPACK integer cut short") from None


def _string_bounds(data: bytes, at: int) -> tuple[bool, int, int]:
    """(Huffman-coded, start, end) of the string literal at ``at``."""
    huffman = bool(data[at] & 0x80) if at < len(data) else False
    length, start = decode_integer(data, at, 7)
    end = start + length
    if end > len(data):
        raise ProtocolError("HPACK string cut short")
    return huffman, start, end


def huffman_digits(data: bytes) -> str:
    """The digits a Huffman-coded string of digits spells; ProtocolError for any other symbol or bad padding."""
    bits = int.from_bytes(data, "big")
    left = len(data) * 8
    out = []
    while left >= 5:
        for length in (5, 6):
            if length > left:
                break
            symbol = _DIGIT_CODES.get(((bits >> (left - length)) & ((1 << length) - 1), length))
            if symbol is not None:
                out.append(symbol)
                left -= length
                break
        else:
            break
    # What is left must be padding: fewer than 8 bits, all ones (the start of EOS).
    if left >= 8 or (bits & ((1 << left) - 1)) != (1 << left) - 1:
        raise ProtocolError("a :status value that is not three digits")
    return "".join(out)


def _status_value(data: bytes, at: int) -> tuple[int, int]:
    huffman, start, end = _string_bounds(data, at)
    raw = data[start:end]
    text = huffman_digits(raw) if huffman else raw.decode("latin-1")
    if len(text) != 3 or not text.isdigit():
        raise ProtocolError(f"a :status value that is not three digits: {text!r}")
    return int(text), end


def response_status(block: bytes) -> int | None:
    """The ``:status`` of a header block (None for one without, such as trailers), decoded without a dynamic table
    (this client announces a table size of 0, so a reference past the static table is the server's error). Other
    fields are skipped by their lengths."""
    status = None
    at, size = 0, len(block)
    while at < size:
        octet = block[at]
        if octet & 0x80:  # indexed field
            index, at = decode_integer(block, at, 7)
            if not 1 <= index <= STATIC_ENTRIES:
                raise ProtocolError(f"HPACK index {index} with no dynamic table")
            if index in STATIC_STATUS:
                status = STATIC_STATUS[index]
            continue
        if octet & 0xE0 == 0x20:  # dynamic table size update
            update, at = decode_integer(block, at, 5)
            if update:
                raise ProtocolError(f"HPACK table size {update} above the 0 this client allows")
            continue
        index, at = decode_integer(block, at, 6 if octet & 0x40 else 4)  # a literal, indexed or not
        if index > STATIC_ENTRIES:
            raise ProtocolError(f"HPACK name index {index} with no dynamic table")
        named_status = index in STATUS_NAMES
        if index == 0:
            huffman, start, at = _string_bounds(block, at)
            name = block[start:at]
            named_status = name == (_STATUS_NAME_HUFFMAN if huffman else b":status")
        if named_status:
            status, at = _status_value(block, at)
        else:
            at = _string_bounds(block, at)[2]
    return status


# --- one connection ----------------------------------------------------------------------------------------------


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


class _Stream:
    __slots__ = ("answer", "chunks", "ended", "pending", "status", "window")

    def __init__(self, answer: asyncio.Future[tuple[int, bytes]], window: int) -> None:
        self.answer = answer
        self.status = 0
        self.chunks: list[bytes] = []
        self.window = window  # how much request body the server takes on this stream now
        self.pending = b""  # request body waiting for a window
        self.ended = False  # the request's END_STREAM is sent


class Http2Connection(asyncio.Protocol):
    """One HTTP/2 connection. ``ready`` completes with the server's first SETTINGS; ``start`` sends a request and
    returns the future of its (status, body)."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = loop.create_future()
        self.closed = False
        self.going_away = False
        self.max_streams = INITIAL_MAX_STREAMS
        self.streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._buffer = bytearray()
        self._send_window = DEFAULT_WINDOW  # the connection's, for request bodies
        self._initial_window = DEFAULT_WINDOW  # each new stream's
        self._max_frame = DEFAULT_FRAME
        self._received = 0  # DATA octets since the receive window was last topped up
        self._continuing = 0  # the stream whose header block continues in CONTINUATION frames, if any
        self._block = bytearray()  # that header block so far (one at a time on a connection)
        self._block_ends_stream = False  # its HEADERS frame had END_STREAM
        self._waiting: list[int] = []  # streams with request body held back by flow control

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        settings = struct.pack(">HIHIHI", SETTINGS_HEADER_TABLE_SIZE, 0, SETTINGS_ENABLE_PUSH, 0,
                               SETTINGS_INITIAL_WINDOW_SIZE, WINDOW_MAX)
        transport.write(PREFACE + frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW_MAX - DEFAULT_WINDOW)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(ConnectionError(f"HTTP/2 connection lost: {exc or 'closed by the server'}"))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            self._frames()
        except ProtocolError as error:
            self.abort(ProtocolError(f"HTTP/2: {error}", error.code), error.code)

    def _frames(self) -> None:
        """Handle every whole frame in the buffer."""
        buffer = self._buffer
        at, size = 0, len(buffer)
        while size - at >= 9:
            length = int.from_bytes(buffer[at:at + 3], "big")
            if length > DEFAULT_FRAME:  # this client never raises SETTINGS_MAX_FRAME_SIZE
                raise ProtocolError(f"a frame of {length} octets, above {DEFAULT_FRAME}", FRAME_SIZE_ERROR)
            if size - at < 9 + length:
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream = int.from_bytes(buffer[at + 5:at + 9], "big") & MAX_STREAM_ID
            payload = bytes(buffer[at + 9:at + 9 + length])
            at += 9 + length
            self._frame(kind, flags, stream, payload)
        del buffer[:at]

    # -- requests

    @property
    def available(self) -> int:
        """How many more streams this connection takes now."""
        if self.closed or self.going_away or not self.ready.done():
            return 0
        return self.max_streams - len(self.streams)

    def start(self, block: bytes, body: bytes | None) -> tuple[int, asyncio.Future[tuple[int, bytes]]]:
        """Send a request (``block``: its encoded header block); (stream id, future of (status, body))."""
        assert self.transport is not None
        stream_id = self._next_id
        self._next_id += 2
        if self._next_id > MAX_STREAM_ID:
            self.going_away = True  # out of stream ids: new requests go to a new connection
        answer: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        stream = _Stream(answer, self._initial_window)
        self.streams[stream_id] = stream
        out = self._header_frames(stream_id, block, end_stream=not body)
        if body:
            stream.pending = body
            out += self._data_frames(stream_id, stream)
            if stream.pending:
                self._waiting.append(stream_id)
        else:
            stream.ended = True
        self.transport.write(out)
        return stream_id, answer

    def cancel(self, stream_id: int, error: BaseException) -> None:
        """Give up on a stream: reset it (CANCEL) and fail its answer with ``error``."""
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        if not stream.answer.done():
            stream.answer.set_exception(error)
        if self.transport is not None and not self.closed:
            self.transport.write(frame(RST_STREAM, 0, stream_id, struct.pack(">I", CANCEL)))
        self._close_if_done()

    def abort(self, error: BaseException, code: int = NO_ERROR) -> None:
        """Fail every stream with ``error`` and close, telling the server why."""
        if self.transport is not None and not self.closed:
            self.transport.write(frame(GOAWAY, 0, 0, struct.pack(">II", 0, code)))
            self.transport.close()
        self._fail_all(error)

    def _fail_all(self, error: BaseException) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(error)
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            if not stream.answer.done():
                stream.answer.set_exception(error)

    def _close_if_done(self) -> None:
        if self.going_away and not self.streams and self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def _header_frames(self, stream_id: int, block: bytes, *, end_stream: bool) -> bytes:
        first, rest = block[:self._max_frame], block[self._max_frame:]
        flags = END_STREAM if end_stream else 0
        if not rest:
            return frame(HEADERS, flags | END_HEADERS, stream_id, first)
        out = [frame(HEADERS, flags, stream_id, first)]
        while rest:
            piece, rest = rest[:self._max_frame], rest[self._max_frame:]
            out.append(frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, piece))
        return b"".join(out)

    def _data_frames(self, stream_id: int, stream: _Stream) -> bytes:
        """As much of the stream's pending body as the windows allow, the last frame ending the stream."""
        out = []
        while stream.pending:
            size = min(len(stream.pending), self._send_window, stream.window, self._max_frame)
            if size <= 0:
                break
            piece, stream.pending = stream.pending[:size], stream.pending[size:]
            self._send_window -= size
            stream.window -= size
            out.append(frame(DATA, 0 if stream.pending else END_STREAM, stream_id, piece))
        if not stream.pending:
            stream.ended = True
        return b"".join(out)

    def _flush_waiting(self) -> None:
        if not self._waiting or self.transport is None or self.closed:
            return
        out, still = [], []
        for stream_id in self._waiting:
            stream = self.streams.get(stream_id)
            if stream is None:
                continue
            out.append(self._data_frames(stream_id, stream))
            if stream.pending:
                still.append(stream_id)
        self._waiting = still
        self.transport.write(b"".join(out))

    # -- frames from the server

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing and kind != CONTINUATION:
            raise ProtocolError("a header block interrupted by another frame")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind in (HEADERS, CONTINUATION):
            self._headers(kind, flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8:
                raise ProtocolError("a PING that is not 8 octets", FRAME_SIZE_ERROR)
            if not flags & ACK and self.transport is not None:
                self.transport.write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self._reset(stream_id, payload)
        elif kind == GOAWAY:
            self._goaway(payload)
        elif kind == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE with push disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 4.1, 5.5).

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise ProtocolError("padding longer than the frame")
        return payload[1:len(payload) - payload[0]]

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        # Every DATA octet counts against the connection's window, whoever it was for.
        self._received += len(payload)
        if self._received >= RECEIVE_TOP_UP and self.transport is not None:
            self.transport.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
            self._received = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream given up on (deadline) or reset
        if not stream.status:
            raise ProtocolError(f"DATA before the response headers on stream {stream_id}")
        stream.chunks.append(self._unpad(flags, payload))
        if flags & END_STREAM:
            self._finish(stream_id, stream)

    def _headers(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == CONTINUATION:
            if not self._continuing or stream_id != self._continuing:
                raise ProtocolError("CONTINUATION without a header block to continue")
            self._block += payload
        else:
            payload = self._unpad(flags, payload)
            self._block = bytearray(payload[5:] if flags & PRIORITY_FLAG else payload)
            self._block_ends_stream = bool(flags & END_STREAM)
        if not flags & END_HEADERS:
            self._continuing = stream_id
            return
        self._continuing = 0
        block, self._block = bytes(self._block), bytearray()
        status = response_status(block)  # decoded even for a stream given up on: the block must be valid
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream given up on
        if not stream.status:
            if status is None:
                raise ProtocolError(f"a response without :status on stream {stream_id}")
            if 100 <= status <= 199:
                return  # an interim response; the final one follows
            stream.status = status
        # else: trailers, read past
        if self._block_ends_stream:
            self._finish(stream_id, stream)

    def _finish(self, stream_id: int, stream: _Stream) -> None:
        del self.streams[stream_id]
        if not stream.answer.done():
            stream.answer.set_result((stream.status, b"".join(stream.chunks)))
        if not stream.ended and self.transport is not None and not self.closed:
            # The server answered before taking the whole body: stop sending it.
            self.transport.write(frame(RST_STREAM, 0, stream_id, struct.pack(">I", NO_ERROR)))
        self._close_if_done()

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ProtocolError("SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise ProtocolError("SETTINGS not a multiple of 6 octets", FRAME_SIZE_ERROR)
        for at in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, at)
            if key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.max_streams = value
            elif key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > WINDOW_MAX:
                    raise ProtocolError("initial window above 2^31-1", FLOW_CONTROL_ERROR)
                delta, self._initial_window = value - self._initial_window, value
                for stream in self.streams.values():
                    stream.window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 2**24 - 1:
                    raise ProtocolError(f"max frame size {value}")
                self._max_frame = value
        if self.transport is not None:
            self.transport.write(frame(SETTINGS, ACK, 0))
        if not self.ready.done():
            self.ready.set_result(None)
        self._flush_waiting()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError("WINDOW_UPDATE not 4 octets", FRAME_SIZE_ERROR)
        increment = int.from_bytes(payload, "big") & MAX_STREAM_ID
        if stream_id == 0:
            if not increment:
                raise ProtocolError("connection WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > WINDOW_MAX:
                raise ProtocolError("connection window above 2^31-1", FLOW_CONTROL_ERROR)
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if not increment or stream.window + increment > WINDOW_MAX:
                self.cancel(stream_id, ConnectionError(f"HTTP/2 stream {stream_id}: bad WINDOW_UPDATE"))
                return
            stream.window += increment
        self._flush_waiting()

    def _reset(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError("RST_STREAM not 4 octets", FRAME_SIZE_ERROR)
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        code = int.from_bytes(payload, "big")
        if not stream.answer.done():
            stream.answer.set_exception(
                Unprocessed(f"HTTP/2 stream {stream_id} refused by the server") if code == REFUSED_STREAM
                else ConnectionError(f"HTTP/2 stream {stream_id} reset by the server (error code {code})"))
        self._close_if_done()

    def _goaway(self, payload: bytes) -> None:
        if len(payload) < 8:
            raise ProtocolError("GOAWAY shorter than 8 octets", FRAME_SIZE_ERROR)
        last, code = struct.unpack_from(">II", payload)
        last &= MAX_STREAM_ID
        self.going_away = True
        for stream_id in [s for s in self.streams if s > last]:
            stream = self.streams.pop(stream_id)
            if not stream.answer.done():
                stream.answer.set_exception(Unprocessed(
                    f"HTTP/2 stream {stream_id} not processed: the server is going away (error code {code})"))
        self._close_if_done()


# --- the client ---------------------------------------------------------------------------------------------------


class Http2Client:
    """Requests to one server over HTTP/2 connections, at most ``limit`` in flight; a caller over the limit waits.
    ``tls`` must offer h2 by ALPN (``alpn_context``); a server that does not choose it raises NoHttp2 from the
    first request, before anything is sent."""

    def __init__(self, url: str, *, tls: ssl.SSLContext, server_hostname: str | None = None, limit: int = 100,
                 clock: Callable[[], float] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"server URL {url!r}: HTTP/2 needs https://host[:port]")
        if limit < 1:
            raise ValueError(f"request limit {limit}: must be at least 1")
        self.host = parts.hostname
        self.port = parts.port or 443
        self.authority = self.host if self.port == 443 else f"{self.host}:{self.port}"
        if ":" in self.host:
            self.authority = f"[{self.host}]" + ("" if self.port == 443 else f":{self.port}")
        self._tls = tls
        self._server_hostname = server_hostname
        self._slots = asyncio.Semaphore(limit)
        self._connections: list[Http2Connection] = []
        self._opening: asyncio.Task[Http2Connection] | None = None
        self._room = asyncio.Event()  # set when a stream ends: a caller waiting for a free stream looks again
        self._closed = False
        self.opened = 0  # connections opened so far

    @property
    def closed(self) -> bool:
        return self._closed

    def block(self, method: str, target: str, headers: list[tuple[str, str]]) -> bytes:
        """The encoded header block of a request: pseudo-headers, then ``headers`` (lower-case names)."""
        return b"".join((encode_header(":method", method), encode_header(":scheme", "https"),
                         encode_header(":authority", self.authority), encode_header(":path", target),
                         *(encode_header(name, value) for name, value in headers)))

    async def request(self, block: bytes, body: bytes | None = None, *,
                      deadline: float | None = None) -> tuple[int, bytes]:
        """Send a request (``block`` from ``block()``) and ``body``; (status, body). ``deadline`` (the event loop's
        clock) raises TimeoutError when it passes, whether the request waits for a stream or for its answer."""
        if self._closed:
            raise ConnectionError("the HTTP/2 client is closed")
        async with asyncio.timeout_at(deadline):
            await self._slots.acquire()
        try:
            for attempt in range(1, OPEN_ATTEMPTS + 1):
                async with asyncio.timeout_at(deadline):
                    connection = await self._connection()
                stream_id, answer = connection.start(block, body)
                timer = None if deadline is None else asyncio.get_running_loop().call_at(
                    deadline, connection.cancel, stream_id, TimeoutError("no answer before the deadline"))
                try:
                    return await answer
                except Unprocessed:
                    if attempt == OPEN_ATTEMPTS:
                        raise
                except asyncio.CancelledError:
                    connection.cancel(stream_id, ConnectionError("the request was cancelled"))
                    raise
                finally:
                    if timer is not None:
                        timer.cancel()
                    self._room.set()
            raise AssertionError("unreachable")
        finally:
            self._slots.release()

    async def _connection(self) -> Http2Connection:
        """A connection with a free stream: an open one, else a new one."""
        while True:
            self._connections = [c for c in self._connections if not c.closed]
            for connection in self._connections:
                if connection.available > 0:
                    return connection
            if self._opening is None:
                self._opening = asyncio.ensure_future(self._open())
                self._opening.add_done_callback(self._opened)
            opening = self._opening
            self._room.clear()
            room = asyncio.ensure_future(self._room.wait())
            try:
                await asyncio.wait((opening, room), return_when=asyncio.FIRST_COMPLETED)
            finally:
                room.cancel()
            if opening.done() and opening.exception() is not None:
                raise opening.exception()  # type: ignore[misc]

    def _opened(self, task: asyncio.Task[Http2Connection]) -> None:
        if self._opening is task:
            self._opening = None
        if not task.cancelled() and task.exception() is None:
            self._connections.append(task.result())

    async def _open(self) -> Http2Connection:
        loop = asyncio.get_running_loop()
        transport, connection = await loop.create_connection(
            Http2Connection, self.host, self.port, ssl=self._tls,
            server_hostname=self._server_hostname or self.host)
        ssl_object = transport.get_extra_info("ssl_object")
        chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        if chosen != "h2":
            transport.close()
            raise NoHttp2(f"{self.authority} chose {chosen or 'no protocol'} by ALPN, not h2")
        try:
            await connection.ready
        except BaseException:
            transport.close()
            raise
        self.opened += 1
        return connection

    async def close(self) -> None:
        self._closed = True
        if self._opening is not None:
            self._opening.cancel()
        for connection in self._connections:
            connection.abort(ConnectionError("the HTTP/2 client is closed"))
        self._connections = []


def alpn_context(tls: ssl.SSLContext) -> ssl.SSLContext:
    """``tls`` offering h2 (and http/1.1) by ALPN. The context is changed in place: give it one of its own."""
    tls.set_alpn_protocols(["h2", "http/1.1"])
    return tls
