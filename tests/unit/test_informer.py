"""The informer loop against a scripted apiserver: it resumes every watch from the last resourceVersion it
handled (a stream the apiserver closes, a network error, an apiserver restart) and lists again only on 410 Gone
or when a handler failed."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest

from hoss.errors import HossError
from hoss.kube import client as kube
from hoss.kube.client import InformerHandlers, run_informer
from hoss.model.objects import Json


class FakeContent:
    def __init__(self, lines: list[bytes], *, hang: bool) -> None:
        self._lines = list(lines)
        self._hang = hang

    async def readany(self) -> bytes:
        """One read of the connection: here each scripted piece, which may hold several events or part of one."""
        if self._lines:
            line = self._lines.pop(0)
            if line == b"!reset":
                raise aiohttp.ClientPayloadError("connection reset by peer")
            return line
        if self._hang:
            await asyncio.sleep(3600)
        return b""


@dataclass
class FakeResponse:
    status: int
    body: bytes = b""
    lines: list[bytes] = field(default_factory=list)
    hang: bool = False

    def __post_init__(self) -> None:
        self.content = FakeContent(self.lines, hang=self.hang)

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass


def event(kind: str, name: str, version: str) -> bytes:
    obj = {"metadata": {"name": name, "resourceVersion": version}}
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


def listing(version: str, *names: str) -> FakeResponse:
    items = [{"metadata": {"name": n, "resourceVersion": version}} for n in names]
    return FakeResponse(200, orjson.dumps({"items": items, "metadata": {"resourceVersion": version}}))


Step = FakeResponse | BaseException


class ScriptedApi:
    """Answers list and watch calls from a script; records what each call asked for."""

    def __init__(self, lists: list[Step], watches: list[Step]) -> None:
        self.lists = lists
        self.watches = watches
        self.calls: list[tuple[str, str | None]] = []
        self.exhausted = asyncio.Event()

    async def __call__(self, **kwargs: Any) -> FakeResponse:
        kind = "watch" if kwargs.get("watch") else "list"
        self.calls.append((kind, kwargs.get("resource_version")))
        script = self.watches if kind == "watch" else self.lists
        if not script:
            self.exhausted.set()
            await asyncio.sleep(3600)
        step = script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step


@dataclass
class Recorder:
    lists: list[list[str]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    fail_on: str | None = None

    async def on_list(self, items: list[Json]) -> None:
        self.lists.append([i["metadata"]["name"] for i in items])

    async def on_event(self, kind: str, obj: Json) -> None:
        name = obj["metadata"]["name"]
        if name == self.fail_on:
            self.fail_on = None
            raise HossError(f"cannot handle {name}")
        self.events.append((kind, name))

    def handlers(self) -> InformerHandlers:
        return InformerHandlers(on_list=self.on_list, on_event=self.on_event)


async def run(api: ScriptedApi, recorder: Recorder, **options: Any) -> None:
    task = asyncio.create_task(
        run_informer("test", api, recorder.handlers(), max_backoff_seconds=0.01, **options)
    )
    try:
        async with asyncio.timeout(5):
            await api.exhausted.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_stream_the_apiserver_closes_is_resumed_from_the_last_resource_version() -> None:
    # "Forcing watcher close due to unresponsiveness" ends the stream like a timeout does: no error, just EOF.
    api = ScriptedApi(
        lists=[listing("10", "a")],
        watches=[
            FakeResponse(200, lines=[event("ADDED", "b", "11"), event("MODIFIED", "b", "12")]),
            FakeResponse(200, lines=[event("BOOKMARK", "", "15")]),
            FakeResponse(200, lines=[event("DELETED", "a", "16")]),
        ],
    )
    recorder = Recorder()
    await run(api, recorder)
    assert api.calls == [("list", None), ("watch", "10"), ("watch", "12"), ("watch", "15"), ("watch", "16")]
    assert recorder.lists == [["a"]]
    assert recorder.events == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]


async def test_network_errors_and_an_apiserver_restart_resume_the_watch_without_listing_again() -> None:
    api = ScriptedApi(
        lists=[listing("10")],
        watches=[
            FakeResponse(200, lines=[event("ADDED", "b", "11"), b"!reset"]),
            ConnectionRefusedError(111, "connection refused"),  # the apiserver restarting
            TimeoutError(),
            FakeResponse(200, lines=[event("ADDED", "c", "13")]),
        ],
    )
    recorder = Recorder()
    await run(api, recorder)
    assert api.calls == [("list", None), ("watch", "10"), ("watch", "11"), ("watch", "11"), ("watch", "11"),
                         ("watch", "13")]
    assert recorder.lists == [[]]
    assert recorder.events == [("ADDED", "b"), ("ADDED", "c")]


async def test_410_gone_lists_again_and_watches_from_the_new_list() -> None:
    gone = orjson.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}) + b"\n"
    api = ScriptedApi(
        lists=[listing("10", "a"), listing("50", "a", "b")],
        watches=[FakeResponse(200, lines=[event("ADDED", "x", "11"), gone]), FakeResponse(410)],
    )
    api.watches.insert(1, FakeResponse(200, lines=[]))  # an empty stream in between: no busy loop, no list
    recorder = Recorder()
    await run(api, recorder)
    assert api.calls == [("list", None), ("watch", "10"), ("list", None), ("watch", "50"), ("watch", "50"),
                         ("list", None)]
    assert recorder.lists == [["a"], ["a", "b"]]


async def test_a_stalled_stream_is_abandoned_and_resumed() -> None:
    api = ScriptedApi(
        lists=[listing("10")],
        watches=[FakeResponse(200, lines=[event("ADDED", "b", "11")], hang=True),
                 FakeResponse(200, lines=[event("ADDED", "c", "12")])],
    )
    recorder = Recorder()
    await run(api, recorder, inactivity_seconds=0.05)
    assert api.calls == [("list", None), ("watch", "10"), ("watch", "11"), ("watch", "12")]
    assert recorder.events == [("ADDED", "b"), ("ADDED", "c")]


async def test_a_failed_handler_lists_again() -> None:
    api = ScriptedApi(
        lists=[listing("10"), listing("20", "b")],
        watches=[FakeResponse(200, lines=[event("ADDED", "b", "11"), event("ADDED", "c", "12")])],
    )
    recorder = Recorder(fail_on="b")
    await run(api, recorder)
    assert api.calls == [("list", None), ("watch", "10"), ("list", None), ("watch", "20")]
    assert recorder.lists == [[], ["b"]]
    assert recorder.events == []


async def test_events_are_read_however_the_connection_splits_them() -> None:
    """Under load one read carries many events, and a large event arrives over several reads; each event is
    handled once, whole, in order, and an event cut off by the stream's end is not handled: the watch resumes from
    the last whole one."""
    first, second, third = event("ADDED", "b", "11"), event("MODIFIED", "b", "12"), event("ADDED", "c", "13")
    big = event("ADDED", "d" * 5000, "14")
    api = ScriptedApi(
        lists=[listing("10")],
        watches=[
            FakeResponse(200, lines=[first + second + third[:7], third[7:] + b"\n", big[:100], big[100:3000],
                                     big[3000:] + event("DELETED", "b", "15")[:-20]]),
            FakeResponse(200, lines=[event("DELETED", "b", "15")]),
        ],
    )
    recorder = Recorder()
    await run(api, recorder)
    assert recorder.events == [("ADDED", "b"), ("MODIFIED", "b"), ("ADDED", "c"), ("ADDED", "d" * 5000),
                               ("DELETED", "b")]
    assert api.calls == [("list", None), ("watch", "10"), ("watch", "14"), ("watch", "15")]


async def test_a_stream_that_never_ends_its_line_is_abandoned_and_resumed(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A stream sending more than an event can hold without a line end is given up (with an error, logged) and
    the watch is opened again from the last whole event, instead of buffering without bound."""
    monkeypatch.setattr(kube, "MAX_WATCH_EVENT_BYTES", 1000)
    api = ScriptedApi(
        lists=[listing("10")],
        watches=[
            FakeResponse(200, lines=[event("ADDED", "b", "11"), b"x" * 600, b"x" * 600, event("ADDED", "c", "12")]),
            FakeResponse(200, lines=[event("ADDED", "c", "12")]),
        ],
    )
    recorder = Recorder()
    await run(api, recorder)
    assert recorder.events == [("ADDED", "b"), ("ADDED", "c")]
    assert api.calls == [("list", None), ("watch", "10"), ("watch", "11"), ("watch", "12")]
    assert "watch event longer than 1000 bytes" in caplog.text


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Virtual time for the informer's retries: each wait shorter than a minute is recorded and skipped."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, result: Any = None) -> Any:
        if delay < 60:
            recorded.append(delay)
            delay = 0
        return await real_sleep(delay, result)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return recorded


async def test_failures_back_off_exponentially_to_the_cap_each_logged_once_and_progress_starts_over(
        waits: list[float], caplog: pytest.LogCaptureFixture) -> None:
    refused = ConnectionRefusedError(111, "connection refused")
    api = ScriptedApi(
        lists=[refused, refused, refused, refused, refused, listing("10")],
        watches=[FakeResponse(200, lines=[event("ADDED", "b", "11")]), TimeoutError(), OSError("reset")],
    )
    recorder = Recorder()
    task = asyncio.create_task(run_informer("test", api, recorder.handlers(), max_backoff_seconds=2.0))
    try:
        async with asyncio.timeout(5):
            await api.exhausted.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert waits == [0.5, 1.0, 2.0, 2.0, 2.0, 0.5, 1.0]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings[:2] == ["test: list failed ([Errno 111] connection refused); retrying in 0.5s",
                            "test: list failed ([Errno 111] connection refused); retrying in 1.0s"]
    assert warnings[5:] == ["test: watch from resourceVersion 11 failed (TimeoutError); retrying in 0.5s",
                            "test: watch from resourceVersion 11 failed (reset); retrying in 1.0s"]
    assert recorder.events == [("ADDED", "b")]


async def test_a_missing_crd_is_looked_for_again_until_it_is_installed(
        waits: list[float], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=kube.__name__)
    api = ScriptedApi(
        lists=[FakeResponse(404, b'{"message": "not found"}'), FakeResponse(403, b'{"message": "forbidden"}'),
               listing("1"), listing("1", "r")],
        watches=[],
    )
    absent: list[bool] = []

    async def on_missing(crd_absent: bool) -> None:
        absent.append(crd_absent)

    recorder = Recorder()
    task = asyncio.create_task(kube.run_crd_informer("reservations", api, recorder.handlers(), kind="Reservations",
                                                     recheck_seconds=30, found="CRD found", on_missing=on_missing))
    try:
        async with asyncio.timeout(5):
            await api.exhausted.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert absent == [True, False]
    assert waits == [30, 30]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "cannot list Reservations: 403: forbidden"]
    assert "CRD found" in caplog.text
    assert recorder.lists == [["r"]]
