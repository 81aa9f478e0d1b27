"""The webhook's HTTP over raw TLS sockets, as a client that is not aiohttp sees it: keep-alive, the body limit, what
cannot be parsed, idle and stalled connections, stopping, and the counts in /status. The verdicts themselves are
tests/unit/test_webhook.py's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hoss.model.objects import Json
from tests.unit.webhooks import Webhook, pod, review, start

LIMIT = 4096
"""max_body_bytes of the webhook under test: a review fits, padding does not."""
Answer = tuple[int, dict[str, str], bytes]


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[Webhook]:
    async for hook in start(tmp_path, max_body_bytes=LIMIT):
        yield hook


def post(body: bytes, *headers: str, path: str = "/validate-binding") -> bytes:
    extra = "".join(f"{header}\r\n" for header in headers)
    return (f"POST {path} HTTP/1.1\r\nHost: hoss\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def binding(name: str, uid: str, node: str = "n1") -> bytes:
    return json.dumps(review(pod_name=name, uid=uid, node=node)).encode()


class Connection:
    """One TLS connection to the webhook, read answer by answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def answer(self) -> Answer:
        head = (await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)).decode()
        lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await asyncio.wait_for(self.reader.readexactly(int(headers.get("content-length", "0"))), 5)
        return int(lines[0].split(" ")[1]), headers, body

    async def closed(self, within: float = 0.5) -> bool:
        """Whether the webhook closes the connection within ``within`` seconds."""
        try:
            return await asyncio.wait_for(self.reader.read(1), within) == b""
        except TimeoutError:
            return False
        except ConnectionError:
            return True


async def connect(hook: Webhook) -> Connection:
    reader, writer = await asyncio.open_connection("127.0.0.1", hook.port, ssl=hook.client_tls)
    return Connection(reader, writer)


async def exchange(hook: Webhook, raw: bytes, *, answers: int = 1, watch: float = 0.5) -> tuple[list[Answer], bool]:
    """Send ``raw`` on a new connection; the ``answers`` answers and whether the webhook then closed it (within
    ``watch`` seconds)."""
    connection = await connect(hook)
    try:
        connection.writer.write(raw)
        got = [await connection.answer() for _ in range(answers)]
        return got, await connection.closed(within=watch)
    finally:
        connection.writer.close()


def allowed(answer: Answer) -> bool:
    status, _headers, body = answer
    assert status == 200, answer
    verdict: bool = json.loads(body)["response"]["allowed"]
    return verdict


async def test_reviews_sent_back_to_back_on_one_kept_alive_connection_are_answered_in_order(
    webhook: Webhook,
) -> None:
    answers, closed = await exchange(
        webhook, post(binding("small", "u-small")) + post(binding("big", "u-big")) + post(binding("small", "u-small")),
        answers=3,
    )
    assert [allowed(answer) for answer in answers] == [True, False, True]
    assert answers[0][1]["content-type"] == "application/json"
    assert not closed, "the connection stays open for the next review"
    assert webhook.state.verdict_counts == {"fits": 1, "conflict": 1, "reserved": 1}


async def test_a_client_that_asks_to_close_gets_its_answer_then_the_connection_closes(webhook: Webhook) -> None:
    answers, closed = await exchange(webhook, post(binding("small", "u-small"), "Connection: close"))
    assert allowed(answers[0]) and closed
    answers, closed = await exchange(webhook, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert answers[0][0] == 200 and answers[0][2] == b"ok" and closed


async def test_a_review_whose_body_comes_in_pieces_after_100_continue_is_judged(webhook: Webhook) -> None:
    body = binding("small", "u-small")
    connection = await connect(webhook)
    try:
        connection.writer.write(post(body, "Expect: 100-continue")[: -len(body)])
        interim = await asyncio.wait_for(connection.reader.readuntil(b"\r\n\r\n"), 5)
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        for start_at in range(0, len(body), 100):
            connection.writer.write(body[start_at:start_at + 100])
            await asyncio.sleep(0.005)
        assert allowed(await connection.answer())
    finally:
        connection.writer.close()


async def test_a_review_over_the_body_limit_gets_400_naming_the_limit_and_the_connection_closes(
    webhook: Webhook,
) -> None:
    answers, closed = await exchange(webhook, post(b"x" * (LIMIT + 1)))
    status, headers, body = answers[0]
    assert (status, json.loads(body)) == (400, {"error": f"AdmissionReview larger than {LIMIT} bytes"})
    assert headers["connection"].lower() == "close" and closed
    assert not webhook.state.verdict_counts, "nothing was judged"


async def test_a_client_still_sending_a_refused_body_reads_the_answer_not_a_reset(webhook: Webhook) -> None:
    body = b"[" * 300_000
    connection = await connect(webhook)
    try:
        connection.writer.write(f"POST /validate-binding HTTP/1.1\r\nHost: hoss\r\nContent-Length: {len(body)}\r\n\r\n"
                                .encode())
        for start_at in range(0, len(body), 50_000):  # the body keeps coming after the webhook has answered
            connection.writer.write(body[start_at:start_at + 50_000])
            await connection.writer.drain()
            await asyncio.sleep(0.02)
        status, _headers, answer = await connection.answer()
        assert status == 400 and "larger than" in json.loads(answer)["error"]
        assert await connection.closed(within=5), "closed once the body was read"
    finally:
        connection.writer.close()


async def test_a_chunked_review_over_the_body_limit_gets_400_too(webhook: Webhook) -> None:
    chunks = b"".join(b"%x\r\n%s\r\n" % (1000, b"x" * 1000) for _ in range(5)) + b"0\r\n\r\n"
    raw = b"POST /validate-binding HTTP/1.1\r\nHost: hoss\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    answers, closed = await exchange(webhook, raw)
    assert answers[0][0] == 400 and "larger than" in json.loads(answers[0][2])["error"]
    assert closed


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /healthz HTTP/1.1\r\nHost: hoss\r\nno colon here\r\n\r\n",
        b"POST /validate-binding HTTP/1.1\r\nHost: hoss\r\nContent-Length: -1\r\n\r\n",
        b"POST /validate-binding HTTP/1.1\r\nHost: hoss\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"GET /healthz HTTP/1.1\r\nHost: hoss\r\nX-Big: " + b"x" * 20_000 + b"\r\n\r\n",
    ],
    ids=["header-without-colon", "negative-length", "conflicting-lengths", "header-too-long"],
)
async def test_what_cannot_be_parsed_gets_400_and_the_connection_closes(webhook: Webhook, raw: bytes) -> None:
    answers, closed = await exchange(webhook, raw)
    assert answers[0][0] == 400 and closed
    assert not webhook.state.verdict_counts


async def test_unknown_paths_get_404_and_other_methods_405(webhook: Webhook) -> None:
    raw = (b"GET /nowhere HTTP/1.1\r\nHost: hoss\r\n\r\n"
           b"GET /validate-binding HTTP/1.1\r\nHost: hoss\r\n\r\n"
           b"POST /healthz HTTP/1.1\r\nHost: hoss\r\nContent-Length: 0\r\n\r\n")
    answers, _closed = await exchange(webhook, raw, answers=3, watch=0)
    assert [status for status, _headers, _body in answers] == [404, 405, 405]


async def test_idle_connections_and_bodies_that_stop_coming_are_closed(tmp_path: Path) -> None:
    async for hook in start(tmp_path, idle_timeout_seconds=0.3, max_body_bytes=LIMIT):
        idle, stalled, refused = await connect(hook), await connect(hook), await connect(hook)
        try:
            stalled.writer.write(post(binding("small", "u-small"))[:-10])  # never finished
            refused.writer.write(post(b"x" * (LIMIT + 1))[:-LIMIT])  # too large, and never finished either
            assert await idle.closed(within=3)
            status, headers, body = await stalled.answer()
            assert (status, headers["connection"].lower()) == (408, "close"), body
            assert await stalled.closed(within=3)
            assert (await refused.answer())[0] == 400
            assert await refused.closed(within=3)
        finally:
            for connection in (idle, stalled, refused):
                connection.writer.close()
        assert not hook.state.verdict_counts


async def test_a_review_being_judged_when_the_webhook_stops_is_still_answered(tmp_path: Path) -> None:
    reading = asyncio.Event()

    async def slow_read(namespace: str, name: str) -> Json:
        reading.set()
        await asyncio.sleep(0.3)
        return pod(name, "u-late", "1")

    async for hook in start(tmp_path, get_pod=slow_read):
        connection = await connect(hook)
        try:
            connection.writer.write(post(binding("late", "u-late")))
            await asyncio.wait_for(reading.wait(), 5)
            await hook.server.close()
            assert allowed(await connection.answer())
        finally:
            connection.writer.close()
        with pytest.raises(OSError):
            await connect(hook)


async def test_a_failure_while_judging_answers_500_and_the_next_review_is_judged(tmp_path: Path) -> None:
    async def broken_read(namespace: str, name: str) -> Json:
        raise RuntimeError("a bug in the pod read")

    async for hook in start(tmp_path, get_pod=broken_read):
        answers, _closed = await exchange(hook, post(binding("unindexed", "u-unindexed")), watch=0)
        assert answers[0][0] == 500
        answers, _closed = await exchange(hook, post(binding("small", "u-small")), watch=0)
        assert allowed(answers[0])


async def test_status_counts_connections_and_requests(webhook: Webhook) -> None:
    await exchange(webhook, post(binding("small", "u-small")) + post(binding("big", "u-big")), answers=2, watch=0)
    await exchange(webhook, post(binding("small", "u-small")), watch=0)
    answers, _closed = await exchange(webhook, b"GET /status HTTP/1.1\r\nHost: hoss\r\n\r\n", watch=0)
    http: dict[str, Any] = json.loads(answers[0][2])["http"]
    assert http["connections_accepted"] == 3
    assert http["requests"] == 4
    assert http["connections_open"] >= 1, "the connection that asked"
