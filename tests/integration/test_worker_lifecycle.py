"""A worker's beats and stop, on a real redis-server.

Its first heartbeat with a measured rate goes as soon as it has decided its first batch, not a heartbeat interval
later, so the dispatcher's routing (dispatcher/routing.py) stops counting every pod sent to a fresh worker as still
waiting. An idle worker's loops sleep on their events (work, retries, acknowledgements) with only a long safety
timeout, and stopping wakes them all."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

import workers.idle
from bench.pipeline import drive, node_object, pod_object, prepare_ledger, run_worker, worker_settings
from dev.local.plane import POLICIES_FILE
from hoss.queue import WorkQueue

pytestmark = pytest.mark.integration


async def test_a_fresh_worker_reports_its_rate_right_after_its_first_batch(
    client: redis.asyncio.Redis, redis_url: str
) -> None:
    await prepare_ledger(client, [node_object(f"n{i}", cpu="8") for i in range(3)])
    stop = asyncio.Event()
    # A beat every 60 s: only the beat after the first batch can carry a rate within this test.
    settings = worker_settings("w1", redis_url, str(POLICIES_FILE), heartbeat_interval_seconds=60.0,
                              heartbeat_ttl_seconds=180.0)
    task = asyncio.create_task(run_worker(settings, stop))
    try:
        run = await drive(client, [pod_object(n) for n in range(20)], expected_workers=1, timeout=60)
        assert run.bound == 20
        live, _dead = await WorkQueue(client).workers()
        assert [worker.id for worker in live] == ["w1"]
        assert live[0].decide_rate > 0, "the first batch's rate was not reported until the next interval"
    finally:
        stop.set()
        await task


async def test_stopping_an_idle_worker_wakes_its_sleeping_loops(
    client: redis.asyncio.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the loops' safety timeout at an hour, an idle worker still stops at once: stopping sets the events
    they sleep on."""
    monkeypatch.setattr(workers.idle, "IDLE_WAKE_SECONDS", 3600.0)
    await prepare_ledger(client, [node_object("n0", cpu="8")])
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(worker_settings("w1", redis_url, str(POLICIES_FILE)), stop))
    run = await drive(client, [pod_object(n) for n in range(5)], expected_workers=1, timeout=60)
    assert run.bound == 5
    await asyncio.sleep(0.5)  # every loop asleep on its event
    stop.set()
    await asyncio.wait_for(task, timeout=60)  # an hour without the wake-up
