"""The resolver's small HTTP/1.1 server over raw sockets: keep-alive, pipelining, limits, and every refusal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from resolver.httpserver import MAX_DRAIN_BYTES, HttpServer, Request, Response


async def echo(request: Request) -> Response:
    return Response(200, request.body or request.query.encode(), "application/json")


async def slow(request: Request) -> Response:
    await asyncio.sleep(0.05)
    return Response(200, b"slow:" + request.body)


async def broken(_request: Request) -> Response:
    raise RuntimeError("handler bug")


@pytest.fixture
async def server() -> AsyncIterator[tuple[HttpServer, int]]:
    served = HttpServer(
        {("POST", "/echo"): echo, ("GET", "/echo"): echo, ("POST", "/slow"): slow, ("GET", "/broken"): broken},
        max_body_bytes=100, max_header_bytes=1024, idle_timeout_seconds=0.5,
        too_large=lambda _request: Response(400, b"too large"),
    )
    port = await served.start("127.0.0.1", 0)
    yield served, port
    await served.close(grace_seconds=1)


async def exchange(port: int, raw: bytes, *, answers: int = 1) -> tuple[list[tuple[int, dict[str, str], bytes]], bool]:
    """Send ``raw``; read ``answers`` responses; return them and whether the server then closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    responses = []
    try:
        for _ in range(answers):
            head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)).decode()
            lines = head.split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            responses.append((status, headers, body))
        try:
            closed = await asyncio.wait_for(reader.read(1), 0.2) == b""
        except TimeoutError:
            closed = False
    finally:
        writer.close()
    return responses, closed


def post(path: str, body: bytes, *extra: str) -> bytes:
    headers = "".join(f"{h}\r\n" for h in extra)
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(server: tuple[HttpServer, int]) -> None:
    _, port = server
    responses, closed = await exchange(port, post("/slow", b"one") + post("/echo?x=1", b"two"), answers=2)
    assert [(s, b) for s, _h, b in responses] == [(200, b"slow:one"), (200, b"two")]
    assert responses[1][1]["content-type"] == "application/json"
    assert not closed


async def test_connection_close_and_http_1_0_close_after_the_answer(server: tuple[HttpServer, int]) -> None:
    _, port = server
    responses, closed = await exchange(port, post("/echo", b"a", "Connection: close"))
    assert responses[0][0] == 200 and responses[0][1]["connection"] == "close" and closed
    responses, closed = await exchange(port, b"GET /echo?q HTTP/1.0\r\n\r\n")
    assert responses[0][2] == b"q" and closed


async def test_a_body_in_several_pieces_and_expect_continue(server: tuple[HttpServer, int]) -> None:
    _, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: 6\r\nExpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abc")
        await asyncio.sleep(0.01)
        writer.write(b"def")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert await reader.readexactly(6) == b"abcdef"
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 411),
        (b"GET /echo HTTP/1.1\r\nX-Big: " + b"x" * 2000 + b"\r\n\r\n", 431),
        (b"GET /echo\r\n\r\n", 400),
        (b"GET /echo HTTP/2.0\r\n\r\n", 505),
        (b"GET /echo HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /echo HTTP/1.1\r\n folded: header\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"GET http://elsewhere/echo HTTP/1.1\r\n\r\n", 400),
    ],
)
async def test_what_cannot_be_parsed_is_refused_and_the_connection_closed(
    server: tuple[HttpServer, int], raw: bytes, status: int
) -> None:
    responses, closed = await exchange(server[1], raw)
    assert responses[0][0] == status
    assert closed


async def test_a_body_over_the_limit_gets_the_too_large_answer(server: tuple[HttpServer, int]) -> None:
    responses, closed = await exchange(server[1], post("/echo", b"x" * 101))
    assert (responses[0][0], responses[0][2], closed) == (400, b"too large", True)


async def test_a_client_still_sending_a_refused_body_reads_the_answer_not_a_reset(
    server: tuple[HttpServer, int]
) -> None:
    body = b"[" * 300_000
    reader, writer = await asyncio.open_connection("127.0.0.1", server[1])
    try:
        writer.write(f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        for start in range(0, len(body), 50_000):  # the body keeps coming after the server has answered
            writer.write(body[start:start + 50_000])
            await writer.drain()
            await asyncio.sleep(0.02)
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)).decode()
        assert head.startswith("HTTP/1.1 400 ") and "Connection: close" in head
        assert await reader.readexactly(len(b"too large")) == b"too large"
        assert await asyncio.wait_for(reader.read(1), 2) == b"", "closed once the whole body was read"
    finally:
        writer.close()


async def test_a_refused_body_longer_than_the_drain_limit_is_cut_off_at_once(server: tuple[HttpServer, int]) -> None:
    responses, closed = await exchange(
        server[1], b"POST /echo HTTP/1.1\r\nContent-Length: %d\r\n\r\nxx" % (MAX_DRAIN_BYTES + 100))
    assert (responses[0][0], closed) == (400, True)


async def test_a_refused_body_that_stops_coming_is_closed_after_the_idle_timeout(
    server: tuple[HttpServer, int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server[1])
    try:
        writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + b"x" * 200)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert head.startswith(b"HTTP/1.1 400 ")
        await reader.readexactly(len(b"too large"))
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(1), 5) == b""
        assert asyncio.get_running_loop().time() - started < 3.0  # the fixture's idle timeout is 0.5 s
    finally:
        writer.close()


async def test_unknown_paths_methods_and_failing_handlers(server: tuple[HttpServer, int]) -> None:
    _, port = server
    responses, _ = await exchange(
        port, b"GET /nowhere HTTP/1.1\r\n\r\nDELETE /echo HTTP/1.1\r\n\r\nGET /broken HTTP/1.1\r\n\r\n", answers=3
    )
    assert [s for s, _h, _b in responses] == [404, 405, 500]


async def test_an_idle_or_stuck_connection_is_closed(server: tuple[HttpServer, int]) -> None:
    _, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")  # never finished
        assert await asyncio.wait_for(reader.read(), 2) == b""
    finally:
        writer.close()


async def test_close_waits_for_a_request_being_handled(server: tuple[HttpServer, int]) -> None:
    served, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(post("/slow", b"last"))
        await asyncio.sleep(0.01)
        await served.close(grace_seconds=1)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert await reader.readexactly(9) == b"slow:last"
    finally:
        writer.close()
