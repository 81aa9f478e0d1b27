"""EventSink against a real in-process HTTPS server: events are posted off the caller's path, the queue bound drops
and counts, close() flushes, a failing apiserver never reaches the caller, and concurrency and rate are bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from hoss.kube import protobuf
from hoss.kube.events import EventSink, TokenBucket, scheduled_event
from hoss.kube.rest import KubeREST
from tests.unit.tls_apiserver import Seen, TLSApiserver, status
from tests.waiting import until


class Clock:
    """A clock that moves only when told, and counts how often it is read."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


RECORDED: dict[bytes, str] = {}
"""The pod name of every event made here, by its protobuf body (unique: an event's name ends in a random suffix)."""


def event(index: int) -> dict[str, object]:
    body = scheduled_event(namespace="team", name=f"web-{index}", uid=f"uid-{index}", node="n1",
                           component="hoss-worker")
    RECORDED[protobuf.event(body)] = f"web-{index}"
    return body


def names(server: TLSApiserver) -> list[str]:
    """The pods of the events the server received, each posted exactly as one recorded here."""
    return [RECORDED[seen.body] for seen in server.seen]


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[TLSApiserver]:
    server = TLSApiserver(tmp_path)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def rest(apiserver: TLSApiserver) -> AsyncIterator[KubeREST]:
    async with await KubeREST.connect(str(apiserver.kubeconfig())) as client:
        yield client


async def test_recorded_events_are_posted_and_counted(apiserver: TLSApiserver, rest: KubeREST) -> None:
    async with EventSink(rest) as sink:
        for index in range(20):
            sink.record(event(index))
        await until(lambda: sink.posted == 20, timeout=10, what="20 events to be posted")
    assert (sink.posted, sink.failed, sink.dropped) == (20, 0, 0)
    assert sorted(names(apiserver)) == sorted(f"web-{index}" for index in range(20))
    assert {(seen.method, seen.raw_path) for seen in apiserver.seen} == {("POST", "/api/v1/namespaces/team/events")}


async def test_a_full_queue_drops_and_counts_without_blocking(apiserver: TLSApiserver, rest: KubeREST) -> None:
    sink = EventSink(rest, max_queued=3)
    for index in range(5):
        sink.record(event(index))
    assert (sink.queued, sink.dropped) == (3, 2)

    sink.start()
    await sink.close(timeout=30)
    assert (sink.posted, sink.failed, sink.dropped) == (3, 0, 2)
    assert sorted(names(apiserver)) == ["web-0", "web-1", "web-2"]


async def test_close_flushes_what_is_queued(apiserver: TLSApiserver, rest: KubeREST) -> None:
    sink = EventSink(rest, concurrency=4)
    sink.start()
    for index in range(200):
        sink.record(event(index))
    await sink.close(timeout=60)
    assert (sink.posted, sink.failed, sink.dropped, sink.queued) == (200, 0, 0, 0)
    assert len(apiserver.seen) == 200


async def test_events_left_when_close_times_out_and_events_after_close_are_dropped_and_counted(
    apiserver: TLSApiserver, rest: KubeREST
) -> None:
    never = asyncio.Event()

    async def hang(seen: Seen) -> web.StreamResponse:
        await never.wait()
        return web.Response(status=201)

    apiserver.respond = hang
    sink = EventSink(rest, concurrency=2)
    sink.start()
    for index in range(5):
        sink.record(event(index))
    await until(lambda: apiserver.in_flight == 2, timeout=10, what="two posts in flight")
    await sink.close(timeout=0)
    sink.record(event(99))
    assert (sink.posted, sink.failed, sink.dropped) == (0, 0, 6)
    never.set()


async def test_a_failing_apiserver_never_reaches_the_caller_and_is_logged_at_most_once_per_interval(
    apiserver: TLSApiserver, rest: KubeREST, caplog: pytest.LogCaptureFixture
) -> None:
    async def refuse(seen: Seen) -> web.StreamResponse:
        return status(403, 'events is forbidden: User "hoss-worker" cannot create resource "events"')

    apiserver.respond = refuse
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="hoss.kube.events"):
        async with EventSink(rest, clock=clock) as sink:
            for index in range(10):
                sink.record(event(index))
            await until(lambda: sink.failed == 10, timeout=10, what="10 failed posts")
            clock.advance(10.0)
            sink.record(event(10))
            await until(lambda: sink.failed == 11, timeout=10, what="11 failed posts")
    assert (sink.posted, sink.failed, sink.dropped) == (0, 11, 0)
    assert len(apiserver.seen) == 11, "a failed post is not retried"
    messages = [record.getMessage() for record in caplog.records if record.name == "hoss.kube.events"]
    assert len(messages) == 2
    assert messages[0].startswith("cannot record Scheduled on web-")
    assert "403: events is forbidden" in messages[0]
    assert messages[1].endswith("(9 more failed posts not logged)")


async def test_an_unreachable_apiserver_counts_failures(apiserver: TLSApiserver, rest: KubeREST) -> None:
    await apiserver.stop()
    async with EventSink(rest) as sink:
        for index in range(3):
            sink.record(event(index))
        await until(lambda: sink.failed == 3, timeout=10, what="3 failed posts")
    assert (sink.posted, sink.failed, sink.dropped) == (0, 3, 0)


async def test_an_event_without_a_namespace_fails_alone(apiserver: TLSApiserver, rest: KubeREST) -> None:
    async with EventSink(rest, concurrency=1) as sink:
        sink.record({"metadata": {}})
        sink.record(event(1))
        await until(lambda: sink.posted + sink.failed == 2, timeout=10, what="both events to be posted or failed")
    assert (sink.posted, sink.failed) == (1, 1)


async def test_at_most_concurrency_posts_are_in_flight(apiserver: TLSApiserver, rest: KubeREST) -> None:
    gate = asyncio.Event()

    async def held(seen: Seen) -> web.StreamResponse:
        await gate.wait()
        return web.Response(status=201, body=b"{\"kind\": \"Event\"}", content_type="application/json")

    apiserver.respond = held
    async with EventSink(rest, concurrency=3) as sink:
        for index in range(12):
            sink.record(event(index))
        # Three posts held at the server and the nine others still queued: no fourth poster took one.
        await until(lambda: apiserver.in_flight == 3 and sink.queued == 9, timeout=10,
                    what="three posts in flight and nine queued")
        gate.set()
        await until(lambda: sink.posted == 12, timeout=10, what="12 events to be posted")
    assert apiserver.max_in_flight == 3


async def refused_again(clock: Clock, times: int = 10) -> None:
    """Wait until the posting workers have read the (frozen) clock ``times`` more times: asked for a token, and
    been refused, again and again."""
    reads = clock.reads
    await until(lambda: clock.reads >= reads + times, timeout=10, what=f"the token bucket to be asked {times} times")


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(5.0, 5, clock=clock)
    assert [bucket.take() for _ in range(5)] == [0.0] * 5
    assert bucket.take() == pytest.approx(0.2)
    clock.advance(0.2)
    assert bucket.take() == 0.0
    assert bucket.take() > 0
    clock.advance(100.0)
    taken = sum(bucket.take() == 0.0 for _ in range(20))
    assert taken == 5, "the bucket holds at most its burst"
    assert TokenBucket(0.0, clock=clock).take() == 0.0, "rate 0 is unlimited"


async def test_the_rate_limit_bounds_posts_until_the_bucket_refills(apiserver: TLSApiserver, rest: KubeREST) -> None:
    clock = Clock()
    async with EventSink(rest, per_second=50.0, burst=3, clock=clock) as sink:
        for index in range(10):
            sink.record(event(index))
        await until(lambda: sink.posted == 3, timeout=10, what="the burst of 3 to be posted")
        await refused_again(clock)
        assert sink.posted == 3
        clock.advance(2.5 / 50)  # two tokens and a half
        await until(lambda: sink.posted == 5, timeout=10, what="two more posts")
        await refused_again(clock)
        assert sink.posted == 5
        clock.advance(1.0)
        await until(lambda: sink.posted == 8, timeout=10, what="a burst of 3 more posts")
        await refused_again(clock)
        assert sink.posted == 8, "a long pause refills the bucket to its burst, no more"
        clock.advance(1.0)
        await until(lambda: sink.posted == 10, timeout=10, what="the last two posts")
    assert (sink.posted, sink.failed, sink.dropped) == (10, 0, 0)
    assert len(apiserver.seen) == 10
