"""Fixtures shared by the unit tests: a fakeredis of the test's own (its Lua runs the ledger's real scripts) and a
ready ledger on it.

`ledger` is rebuilt with the nodes of `ledger_nodes` and the bound pods of `ledger_bound`; a module whose tests
need other nodes or pods overrides those two fixtures (rows made with `tests.kube_objects.node_row`), not `ledger`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import fakeredis
import pytest

from hoss.ledger.arguments import BoundPod, NodeRow
from hoss.ledger.client import Ledger
from tests.kube_objects import node_row


@pytest.fixture
def fake_server() -> fakeredis.FakeServer:
    """The test's own fakeredis server (``connected = False`` takes it down)."""
    return fakeredis.FakeServer()


@pytest.fixture
async def fake_redis(fake_server: fakeredis.FakeServer) -> AsyncIterator[fakeredis.FakeAsyncRedis]:
    """A client (decode_responses) on `fake_server`, closed after the test."""
    client = fakeredis.FakeAsyncRedis(server=fake_server, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    """The nodes `ledger` starts with: n1 and n2, 4 cpu, 8 GiB and 110 pods each, described."""
    return [node_row("n1"), node_row("n2")]


@pytest.fixture
def ledger_bound() -> list[BoundPod]:
    """The pods bound when `ledger` is rebuilt: none."""
    return []


@pytest.fixture
async def ledger(fake_redis: fakeredis.FakeAsyncRedis, ledger_nodes: list[NodeRow],
                 ledger_bound: list[BoundPod]) -> Ledger:
    """A ready ledger on `fake_redis`, rebuilt with `ledger_nodes` and `ledger_bound`, nothing reserved."""
    ready = Ledger(fake_redis)
    await ready.rebuild(nodes=ledger_nodes, bound=ledger_bound)
    return ready
