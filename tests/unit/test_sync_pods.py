"""The sync's pod half on a fakeredis ledger: a burst of pod events becomes a few batched ledger calls, the
latest event of a pod wins, a re-list supersedes queued events, and a failed write is repaired by a rebuild."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
from kubernetes_asyncio import client

from hoss.errors import LedgerUnavailable
from hoss.ledger.client import Ledger
from resolver.sync import BOUND_PODS_SELECTOR, POD_WRITE_BATCH, LedgerSync
from tests.kube_objects import Json, raw_pod
from tests.waiting import until

ROOM = {"cpu": 64000, "memory": 256 << 30, "pods": 1000}


def pod(uid: str, *, node: str | None = "n1", cpu: str = "100m", phase: str = "Running") -> Json:
    """A pod as the sync's informer sees it: bound (to n1 unless told), running."""
    return raw_pod(uid, {"cpu": cpu}, uid=uid, namespace="ns", node=node, phase=phase, generation=1)


class CountingLedger(Ledger):
    """The real ledger, counting the pod writes the sync makes."""

    def __init__(self, redis: Any) -> None:
        super().__init__(redis)
        self.calls: list[tuple[str, int]] = []
        self.fail = False

    async def bind_many(self, placements: Any) -> Any:
        self.calls.append(("bind_many", len(placements)))
        if self.fail:
            raise LedgerUnavailable("redis is down")
        return await super().bind_many(placements)

    async def release_many(self, uids: Any) -> int:
        self.calls.append(("release_many", len(uids)))
        if self.fail:
            raise LedgerUnavailable("redis is down")
        return await super().release_many(uids)

    async def bind(self, **kwargs: Any) -> None:
        raise AssertionError("the sync writes pods in batches")

    async def release(self, uid: str) -> bool:
        raise AssertionError("the sync writes pods in batches")


@pytest.fixture
async def sync(fake_redis: fakeredis.FakeAsyncRedis) -> AsyncIterator[LedgerSync]:
    api = client.ApiClient()
    ledger = CountingLedger(fake_redis)
    synced = LedgerSync(ledger=ledger, api=api, watchdog_interval_seconds=0.01)
    synced.nodes["n1"] = (ROOM, {}, "")
    await synced.rebuild()
    yield synced
    await api.close()


def counting(sync: LedgerSync) -> CountingLedger:
    assert isinstance(sync.ledger, CountingLedger)
    return sync.ledger


async def bound_uids(sync: LedgerSync) -> set[str]:
    return {entry.uid for entry in await sync.ledger.entries() if entry.state == "bound"}


def test_the_pod_informer_watches_bound_pods_only() -> None:
    assert BOUND_PODS_SELECTOR == "spec.nodeName!="


async def test_a_burst_of_pod_events_is_one_call_per_kind_and_the_latest_event_of_a_pod_wins(
    sync: LedgerSync,
) -> None:
    await sync._on_pod_list([pod("old-1"), pod("old-2")])
    await sync.rebuild()
    for i in range(10):
        await sync._on_pod_event("ADDED", pod(f"p{i}"))
        await sync._on_pod_event("MODIFIED", pod(f"p{i}"))  # a status update: nothing more to write
    await sync._on_pod_event("DELETED", pod("old-1"))
    await sync._on_pod_event("MODIFIED", pod("old-2", phase="Succeeded"))  # finished: releases
    await sync._on_pod_event("ADDED", pod("brief"))
    await sync._on_pod_event("DELETED", pod("brief"))  # gone before the flush: released, never bound
    await sync.flush_pods()
    assert counting(sync).calls == [("release_many", 3), ("bind_many", 10)]
    assert await bound_uids(sync) == {f"p{i}" for i in range(10)}
    assert set(sync.pods.by_uid) == {f"p{i}" for i in range(10)}
    await sync.flush_pods()
    assert len(counting(sync).calls) == 2, "nothing queued, nothing written"


async def test_large_bursts_are_written_in_batches(sync: LedgerSync) -> None:
    for i in range(POD_WRITE_BATCH + 5):
        await sync._on_pod_event("ADDED", pod(f"p{i}", cpu="1m"))
    await sync.flush_pods()
    assert counting(sync).calls == [("bind_many", POD_WRITE_BATCH), ("bind_many", 5)]
    assert len(await bound_uids(sync)) == POD_WRITE_BATCH + 5


async def test_the_flush_loop_applies_events_as_they_come(sync: LedgerSync) -> None:
    loop = asyncio.create_task(sync._pod_flush_loop())
    try:
        await sync._on_pod_event("ADDED", pod("a"))

        async def a_bound() -> tuple[bool, str]:
            bound = await bound_uids(sync)
            return bound == {"a"}, f"bound: {sorted(bound)}"

        await until(a_bound, timeout=10, what="the flush loop to bind a")
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_relist_supersedes_queued_events(sync: LedgerSync) -> None:
    await sync._on_pod_event("ADDED", pod("stale"))
    await sync._on_pod_list([pod("listed")])
    await sync.rebuild()
    await sync.flush_pods()
    assert counting(sync).calls == []
    assert await bound_uids(sync) == {"listed"}


async def test_a_failed_write_marks_the_ledger_stale_and_the_watchdog_rebuilds_it(sync: LedgerSync) -> None:
    ledger = counting(sync)
    ledger.fail = True
    await sync._on_pod_event("ADDED", pod("a"))
    await sync.flush_pods()
    await sync._on_pod_event("ADDED", pod("b"))
    await sync.flush_pods()
    assert ledger.calls == [("bind_many", 1)], "after a failure, writes wait for the rebuild"
    ledger.fail = False
    watchdog = asyncio.create_task(sync._watchdog_loop())
    try:
        async def both_bound() -> tuple[bool, str]:
            bound = await bound_uids(sync)
            return bound == {"a", "b"}, f"bound: {sorted(bound)}"

        await until(both_bound, timeout=10, what="the watchdog's rebuild to bind a and b")
    finally:
        watchdog.cancel()
        await asyncio.gather(watchdog, return_exceptions=True)
    assert sync.stats.rebuilds == 2


async def test_a_pod_moved_by_a_later_event_is_bound_where_it_ended(sync: LedgerSync) -> None:
    sync.nodes["n2"] = (ROOM, {}, "")
    await sync.rebuild()
    await sync._on_pod_event("ADDED", pod("a", node="n1"))
    await sync.flush_pods()
    await sync._on_pod_event("MODIFIED", pod("a", node="n2"))
    await sync.flush_pods()
    entries = {e.uid: e.node for e in await sync.ledger.entries()}
    assert entries == {"a": "n2"}


async def test_a_gone_pod_needs_no_request_and_a_status_update_costs_nothing(sync: LedgerSync) -> None:
    await sync._on_pod_event("ADDED", pod("a"))
    await sync.flush_pods()
    # A status update with the same generation and node: nothing queued (the cpu here is a marker, never parsed).
    await sync._on_pod_event("MODIFIED", pod("a", cpu="not-a-quantity"))
    assert sync._pod_changes == {}
    # Deleted or finished: released by uid alone, even when its request would not parse.
    await sync._on_pod_event("DELETED", pod("a", cpu="not-a-quantity"))
    await sync.flush_pods()
    assert counting(sync).calls == [("bind_many", 1), ("release_many", 1)]
    assert await bound_uids(sync) == set()
    assert sync.stats.malformed_pods == 0


async def test_a_label_change_rewrites_the_pods_meta_for_the_workers_index(sync: LedgerSync) -> None:
    await sync._on_pod_event("ADDED", pod("a"))
    await sync.flush_pods()
    relabelled = pod("a")
    relabelled["metadata"]["labels"] = {"app": "db"}  # labels change without a new generation
    await sync._on_pod_event("MODIFIED", relabelled)
    await sync.flush_pods()
    assert counting(sync).calls == [("bind_many", 1), ("bind_many", 1)]
    loaded = await sync.ledger.load()
    assert [(uid, node, json.loads(meta)["labels"]) for uid, node, meta in loaded.pods] == [("a", "n1", {"app": "db"})]


async def test_a_deletion_timestamp_marks_the_pods_meta_terminating_for_the_workers_index(sync: LedgerSync) -> None:
    await sync._on_pod_event("ADDED", pod("a"))
    await sync.flush_pods()
    terminating = pod("a")
    terminating["metadata"]["deletionTimestamp"] = "2026-11-23T02:00:00Z"  # set without a new generation
    await sync._on_pod_event("MODIFIED", terminating)
    await sync.flush_pods()
    assert counting(sync).calls == [("bind_many", 1), ("bind_many", 1)]
    loaded = await sync.ledger.load()
    assert [(uid, json.loads(meta).get("terminating")) for uid, _node, meta in loaded.pods] == [("a", True)]
