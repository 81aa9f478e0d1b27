"""Gangs as scheduler-plugins' Coscheduling has them, against a real redis-server: members already bound count
toward min-available, extra and replacement members go out singly once the gang started, and the PodGroup's
status (phase, scheduled, running) is written from the members' counts."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core import Dispatcher
from dispatcher.gangbook import GANG_QUIET_ROUNDS, RECOUNT_SECONDS
from dispatcher.gangs import GangKey, PodGroupSpec
from dispatcher.podgroup_status import StatusChange
from dispatcher.settings import DispatcherSettings
from hoss.queue import WorkerInfo, WorkQueue, queue_key
from tests.integration.dispatching import stream_items

pytestmark = pytest.mark.integration
Json = dict[str, Any]
KEY = GangKey("team", "train")


def member(n: int, *, node: str = "", phase: str = "Pending") -> Json:
    return {
        "metadata": {"name": f"train-{n}", "namespace": "team", "uid": f"uid-{n}",
                     "labels": {"scheduling.x-k8s.io/pod-group": "train"}},
        "spec": {"schedulerName": "hoss", "containers": [{"name": "c"}], **({"nodeName": node} if node else {})},
        "status": {"phase": phase},
    }


async def test_bound_members_count_so_a_replacement_goes_out_singly_and_the_podgroup_status_follows(
    queue: WorkQueue,
) -> None:
    dispatcher = Dispatcher(queue=queue, settings=DispatcherSettings(identity="t"))
    dispatcher.podgroups[KEY] = PodGroupSpec(min_member=4)
    await queue.heartbeat(WorkerInfo(id="w", policies=["default"]), ttl_seconds=60)
    apiserver = {n: member(n, node=f"n{n}", phase="Running") for n in range(4)}  # the gang ran, then one died
    del apiserver[3]
    apiserver[4] = member(4)  # its replacement
    statuses: list[Json] = []

    async def list_members(namespace: str, selector: str) -> list[Json]:
        assert (namespace, selector) == ("team", "scheduling.x-k8s.io/pod-group=train")
        return list(apiserver.values())

    async def write_status(key: GangKey, _group: PodGroupSpec, change: StatusChange) -> None:
        assert key == KEY
        statuses.append(change.status)

    await dispatcher.on_list([apiserver[4]])
    dispatcher.synced.set()
    await dispatcher.tick()
    assert await stream_items(queue, "w") == [], "3 bound + 1 pending reach min-available 4, but are not counted yet"
    assert dispatcher.waiting["uid-4"].reason == "GangIncomplete"

    await dispatcher.refresh_gangs(list_members, write_status)
    started = statuses[-1].pop("scheduleStartTime")
    assert statuses[-1] == {"phase": "Scheduling", "running": 3, "succeeded": 0, "failed": 0}
    await dispatcher.tick()
    [item] = await stream_items(queue, "w")
    assert item.gang == "team/train" and item.min_available == 1, "one more member completes the gang"
    assert [m.uid for m in item.members] == ["uid-4"]

    # The replacement is bound and runs; a fifth member (an extra) arrives once the gang has started.
    await queue.redis.delete(queue_key("w"), "{hoss}:dispatched")
    await dispatcher.on_event("DELETED", apiserver[4])
    apiserver[4] = member(4, node="n4", phase="Running")
    apiserver[5] = member(5)
    await dispatcher.on_event("ADDED", apiserver[5])
    await dispatcher.refresh_gangs(list_members, write_status)
    assert statuses[-1] == {"phase": "Running", "running": 4, "succeeded": 0, "failed": 0,
                            "scheduleStartTime": started}
    await dispatcher.tick()
    [single] = await stream_items(queue, "w")
    assert (single.uid, single.members, single.pod != "") == ("uid-5", (), True), "an extra member goes singly"

    # No member is pending any more; the group is still followed until it is Finished, however long that takes.
    await dispatcher.on_event("DELETED", apiserver[5])
    del apiserver[5]
    for n in (0, 1, 2, 4):
        apiserver[n]["status"]["phase"] = "Succeeded"
    for _ in range(GANG_QUIET_ROUNDS + 1):
        dispatcher.gangs.counts[KEY] = (-RECOUNT_SECONDS, dispatcher.gangs.counts[KEY][1])  # its count is old
        await dispatcher.refresh_gangs(list_members, write_status)
    assert statuses[-1]["phase"] == "Finished" and statuses[-1]["succeeded"] == 4


async def test_a_settled_gang_is_forgotten_and_a_follower_forgets_old_gangs(queue: WorkQueue) -> None:
    now = [0.0]
    dispatcher = Dispatcher(queue=queue, settings=DispatcherSettings(identity="t"), clock=lambda: now[0])
    bound = member(0, node="n0", phase="Running")
    await dispatcher.on_list([member(0)])
    await dispatcher.on_event("DELETED", bound)  # bound: it left the pending set

    async def list_members(_namespace: str, _selector: str) -> list[Json]:
        return [bound]

    for _ in range(6):
        await dispatcher.refresh_gangs(list_members)
    assert KEY not in dispatcher.gangs.dirty and KEY not in dispatcher.gangs.counts

    await dispatcher.on_event("ADDED", member(1))
    await dispatcher.on_event("DELETED", member(1, node="n1"))
    now[0] += 601
    dispatcher.prune_gangs(older_than=600)
    assert dispatcher.gangs.dirty == {}
