"""A pending pod that changes while a worker holds it, on a real redis-server: the dispatcher's rounds fed with the
pod's versions as its watch would see them, and a real worker (the benchmark's in-process binder) holding the pod,
which fits nowhere until room frees.

The worker's own PodScheduled=False write (a status-only change) makes no new version; a label does, and the worker
then holds one item for the pod, the newer, where the older stood (its backoff and attempts kept, as kube-scheduler
updates a queued pod in place); once room frees the pod is bound, once."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest
import redis.asyncio

from bench.pipeline import BOUND_KEY, node_object, prepare_ledger, run_worker, worker_settings
from dev.local.plane import POLICIES_FILE
from hoss.ledger.client import Ledger
from hoss.queue import WorkQueue, queue_key
from tests.integration.dispatching import make_dispatcher
from tests.waiting import until
from workers.core import Worker

pytestmark = pytest.mark.integration

BACKOFF_SECONDS = 5.0
"""The worker's first backoff: long enough that the versions arrive while the pod waits out its first retry."""


def pod_at(version: str, *, labels: dict[str, str] | None = None, unschedulable: bool = False) -> dict[str, Any]:
    """Pod ``big`` (4 cpu) at resourceVersion `version`; with `unschedulable`, the condition its worker wrote."""
    conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                   "message": "0/1 nodes are available: 1 Insufficient cpu."}] if unschedulable else []
    return {"metadata": {"name": "big", "namespace": "team", "uid": "uid-big", "resourceVersion": version,
                         "labels": labels or {"app": "big"}},
            "spec": {"schedulerName": "hoss",
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]},
            "status": {"phase": "Pending", "conditions": conditions}}


async def test_a_waiting_pods_newer_version_takes_the_older_ones_place_with_its_backoff_and_binds_once(
    client: redis.asyncio.Redis, redis_url: str
) -> None:
    await prepare_ledger(client, [node_object("n1", cpu="8")])
    ledger = Ledger(client)
    await ledger.bind(uid="filler", pod="team/filler", node="n1", request={"cpu": 6000, "pods": 1})
    queue = WorkQueue(client)
    stop = asyncio.Event()
    started: list[Worker] = []
    task = asyncio.create_task(run_worker(
        worker_settings("w1", redis_url, str(POLICIES_FILE), backoff_initial_seconds=BACKOFF_SECONDS,
                        backoff_max_seconds=4 * BACKOFF_SECONDS), stop, prepare=started.append))
    try:
        await until(lambda: _beating(queue), timeout=30, what="the worker to beat")
        worker = started[0]
        dispatcher = await make_dispatcher(queue, [copy.deepcopy(pod_at("1"))])
        assert (await dispatcher.tick()).dispatched == 1

        async def attempts(count: int) -> tuple[bool, str]:
            tried = worker.tally.counters.get("unschedulable", 0)
            return tried == count, f"{tried} unschedulable attempts"

        await until(lambda: attempts(1), timeout=30, what="the worker's first attempt")
        (waiting,) = worker.backlog.retries
        first_due = waiting.due

        # The worker's condition write, as the dispatcher's watch sees it: nothing to send.
        await dispatcher.on_event("MODIFIED", pod_at("2", unschedulable=True))
        await dispatcher.tick()
        assert await client.xlen(queue_key("w1")) == 1, "a status-only change makes no new version"

        # A label: a new version, queued behind the old one; the worker keeps the newer, where the older stood.
        await dispatcher.on_event("MODIFIED", pod_at("3", labels={"app": "big", "tier": "batch"}, unschedulable=True))
        await dispatcher.tick()

        async def superseded() -> tuple[bool, str]:
            stale, length = worker.tally.counters.get("stale", 0), await client.xlen(queue_key("w1"))
            return (stale, length) == (1, 1), f"{stale} stale, {length} items in the stream"

        await until(superseded, timeout=10, what="the worker to drop the older version")
        assert worker.backlog.depth == 1 and not worker.backlog.ready
        (waiting,) = worker.backlog.retries
        assert waiting.work.raw["metadata"]["resourceVersion"] == "3"
        assert waiting.due == first_due, "the newer version waits out the older's backoff"
        assert worker.attempts.count["uid-big"] == 1, "its attempts go on"
        assert worker.tally.counters["unschedulable"] == 1, "no attempt for the change"

        await until(lambda: attempts(2), timeout=3 * BACKOFF_SECONDS, what="the second attempt")
        tried_at = time.monotonic()
        assert tried_at >= first_due - 0.1, "not before the backoff ended"
        (waiting,) = worker.backlog.retries
        # doubled: 10 s +-20 %; started over it would be due within 5 s +-20 %
        assert waiting.due - tried_at > 1.2 * BACKOFF_SECONDS, "the backoff doubled: it was not reset"

        await ledger.release("filler")

        async def done() -> tuple[bool, str]:
            length = await client.xlen(queue_key("w1"))
            held, binding = worker.backlog.depth, worker.bindings.in_flight
            return (length, held, binding) == (0, 0, 0), f"{length} in the stream, {held} held, {binding} binding"

        await until(done, timeout=30, what="the pod to be bound once room freed")
        assert await client.lrange(BOUND_KEY, 0, -1) == ["uid-big n1"], "bound once"
        assert (worker.tally.counters["unschedulable"], worker.tally.counters["bound"]) == (2, 1)
    finally:
        stop.set()
        await task


async def _beating(queue: WorkQueue) -> tuple[bool, str]:
    live, _dead = await queue.workers()
    return bool(live), f"live workers {[w.id for w in live]}"
