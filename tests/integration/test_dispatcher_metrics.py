"""The dispatcher's metrics on a real redis-server: when each pod entered hoss's queue (carried to the worker for
kube-scheduler's end-to-end duration; a gated pod's queue time starts when its last gate goes), routing and backlog
per worker, gated pods and the age of the oldest pending pod."""

from __future__ import annotations

import copy
import random

import pytest

from dispatcher.core import Dispatcher
from hoss.queue import WorkQueue
from tests.integration.dispatching import beat, pending_pod, settings, stream_items

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def dispatcher_at(queue: WorkQueue, wall: Clock) -> Dispatcher:
    return Dispatcher(queue=queue, settings=settings(), rng=random.Random(3), clock=Clock(50.0), wall=wall)


def value(dispatcher: Dispatcher, name: str, **labels: str) -> float | None:
    return dispatcher.metrics.registry.get_sample_value(name, labels)


async def test_a_work_item_carries_when_its_pod_entered_the_queue_and_a_gated_pod_enters_when_ungated(
    queue: WorkQueue
) -> None:
    wall = Clock(1000.0)
    dispatcher = dispatcher_at(queue, wall)
    gated = pending_pod(2)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    await dispatcher.on_list([pending_pod(1), copy.deepcopy(gated)])
    dispatcher.synced.set()
    await beat(queue, "w")
    wall.now = 1004.0
    relabelled = pending_pod(1)
    relabelled["metadata"]["labels"] = {"team": "a"}
    await dispatcher.on_event("MODIFIED", relabelled)  # a change of the pod keeps its queue time
    await dispatcher.tick()
    wall.now = 1010.0
    del gated["spec"]["schedulingGates"]
    await dispatcher.on_event("MODIFIED", gated)
    assert await dispatcher.dispatch_pending(fresh_only=True) == 1
    assert {item.uid: item.queued_unix for item in await stream_items(queue, "w")} == \
        {"uid-1": 1000.0, "uid-2": 1010.0}


async def test_routing_and_backlog_are_shown_per_worker_while_it_lives(queue: WorkQueue) -> None:
    dispatcher = Dispatcher(queue=queue, settings=settings(), rng=random.Random(3))  # the heartbeats' clock
    await dispatcher.on_list([pending_pod(n) for n in range(5)])
    dispatcher.synced.set()
    # w1 has 2 pods ready that it decides at 1 a second; w2 is idle. The busier worker that keeps up gets them all.
    await beat(queue, "w1", ready=2, decide_rate=1.0)
    await beat(queue, "w2")
    assert (await dispatcher.tick()).dispatched == 5
    assert value(dispatcher, "hoss_dispatcher_pods_routed_total", worker="w1") == 5
    assert value(dispatcher, "hoss_dispatcher_pods_routed_total", worker="w2") == 0
    assert value(dispatcher, "hoss_dispatcher_worker_assigned_pods", worker="w1") == 5
    backlog = value(dispatcher, "hoss_dispatcher_worker_backlog", worker="w1")
    assert backlog is not None and 6 <= backlog <= 7  # 2 ready + 5 sent, less what it decided since its beat
    assert value(dispatcher, "hoss_dispatcher_worker_backlog", worker="w2") == 0
    age = value(dispatcher, "hoss_dispatcher_worker_heartbeat_age_seconds", worker="w1")
    assert age is not None and 0 <= age < 5
    # w2 is gone: its series end with it.
    await queue.deregister("w2")
    await dispatcher.tick()
    assert value(dispatcher, "hoss_dispatcher_pods_routed_total", worker="w2") is None
    assert value(dispatcher, "hoss_dispatcher_worker_backlog", worker="w2") is None
    assert value(dispatcher, "hoss_dispatcher_pods_routed_total", worker="w1") == 5


async def test_gated_pods_and_the_oldest_pending_pod_are_shown(queue: WorkQueue) -> None:
    wall = Clock(1_800_000_600.0)
    dispatcher = dispatcher_at(queue, wall)
    assert value(dispatcher, "hoss_dispatcher_oldest_pending_pod_age_seconds") == 0
    old, gated, fresh = pending_pod(1), pending_pod(2), pending_pod(3)
    old["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"  # Unix 1_800_000_000
    gated["metadata"]["creationTimestamp"] = "2027-01-15T07:00:00Z"  # older, but it waits for its gate
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    await dispatcher.on_list([old, gated, fresh])  # fresh has no creation time: first seen now
    assert value(dispatcher, "hoss_dispatcher_gated_pods") == 1
    assert value(dispatcher, "hoss_dispatcher_oldest_pending_pod_age_seconds") == 600
