"""The sync and a Reservation marked Available on a node without room (issue 33, item 2), on a fakeredis ledger:
it holds nothing, a Warning event on it says why (once), the audit does not take it for drift, and it holds its room
once a later audit finds that it fits."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
from kubernetes_asyncio import client

from hoss.ledger.client import Ledger
from hoss.model.objects import Json
from resolver.mirror import RESERVATION_REFUSED
from resolver.sync import LedgerSync
from tests.kube_objects import raw_pod
from tests.waiting import until

N = {"cpu": 4000, "memory": 8 << 30, "pods": 110}


class _Created:
    status = 201

    async def read(self) -> bytes:
        return b"{}"

    def release(self) -> None:
        pass


class RecordedEvents:
    """Stands in for the sync's CoreV1Api in the one call posting an event makes through it."""

    def __init__(self) -> None:
        self.events: list[Json] = []

    async def create_namespaced_event(self, namespace: str, body: Json, **_options: Any) -> _Created:
        self.events.append(body)
        return _Created()


def koordinator_reservation(node: str) -> Json:
    """A Reservation of 3 cpu, placed by Koordinator's scheduler: Available on `node`."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {"name": "train", "uid": "r-uid", "creationTimestamp": now},
        "spec": {"template": {"spec": {"schedulerName": "koord-scheduler", "containers": [
                     {"name": "main", "resources": {"requests": {"cpu": "3"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "train"}}}], "ttl": "1h"},
        "status": {"phase": "Available", "nodeName": node},
    }


@pytest.fixture
async def sync(fake_redis: fakeredis.FakeAsyncRedis) -> AsyncIterator[LedgerSync]:
    api = client.ApiClient()
    synced = LedgerSync(ledger=Ledger(fake_redis, fenced=True), api=api)
    synced.core = RecordedEvents()
    synced.nodes["n1"] = (N, {}, "")
    await synced.rebuild()
    yield synced
    await api.close()


async def cpu(sync: LedgerSync) -> int:
    return (await sync.ledger.node_usage(["n1"]))["n1"][1].get("cpu", 0)


async def test_a_reservation_on_a_full_node_holds_nothing_says_why_and_holds_its_room_once_it_fits(
    sync: LedgerSync,
) -> None:
    filler = raw_pod("filler", {"cpu": "3"}, uid="filler", namespace="ns", node="n1", phase="Running", generation=1)
    await sync._on_pod_event("ADDED", filler)
    await sync.flush_pods()
    await sync._on_reservation_event("ADDED", koordinator_reservation("n1"))
    assert await cpu(sync) == 3000, "the Reservation holds no room"
    recorded = sync.core

    def warned() -> tuple[bool, str]:
        found = [(e["type"], e["reason"], e["involvedObject"]["kind"]) for e in recorded.events]
        return found == [("Warning", RESERVATION_REFUSED, "Reservation")], str(found)

    await until(warned, timeout=5, what="one Warning event on the Reservation")
    assert "node n1, which has no room for it (cpu: 3 wanted, 1 free)" in recorded.events[0]["message"]
    assert await sync.audit() == [], "a refused Reservation is no drift"
    await sync._on_reservation_event("MODIFIED", {**koordinator_reservation("n1"), "metadata": {
        **koordinator_reservation("n1")["metadata"], "labels": {"touched": "yes"}}})
    assert await sync.audit() == []
    assert len(recorded.events) == 1, "told once per node and resource"

    await sync._on_pod_event("DELETED", filler)
    await sync.flush_pods()
    assert await sync.audit() == []
    assert await cpu(sync) == 3000, "the audit found it fits now: it holds its room"
    assert await sync.audit() == []
