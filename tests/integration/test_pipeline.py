"""Dispatcher + workers + ledger on a real redis-server, bindings into a sink: the intake without an apiserver.

Workers watch nothing: pods arrive in their work items, nodes come from the ledger and its change stream.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from bench.pipeline import SinkBinder, drive, node_object, pod_object, prepare_ledger, run_worker, worker_settings
from dev.local.plane import POLICIES_FILE
from hoss.framework.pod import PodView
from hoss.ledger.client import Ledger
from hoss.model import compact
from hoss.model.resources import node_allocatable
from tests.waiting import until

pytestmark = pytest.mark.integration


async def test_two_workers_place_every_pod_without_overselling_and_share_the_work(
    client: redis.asyncio.Redis, redis_url: str
) -> None:
    # 20 nodes of 2 cpu, 400 pods of 100m: exactly full, so any double count or lost reservation shows.
    nodes = [node_object(f"n{i:02d}", cpu="2", pods="110") for i in range(20)]
    await prepare_ledger(client, nodes)
    stop = asyncio.Event()
    workers = [asyncio.create_task(run_worker(worker_settings(f"w{i}", redis_url, str(POLICIES_FILE), seed=i),
                                              stop)) for i in (1, 2)]
    try:
        run = await drive(client, [pod_object(n) for n in range(400)], expected_workers=2, timeout=120)
    finally:
        stop.set()
        finished = await asyncio.gather(*workers)
    assert run.bound == 400
    entries = await Ledger(client).entries()
    assert len(entries) == 400 and all(e.state == "bound" for e in entries)
    per_node: dict[str, int] = {}
    for entry in entries:
        per_node[entry.node] = per_node.get(entry.node, 0) + entry.request["cpu"]
    allocatable = {n["metadata"]["name"]: node_allocatable(n)["cpu"] for n in nodes}
    assert all(per_node[name] <= allocatable[name] for name in per_node), per_node
    assert sum(per_node.values()) == 400 * 100
    bound = [w.counters["bound"] for w in finished]
    assert sum(bound) == 400 and min(bound) > 0, bound


async def test_a_worker_follows_node_changes_from_the_ledger_without_watching(
    client: redis.asyncio.Redis, redis_url: str
) -> None:
    await prepare_ledger(client, [node_object("small", cpu="1")])
    stop = asyncio.Event()
    worker_task = asyncio.create_task(run_worker(worker_settings("w1", redis_url, str(POLICIES_FILE)), stop))
    try:
        # 3 pods of 600m: one fits on "small"; a node added through the ledger (as the sync adds it) takes more.
        driving = asyncio.create_task(drive(client, [pod_object(n, cpu="600m") for n in range(3)],
                                            expected_workers=1, timeout=60))
        async def one_on_small() -> tuple[bool, str]:
            nodes = [entry.node for entry in await Ledger(client).entries()]
            return nodes == ["small"], f"entries on {nodes}"

        await until(one_on_small, timeout=60, what="the one pod that fits to be placed on small")
        big = node_object("big", cpu="4")
        await Ledger(client).sync_node(node="big", allocatable=node_allocatable(big), labels={},
                                       spec=compact.encode(compact.compact_node(big)).decode())
        run = await driving
    finally:
        stop.set()
        await worker_task
    assert run.bound == 3
    nodes = sorted(e.node for e in await Ledger(client).entries())
    assert nodes == ["big", "big", "small"]


async def test_a_binding_that_fails_unexpectedly_is_tried_again_and_no_pod_is_lost(
    client: redis.asyncio.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a binder raises (here a RuntimeError for every third pod's first attempt, beside 150 pods in flight
    through a pool of Redis connections smaller than the bindings in flight), the pod is released and placed again:
    every pod ends bound exactly once and the worker counts the errors."""
    failed: set[str] = set()

    class FlakyBinder(SinkBinder):
        async def bind(self, pod: PodView, node: str) -> None:
            if int(pod.name.rsplit("-", 1)[1]) % 3 == 0 and pod.uid not in failed:
                failed.add(pod.uid)
                raise RuntimeError(f"binder broke on {pod.key}")
            await super().bind(pod, node)

    monkeypatch.setattr("bench.pipeline.SinkBinder", FlakyBinder)
    monkeypatch.setattr("workers.connections.REDIS_CONNECTIONS", 8)
    await prepare_ledger(client, [node_object(f"n{i:02d}", cpu="8", pods="110") for i in range(10)])
    stop = asyncio.Event()
    settings = worker_settings("w1", redis_url, str(POLICIES_FILE), backoff_initial_seconds=0.05,
                               max_binds_in_flight=150, binds_in_flight_budget=0)
    worker = asyncio.create_task(run_worker(settings, stop))
    try:
        run = await drive(client, [pod_object(n) for n in range(300)], expected_workers=1, timeout=120)
    finally:
        stop.set()
        finished = await worker
    assert len(failed) == 100
    assert run.bound == 300, "every pod is bound, those whose binding broke included"
    entries = await Ledger(client).entries()
    assert len(entries) == 300 and all(e.state == "bound" for e in entries)
    assert finished.counters["errors"] == 100 and finished.counters["bound"] == 300
