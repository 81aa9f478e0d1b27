"""HTTP extenders: a real in-process extender server filters and prioritises; slow and broken ones are handled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from hoss.framework.cycle import ExtenderConfig, FilterPlugin, Placement, Profile, Unschedulable, decide
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.binpack import MostAllocated
from hoss.framework.plugins.fit import NodeResourcesFit
from hoss.framework.pod import parse_pod
from tests.kube_objects import Json, raw_node, raw_pod, table
from workers.extender import decide_with_extenders

FILTERS: list[FilterPlugin] = [NodeResourcesFit()]
NODE = {"cpu": "8", "memory": "32Gi", "pods": "110"}


@dataclass
class FakeExtender:
    """An extender server: rejects `rejected` nodes, gives `priorities`, or misbehaves as told."""

    base: str = ""
    rejected: dict[str, str] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)
    delay: float = 0.0
    status: int = 200
    error: str = ""
    answer_with_nodes: bool = False
    calls: list[tuple[str, Json]] = field(default_factory=list)

    async def filter(self, request: web.Request) -> web.Response:
        body = await self._receive("filter", request)
        if self.status != 200:
            return web.Response(status=self.status, text="extender broke")
        names = body["NodeNames"] if "NodeNames" in body else [n["metadata"]["name"] for n in body["Nodes"]["items"]]
        kept = [name for name in names if name not in self.rejected]
        failed = {name: reason for name, reason in self.rejected.items() if name in names}
        result: Json = {"FailedNodes": failed, "FailedAndUnresolvableNodes": {}, "Error": self.error}
        if self.answer_with_nodes:
            result["Nodes"] = {"items": [{"metadata": {"name": name}} for name in kept]}
        else:
            result["NodeNames"] = kept
        return web.json_response(result)

    async def prioritize(self, request: web.Request) -> web.Response:
        body = await self._receive("prioritize", request)
        if self.status != 200:
            return web.Response(status=self.status, text="extender broke")
        names = body.get("NodeNames") or [n["metadata"]["name"] for n in body["Nodes"]["items"]]
        return web.json_response([{"Host": name, "Score": self.priorities.get(name, 0)} for name in names])

    async def _receive(self, verb: str, request: web.Request) -> Json:
        body: Json = await request.json()
        self.calls.append((verb, body))
        if self.delay:
            await asyncio.sleep(self.delay)
        return body

    def config(self, **settings: Any) -> ExtenderConfig:
        return ExtenderConfig.model_validate(
            {"urlPrefix": self.base, "filterVerb": "filter", "prioritizeVerb": "prioritize", **settings}
        )


@pytest.fixture
async def extender() -> AsyncIterator[FakeExtender]:
    fake = FakeExtender()
    app = web.Application()
    app.router.add_post("/scheduler/filter", fake.filter)
    app.router.add_post("/scheduler/prioritize", fake.prioritize)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    fake.base = f"http://{host}:{port}/scheduler"
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


def cluster() -> NodeTable:
    """Three nodes; bin-packing ranks a (fullest) > b > c."""
    nodes = table(*(raw_node(name, NODE, labels={"zone": name.upper()}) for name in "abc"))
    nodes.set_used("a", {"cpu": 6000})
    nodes.set_used("b", {"cpu": 3000})
    return nodes


def profile(*extenders: ExtenderConfig) -> Profile:
    return Profile(name="ext", filters=FILTERS, scores=[(MostAllocated.from_args({}), 1)], extenders=extenders)


async def run(
    extenders: tuple[ExtenderConfig, ...], session: aiohttp.ClientSession, *, cpu: str = "1"
) -> tuple[Placement | Unschedulable, Placement | Unschedulable]:
    """The decision with the extenders, and the plain decision without them, with the same seed."""
    raw = raw_pod(requests={"cpu": cpu, "memory": "1Gi"})
    nodes = cluster()
    with_extenders = await decide_with_extenders(
        profile(*extenders), parse_pod(raw), raw, nodes, rng=np.random.default_rng(0), top=8, session=session
    )
    plain = decide(profile(), parse_pod(raw), nodes, rng=np.random.default_rng(0), top=8)
    return with_extenders, plain


async def test_extender_filter_and_priorities_change_the_placement(
    extender: FakeExtender, session: aiohttp.ClientSession
) -> None:
    extender.rejected = {"a": "node(s) had no licence"}
    extender.priorities = {"c": 10}

    decision, plain = await run((extender.config(weight=5, nodeCacheCapable=True),), session)

    assert isinstance(plain, Placement)
    assert plain.candidates == ["a", "b", "c"]
    assert isinstance(decision, Placement)
    # c: MostAllocated (cpu 1/8, memory 1/32 -> 7.8125) + priority 10 * weight 5 * 10 = 507.8125; a is gone.
    assert decision.candidates == ["c", "b"]
    assert decision.scores[0] == pytest.approx(507.8125)
    verbs = [(verb, body.get("NodeNames")) for verb, body in extender.calls]
    assert verbs == [("filter", ["a", "b", "c"]), ("prioritize", ["b", "c"])]
    assert extender.calls[0][1]["Pod"]["metadata"]["name"] == "web-0"


async def test_extender_without_node_cache_gets_a_minimal_node_list(
    extender: FakeExtender, session: aiohttp.ClientSession
) -> None:
    extender.answer_with_nodes = True
    extender.rejected = {"b": "node(s) were busy"}

    decision, _ = await run((extender.config(prioritizeVerb=""),), session)

    assert isinstance(decision, Placement)
    assert decision.candidates == ["a", "c"]
    [(verb, body)] = extender.calls
    assert verb == "filter"
    assert "NodeNames" not in body
    assert body["Nodes"]["items"][0] == {"metadata": {"name": "a", "labels": {"zone": "A"}}}


async def test_extender_rejections_join_the_unschedulable_message(
    extender: FakeExtender, session: aiohttp.ClientSession
) -> None:
    extender.rejected = {"b": "node(s) had no licence", "c": "node(s) had no licence"}

    decision, _ = await run((extender.config(),), session, cpu="4")

    assert isinstance(decision, Unschedulable)
    assert decision.message == "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had no licence."
    assert [verb for verb, _ in extender.calls] == ["filter"]


async def test_slow_ignorable_extender_does_not_stop_scheduling(
    extender: FakeExtender, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    extender.delay = 2.0
    extender.rejected = {"a": "node(s) had no licence"}

    with caplog.at_level(logging.WARNING, logger="workers.extender"):
        decision, plain = await run((extender.config(ignorable=True, timeoutSeconds=0.2),), session)

    assert decision == plain
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2  # one line per failed call: filter and prioritize
    assert "failed on filter: no answer within 0.2s" in warnings[0]
    assert "web-0" in warnings[0]


async def test_slow_required_extender_makes_the_pod_unschedulable_naming_it(
    extender: FakeExtender, session: aiohttp.ClientSession
) -> None:
    extender.delay = 2.0

    decision, _ = await run((extender.config(timeoutSeconds=0.2),), session)

    assert isinstance(decision, Unschedulable)
    assert decision.message == f"extender {extender.base} failed on filter: no answer within 0.2s"


async def test_broken_required_prioritizer_makes_the_pod_unschedulable(
    extender: FakeExtender, session: aiohttp.ClientSession
) -> None:
    extender.status = 500

    decision, _ = await run((extender.config(filterVerb=""),), session)

    assert isinstance(decision, Unschedulable)
    assert decision.message == f"extender {extender.base} failed on prioritize: HTTP 500: extender broke"


async def test_extender_reporting_an_error_fails_with_its_text(
    extender: FakeExtender, session: aiohttp.ClientSession
) -> None:
    extender.error = "licence server unreachable"

    decision, _ = await run((extender.config(),), session)

    assert isinstance(decision, Unschedulable)
    assert decision.message == f"extender {extender.base} failed on filter: licence server unreachable"


async def test_unreachable_ignorable_extender_is_skipped(session: aiohttp.ClientSession) -> None:
    gone = ExtenderConfig.model_validate({"urlPrefix": "http://127.0.0.1:9/none", "filterVerb": "f", "ignorable": True})

    decision, plain = await run((gone,), session)

    assert decision == plain


async def test_profile_without_extenders_decides_exactly_like_decide(
    extender: FakeExtender, session: aiohttp.ClientSession
) -> None:
    decision, plain = await run((), session)

    assert decision == plain
    assert extender.calls == []


async def test_extender_cannot_add_nodes_the_plugins_rejected(
    extender: FakeExtender, session: aiohttp.ClientSession
) -> None:
    extender.priorities = {"a": 10}

    # 3 cpus do not fit on a (6 of 8 used); the prioritizer's love for a changes nothing.
    decision, _ = await run((extender.config(filterVerb=""),), session, cpu="3")

    assert isinstance(decision, Placement)
    assert decision.candidates == ["b", "c"]
    [(_, body)] = extender.calls
    assert [item["metadata"]["name"] for item in body["Nodes"]["items"]] == ["b", "c"]
