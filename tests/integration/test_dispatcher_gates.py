"""schedulingGates: the dispatcher never sends a gated pod, and sends it at once when its last gate goes."""

from __future__ import annotations

import copy

import pytest

from dispatcher.queue import WorkQueue
from tests.integration.test_dispatcher_flow import beat, client, make_dispatcher, pending_pod, queue, stream_uids

pytestmark = pytest.mark.integration
__all__ = ["client", "queue"]  # fixtures


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
