"""A worker's kube-scheduler metrics after real work, on a real redis-server: a dispatcher sends pods, the worker
decides, reserves and binds them (the benchmark's in-process binder), and its registry counts each pod's attempt,
its end-to-end time from the dispatcher's queue, its binding and the empty queues after."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from bench.pipeline import drive, node_object, pod_object, prepare_ledger, run_worker, worker_settings
from dev.local.plane import POLICIES_FILE
from workers.core import Worker

pytestmark = pytest.mark.integration


async def test_every_bound_pod_counts_one_scheduled_attempt_an_end_to_end_time_and_a_binding(
    client: redis.asyncio.Redis, redis_url: str
) -> None:
    await prepare_ledger(client, [node_object(f"n{i}", cpu="8") for i in range(3)])
    stop = asyncio.Event()
    started: list[Worker] = []
    task = asyncio.create_task(run_worker(worker_settings("w1", redis_url, str(POLICIES_FILE)), stop,
                                          prepare=started.append))
    try:
        run = await drive(client, [pod_object(n) for n in range(30)], expected_workers=1, timeout=60)
        assert run.bound == 30
    finally:
        stop.set()
        await task
    registry = started[0].tally.registry

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert value("scheduler_schedule_attempts_total", result="scheduled", profile="default") == 30
    assert value("scheduler_scheduling_attempt_duration_seconds_count", result="scheduled", profile="default") == 30
    assert value("scheduler_schedule_attempts_total", result="unschedulable", profile="default") == 0
    # Each pod was sent with the time the dispatcher first saw it: every end-to-end time is known, none negative.
    assert value("scheduler_pod_scheduling_sli_duration_seconds_count", attempts="1") == 30
    assert value("scheduler_pod_scheduling_sli_duration_seconds_sum", attempts="1") > 0
    assert value("scheduler_framework_extension_point_duration_seconds_count", extension_point="Bind",
                 status="Success", profile="default") == 30
    assert {queue: value("scheduler_pending_pods", queue=queue) for queue in ("active", "backoff", "unschedulable")} \
        == {"active": 0, "backoff": 0, "unschedulable": 0}
    assert value("hoss_worker_last_heartbeat_timestamp_seconds") > 0
