"""schedulingGates: the dispatcher never sends a gated pod, and sends it at once when its last gate goes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hoss.queue import WorkQueue, queue_key
from tests.integration.dispatching import beat, make_dispatcher, pending_pod, stream_uids

pytestmark = pytest.mark.integration


async def test_a_gated_pod_is_held_back_until_its_gates_are_removed(queue: WorkQueue) -> None:
    gated = pending_pod(1)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}, {"name": "example.com/image"}]
    dispatcher = await make_dispatcher(queue, [gated, pending_pod(2)])
    await beat(queue, "w")

    report = await dispatcher.tick()
    assert report.dispatched == 1
    assert await stream_uids(queue, "w") == ["uid-2"]
    assert dispatcher.waiting == {}, "a gated pod waits for its gates, not for a worker: no notice"

    one_left = copy.deepcopy(gated)
    one_left["spec"]["schedulingGates"] = [{"name": "example.com/image"}]
    await dispatcher.on_event("MODIFIED", one_left)
    assert await dispatcher.dispatch_pending(fresh_only=True) == 0
    assert (await dispatcher.tick()).dispatched == 0

    ungated = copy.deepcopy(gated)
    del ungated["spec"]["schedulingGates"]
    await dispatcher.on_event("MODIFIED", ungated)
    assert await dispatcher.dispatch_pending(fresh_only=True) == 1, "sent by the fast path, not the next full pass"
    assert await stream_uids(queue, "w") == ["uid-2", "uid-1"]


async def test_a_gated_gang_member_is_not_sent_with_its_gang(queue: WorkQueue) -> None:
    labels = {"pod-group.scheduling.sigs.k8s.io/name": "g", "pod-group.scheduling.sigs.k8s.io/min-available": "2"}
    members = [pending_pod(n) for n in range(3)]
    for member in members:
        member["metadata"]["labels"] = dict(labels)
    members[2]["spec"]["schedulingGates"] = [{"name": "example.com/later"}]
    dispatcher = await make_dispatcher(queue, members)
    await beat(queue, "w")

    assert (await dispatcher.tick()).dispatched == 2
    entries: Any = await queue.redis.xrange(queue_key("w"))
    assert len(entries) == 1
    assert "uid-2" not in str(entries[0][1]), "the gated member stays behind"
