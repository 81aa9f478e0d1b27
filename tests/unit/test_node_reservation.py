"""Node-level reserved resources (Koordinator's ``node.koordinator.sh/reservation`` annotation): what it keeps
back is taken off the node's allocatable for the ledger (sync) and for the workers (compact node), and a malformed
value is ignored with a Warning event on the node naming it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
from kubernetes_asyncio import client

from hoss.errors import NodeSpecError
from hoss.framework.node import parse_node
from hoss.ledger.client import Ledger
from hoss.model import compact
from hoss.model.resources import NODE_RESERVATION_ANNOTATION, node_allocatable, node_reservation
from resolver import sync as sync_module
from resolver.sync import LedgerSync
from tests.waiting import until


def node(name: str = "n1", annotation: object = None, *, cpu: str = "8") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if annotation is not None:
        metadata["annotations"] = {NODE_RESERVATION_ANNOTATION: annotation}
    return {"metadata": metadata, "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"}}}


def test_the_annotation_is_taken_off_allocatable() -> None:
    reserved = node(annotation=json.dumps({"resources": {"cpu": "5", "memory": "4Gi"}}))
    assert node_reservation(reserved) == {"cpu": 5000, "memory": 4 << 30}
    assert node_allocatable(reserved) == {"cpu": 3000, "memory": 12 << 30, "pods": 110}


def test_more_than_allocatable_leaves_zero_and_reserved_cpus_count_as_cpus() -> None:
    assert node_allocatable(node(annotation='{"resources": {"cpu": "20"}}'))["cpu"] == 0
    # Koordinator: a reservedCPUs cpuset wins over resources.cpu.
    cpuset = node(annotation='{"resources": {"cpu": "1"}, "reservedCPUs": "0-2,6"}')
    assert node_reservation(cpuset) == {"cpu": 4000}
    assert node_allocatable(cpuset)["cpu"] == 4000


def test_no_annotation_is_no_reservation() -> None:
    assert node_reservation(node()) == {}
    assert node_allocatable(node())["cpu"] == 8000


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{cpu: 5", "not JSON"),
        ('["cpu"]', "expected a JSON object"),
        ('{"resources": {"cpu": "five"}}', "resources.cpu: invalid 'five'"),
        ('{"resources": {"cpu": "-1"}}', "must not be negative"),
        ('{"resources": "cpu=5"}', "resources"),
        ('{"reservedCPUs": "0-x"}', "reservedCPUs '0-x' is not a cpuset"),
    ],
)
def test_a_malformed_annotation_is_named_and_ignored(value: str, says: str) -> None:
    bad = node(annotation=value)
    with pytest.raises(NodeSpecError) as raised:
        node_reservation(bad)
    message = str(raised.value)
    assert NODE_RESERVATION_ANNOTATION in message and says in message and repr(value)[:40] in message
    assert node_allocatable(bad)["cpu"] == 8000


def test_workers_see_the_reduced_allocatable_through_the_compact_node() -> None:
    reserved = node(annotation='{"resources": {"cpu": "5"}}')
    view = parse_node(compact.decode(compact.encode(compact.compact_node(reserved))))
    assert view.allocatable["cpu"] == 3000
    # Other annotations stay out of the compact form (they would change its digest for nothing).
    other = node()
    other["metadata"]["annotations"] = {"x": "y"}
    assert "annotations" not in compact.compact_node(other)["metadata"]


@pytest.fixture
async def sync(monkeypatch: pytest.MonkeyPatch,
               fake_redis: fakeredis.FakeAsyncRedis) -> AsyncIterator[tuple[LedgerSync, list[dict[str, Any]]]]:
    posted: list[dict[str, Any]] = []

    async def record(core: Any, event: dict[str, Any]) -> None:
        posted.append(event)

    monkeypatch.setattr(sync_module, "post_event", record)
    api = client.ApiClient()
    synced = LedgerSync(ledger=Ledger(fake_redis), api=api)
    await synced._on_node_list([node("n1"), node("n2")])
    await synced.rebuild()
    yield synced, posted
    await api.close()


async def test_the_sync_writes_the_reduced_allocatable_and_warns_once_per_bad_value(
    sync: tuple[LedgerSync, list[dict[str, Any]]],
) -> None:
    synced, posted = sync
    await synced._on_node_event("MODIFIED", node("n1", '{"resources": {"cpu": "5"}}'))
    snapshot = await synced.ledger.snapshot()
    assert snapshot.nodes["n1"].alloc["cpu"] == 3000
    assert snapshot.nodes["n2"].alloc["cpu"] == 8000

    await synced._on_node_event("MODIFIED", node("n2", '{"resources": {"cpu": "lots"}}'))
    await synced._on_node_event("MODIFIED", node("n2", '{"resources": {"cpu": "lots"}}', cpu="7"))
    await until(lambda: bool(posted), timeout=10, what="the warning about the bad value")
    assert (await synced.ledger.snapshot()).nodes["n2"].alloc["cpu"] == 7000  # ignored, not crashed
    event = posted[0]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n2", "uid": "uid-n2"}
    assert event["type"] == "Warning" and event["reason"] == "InvalidNodeReservation"
    assert "'lots'" in event["message"] and NODE_RESERVATION_ANNOTATION in event["message"]

    # Fixed, then broken again: warned again. The audit finds the ledger equal to the apiserver throughout.
    await synced._on_node_event("MODIFIED", node("n2", '{"resources": {"cpu": "1"}}'))
    await synced._on_node_event("MODIFIED", node("n2", "nope"))
    await until(lambda: len(posted) >= 2, timeout=10, what="the warning about the next bad value")
    # The same bad value seen twice was warned about once: a second warning would have come before this one.
    assert len(posted) == 2 and "'lots'" not in posted[1]["message"], posted
    assert await synced.audit() == []


async def test_a_rebuild_keeps_the_reduction(sync: tuple[LedgerSync, list[dict[str, Any]]]) -> None:
    synced, _ = sync
    await synced._on_node_list([node("n1", '{"resources": {"cpu": "2"}}'), node("n2")])
    await synced.rebuild()
    assert (await synced.ledger.snapshot()).nodes["n1"].alloc["cpu"] == 6000
