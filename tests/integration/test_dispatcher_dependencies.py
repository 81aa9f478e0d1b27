"""Job dependencies and Reservation owners in the dispatcher on a real redis-server: a pod that depends on a Job
is held back with its reason until the Job allows it (sent by the fast path on the Job's change); a pending pod an
Available Reservation owns carries that Reservation to its worker."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import orjson
import pytest

from dispatcher import dependencies
from dispatcher import reservations as dispatcher_reservations
from hoss.model import reservations
from hoss.queue import WorkItem, WorkQueue, queue_key
from tests.integration.dispatching import RecordingNotifier, beat, make_dispatcher, pending_pod, stream_uids
from tests.waiting import until

pytestmark = pytest.mark.integration


def job(name: str, **status: Any) -> dependencies.JobState:
    return dependencies.job_state({"metadata": {"name": name}, "status": status})


async def test_a_dependent_pod_waits_with_its_reason_and_goes_when_the_job_completes(queue: WorkQueue) -> None:
    dependent = pending_pod(1)
    dependent["metadata"]["annotations"] = {dependencies.ANNOTATION: "prepare:Complete"}
    dispatcher = await make_dispatcher(queue, [dependent, pending_pod(2)])
    namespace = dependent["metadata"]["namespace"]
    await beat(queue, "w")

    assert (await dispatcher.tick()).dispatched == 1
    assert await stream_uids(queue, "w") == ["uid-2"]
    waiting = dispatcher.waiting["uid-1"]
    assert (waiting.reason, waiting.message) == (dependencies.WAITING,
                                                  "waiting for job prepare to be Complete (now: not found)")

    dispatcher.on_job(namespace, "prepare", job("prepare", active=1))
    assert await dispatcher.dispatch_pending(fresh_only=True) == 0
    assert "1 active" in dispatcher.waiting["uid-1"].message

    dispatcher.on_job(namespace, "prepare", job("prepare", succeeded=1,
                                                conditions=[{"type": "Complete", "status": "True"}]))
    assert await dispatcher.dispatch_pending(fresh_only=True) == 1, "sent by the fast path on the Job's change"
    assert await stream_uids(queue, "w") == ["uid-2", "uid-1"]
    assert "uid-1" not in dispatcher.waiting


async def test_a_failed_dependency_fails_the_pod_once_or_lets_it_wait(queue: WorkQueue) -> None:
    failed = job("prepare", conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                         "message": "Job has reached the specified backoff limit"}])
    dependent = pending_pod(1)
    dependent["metadata"]["annotations"] = {dependencies.ANNOTATION: "prepare"}
    namespace = dependent["metadata"]["namespace"]
    notifier = RecordingNotifier()
    dispatcher = await make_dispatcher(queue, [dependent, pending_pod(2)], notifier=notifier)
    dispatcher.on_job(namespace, "prepare", failed)
    await beat(queue, "w")
    assert (await dispatcher.tick()).dispatched == 1  # uid-2 only
    await until(lambda: bool(notifier.failures), timeout=10, what="the pod to be failed (in the background)")
    assert notifier.failures == [(f"{namespace}/pod-1", dependencies.FAILED,
                                  "job prepare failed (condition Failed: BackoffLimitExceeded (Job has reached the "
                                  "specified backoff limit)), so prepare:Complete can never hold; the pod is failed "
                                  "(its Job counts the failure)")]
    assert "uid-1" not in dispatcher.waiting
    await dispatcher.tick()  # until the pod watch drops it, it is not failed a second time
    await asyncio.sleep(0)  # one turn of the loop: a failing that round started would have run (the notifier's is)
    assert len(notifier.failures) == 1
    assert await stream_uids(queue, "w") == ["uid-2"]

    # failed_dependency: wait keeps the pod Pending, told why.
    patient = pending_pod(3)
    patient["metadata"]["annotations"] = {dependencies.ANNOTATION: "prepare"}
    dispatcher = await make_dispatcher(queue, [patient], notifier=RecordingNotifier(), failed_dependency="wait")
    dispatcher.on_job(namespace, "prepare", failed)
    assert (await dispatcher.tick()).dispatched == 0
    waiting = dispatcher.waiting["uid-3"]
    assert waiting.reason == dependencies.FAILED and waiting.message.endswith("the pod waits (re-create the "
                                                                                "dependency to retry)")


async def test_a_pod_waits_for_a_podgroup_to_run(queue: WorkQueue) -> None:
    dependent = pending_pod(1)
    dependent["metadata"]["annotations"] = {dependencies.ANNOTATION: "podgroup/trainers:Running"}
    namespace = dependent["metadata"]["namespace"]
    dispatcher = await make_dispatcher(queue, [dependent], notifier=RecordingNotifier())
    await beat(queue, "w")

    def group(phase: str) -> dependencies.JobState:
        return dependencies.podgroup_state({"metadata": {"name": "trainers"}, "status": {"phase": phase}})

    dispatcher.on_job(namespace, "trainers", group("Pending"), kind="podgroup")
    assert (await dispatcher.tick()).dispatched == 0
    assert dispatcher.waiting["uid-1"].message == "waiting for podgroup trainers to be Running (now: phase Pending)"
    dispatcher.on_job(namespace, "trainers", group("Scheduled"), kind="podgroup")
    assert await dispatcher.dispatch_pending(fresh_only=True) == 1
    assert await stream_uids(queue, "w") == ["uid-1"]


async def test_an_owner_pod_carries_its_available_reservation(queue: WorkQueue) -> None:
    owner = pending_pod(1)
    owner["metadata"]["labels"] = {"app": "train"}
    dispatcher = await make_dispatcher(queue, [owner, pending_pod(2)])
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reservation = {
        "metadata": {"name": "slot", "uid": "rsv-uid", "creationTimestamp": created},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "train"}}}]},
        "status": {"phase": "Available", "nodeName": "n1"},
    }
    dispatcher_reservations.observe(dispatcher, "ADDED", copy.deepcopy(reservation))
    await beat(queue, "w")
    assert (await dispatcher.tick()).dispatched == 2
    entries: Any = await queue.redis.xrange(queue_key("w"))
    pods = {item.uid: orjson.loads(item.pod) for item in (WorkItem.decode(fields) for _id, fields in entries)}
    assert pods["uid-1"][reservations.HINTS] == [["rsv-uid", "slot", "n1", {"cpu": 2000, "pods": 1}, True, False]]
    assert reservations.HINTS not in pods["uid-2"]


async def test_a_pending_reservation_is_dispatched_as_a_pod_until_it_is_placed(queue: WorkQueue) -> None:
    dispatcher = await make_dispatcher(queue, [])
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reservation = {
        "metadata": {"name": "slot", "uid": "rsv-uid", "creationTimestamp": created},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}},
                 "owners": [{"object": {"name": "x"}}]},
    }
    dispatcher_reservations.observe(dispatcher, "ADDED", copy.deepcopy(reservation))
    assert "rsv-uid" in dispatcher.pending
    await dispatcher.on_list([])  # a re-list of pending pods does not drop it: it is no pod
    assert "rsv-uid" in dispatcher.pending
    await beat(queue, "w")
    assert (await dispatcher.tick()).dispatched == 1
    reservation["status"] = {"phase": "Available", "nodeName": "n1"}
    dispatcher_reservations.observe(dispatcher, "MODIFIED", reservation)
    assert "rsv-uid" not in dispatcher.pending


async def test_an_owner_sent_before_its_reservation_was_placed_is_sent_again_with_it(queue: WorkQueue) -> None:
    """The owner is on a worker already (waiting: nothing else fits) when its Reservation becomes Available: a new
    version carrying the Reservation follows the old one, which the ledger then answers stale."""
    owner = pending_pod(1)
    owner["metadata"]["labels"] = {"app": "train"}
    dispatcher = await make_dispatcher(queue, [owner])
    await beat(queue, "w")
    assert (await dispatcher.tick()).dispatched == 1
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reservation = {
        "metadata": {"name": "slot", "uid": "rsv-uid", "creationTimestamp": created},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "train"}}}]},
    }
    dispatcher_reservations.observe(dispatcher, "ADDED", copy.deepcopy(reservation))
    reservation["status"] = {"phase": "Available", "nodeName": "n1"}
    dispatcher_reservations.observe(dispatcher, "MODIFIED", reservation)
    await dispatcher.dispatch_pending(fresh_only=True)
    entries: Any = await queue.redis.xrange(queue_key("w"))
    items = [WorkItem.decode(fields) for _id, fields in entries if WorkItem.decode(fields).uid == "uid-1"]
    assert len(items) == 2
    old, new = items
    assert reservations.HINTS not in orjson.loads(old.pod)
    assert orjson.loads(new.pod)[reservations.HINTS][0][:3] == ["rsv-uid", "slot", "n1"]
    assert new.digest != old.digest
    assert await queue.redis.hget("{hoss}:podver", "uid-1") in (new.digest, new.digest.encode())
