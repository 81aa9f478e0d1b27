"""hoss end to end: dispatcher and parallel workers place pods on the real plane, guarded by the resolver."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.ledger.client import Ledger
from hoss.model.objects import Json
from hoss.queue import WorkQueue
from tests.e2e.hoss import hoss_pods, wait_all_bound, workers
from tests.waiting import until

_node_sets = itertools.count()
NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}


async def worker_counters(plane: LocalPlane) -> dict[str, dict[str, int]]:
    redis = Redis.from_url(plane.state().redis_url, decode_responses=True)
    try:
        live, _dead = await WorkQueue(redis).workers()
    finally:
        await redis.aclose()
    return {w.id: w.counters for w in live}


@pytest.fixture
async def nodes(cluster: Cluster, request: pytest.FixtureRequest) -> AsyncIterator[list[str]]:
    count = getattr(request, "param", 30)
    names = await cluster.create_nodes(count, prefix=f"sched-{next(_node_sets)}", capacity=NODE_CAPACITY)
    await cluster.wait_nodes_ready(names)
    yield names
    await cluster.delete_nodes(names)


@pytest.fixture
def spreading(plane: LocalPlane, dispatcher: Process) -> Iterator[Process]:
    """The session's dispatcher restarted with --pack-depth=0 for one test: every pod is spread over the workers
    (by default a load that one worker keeps up with stays on it), then the default dispatcher again, on the same
    port (other tests hold the session fixture's Process)."""
    plane.stop_process(dispatcher.name)
    process = plane.start_dispatcher(extra_args=["--pack-depth=0"], port=dispatcher.port)
    try:
        yield process
    finally:
        plane.stop_process(process.name)
        plane.start_dispatcher(port=dispatcher.port)


async def test_three_workers_fill_30_nodes_with_300_pods_asking_more_than_fits_and_oversell_none(
    plane: LocalPlane, spreading: Process, cluster: Cluster, namespace: str, nodes: list[str]
) -> None:
    # 300 pods of one core on 30 nodes of 8 cores: 240 fit, 60 must wait. Demand above capacity is what makes
    # overselling possible, so it is what this test must have; the pods are spread, so all three workers race
    # for the same nodes.
    capacity = len(nodes) * 8
    layout = [("share-1", ["default"]), ("share-2", ["default"]), ("share-3", ["default"])]
    async with workers(plane, layout):
        await cluster.create_pods(hoss_pods("share", 300, cpu="1"), namespace=namespace)
        await wait_all_bound(cluster, namespace, capacity)

        async def rest_refused() -> tuple[bool, str]:
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            waiting = [p for p in pods if not p["spec"].get("nodeName")]
            told = [p for p in waiting if "Insufficient cpu" in scheduled_message(p)]
            return len(told) == 300 - capacity, f"{len(waiting)} waiting, {len(told)} saying Insufficient cpu"

        await until(rest_refused, timeout=120, what="the pods that do not fit to say why")
        pods = await cluster.raw_list("list_namespaced_pod", namespace)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        assert len(bound) == capacity
        assert {p["spec"]["nodeName"] for p in bound} <= set(nodes)
        assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}
        assert Counter(p["spec"]["nodeName"] for p in bound) == dict.fromkeys(nodes, 8), "every node exactly full"
        bound_by: dict[str, int] = {}

        async def counted() -> tuple[bool, str]:
            # Heartbeats carry the counters once a second: wait for the ones sent after the last binding.
            counters = await worker_counters(plane)
            bound_by.update({wid: counters.get(wid, {}).get("bound", 0) for wid, _ in layout})
            return sum(bound_by.values()) >= capacity, str(bound_by)

        await until(counted, timeout=15, what="the workers' heartbeats to count every binding")
    assert sum(bound_by.values()) == capacity, bound_by
    assert all(n > 0 for n in bound_by.values()), bound_by


def scheduled_message(pod: Json) -> str:
    """The message of the pod's PodScheduled=False condition ('' without one)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or "")
    return ""


async def test_a_worker_killed_mid_run_loses_no_pod_and_its_reservations_are_released(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, nodes: list[str]
) -> None:
    layout = [("kill-1", ["default"]), ("kill-2", ["default"]), ("kill-3", ["default"])]
    async with workers(plane, layout, extra_args=["--reservation-ttl-seconds=5"]) as started:
        # The victim is a worker holding unfinished pods (dispatched, not yet bound): its death is the one that
        # could lose some. It is killed the moment one is seen holding ten or more, while the pods are created.
        creating = asyncio.create_task(cluster.create_pods(hoss_pods("kill", 300), namespace=namespace))
        redis = Redis.from_url(plane.state().redis_url, decode_responses=True)
        held: Counter[str] = Counter()
        victim_id = ""

        async def one_holds_ten() -> tuple[bool, str]:
            nonlocal held, victim_id
            held = Counter((await WorkQueue(redis).dispatched()).values())
            victim_id = max((wid for wid, _ in layout), key=lambda wid: held.get(wid, 0))
            return held.get(victim_id, 0) >= 10, f"held: {dict(held)}"

        try:
            await until(one_holds_ten, timeout=60, what="a worker holding ten unfinished pods", interval=0.01)
        finally:
            await redis.aclose()
        victim = next(p for p in started if p.name.endswith(victim_id))
        os.kill(victim.pid, signal.SIGKILL)
        await creating
        pods = await wait_all_bound(cluster, namespace, 300, timeout=180)
        assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}

        ledger = Ledger.from_url(plane.state().redis_url)
        try:
            async def released() -> tuple[bool, str]:
                left = [e for e in await ledger.entries() if e.owner == victim_id and e.state == "assumed"]
                return not left, f"{len(left)} reservations of the dead worker left"

            await until(released, timeout=30, what="the dead worker's reservations to expire")
        finally:
            await ledger.close()


async def test_pods_of_each_policy_reach_only_workers_serving_it(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, nodes: list[str]
) -> None:
    layout = [("spread-only", ["default"]), ("pack-only", ["binpack"])]
    async with workers(plane, layout):
        await cluster.create_pods(hoss_pods("spread", 40) + hoss_pods("pack", 40, policy="binpack"),
                                  namespace=namespace)
        await wait_all_bound(cluster, namespace, 80)
        counters: dict[str, dict[str, int]] = {}

        async def counted() -> tuple[bool, str]:
            counters.update(await worker_counters(plane))
            done = [counters.get(w, {}).get(f"bound:{p}", 0) for w, p in (("spread-only", "default"),
                                                                           ("pack-only", "binpack"))]
            return done == [40, 40], str(counters)

        await until(counted, timeout=15, what="the workers' heartbeats to count every binding")
    assert counters["spread-only"].get("bound:default") == 40
    assert "bound:binpack" not in counters["spread-only"]
    assert counters["pack-only"].get("bound:binpack") == 40
    assert "bound:default" not in counters["pack-only"]


@pytest.mark.parametrize("nodes", [3], indirect=True)
async def test_pod_that_fits_nowhere_says_why_like_kube_scheduler_and_binds_when_room_appears(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, nodes: list[str]
) -> None:
    async with workers(plane, [("why-1", ["default"])]):
        await cluster.create_pods(hoss_pods("huge", 1, cpu="12"), namespace=namespace)

        async def explained() -> tuple[bool, str]:
            pod = await cluster.core.read_namespaced_pod("huge-0000", namespace)
            condition = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
            message = condition.message if condition else ""
            return bool(condition and condition.status == "False" and message), str(message)

        message = await until(explained, timeout=60, what="PodScheduled=False on the pod that cannot fit")
        assert message == "0/3 nodes are available: 3 Insufficient cpu."

        async def event_recorded() -> tuple[bool, str]:
            # Events are posted off the scheduling path, so the event may follow the condition by a moment.
            events = await cluster.events_for(namespace, "huge-0000")
            return any(e.reason == "FailedScheduling" and e.message == message for e in events), str(events)

        await until(event_recorded, timeout=30, what="the FailedScheduling event with the same message")

        big = await cluster.create_nodes(1, prefix="roomy", capacity={"cpu": "16", "memory": "64Gi", "pods": "110"})
        try:
            pods = await wait_all_bound(cluster, namespace, 1, timeout=90)
            assert pods[0]["spec"]["nodeName"] == big[0]

            async def scheduled_recorded() -> tuple[bool, str]:
                events = await cluster.events_for(namespace, "huge-0000")
                wanted = f"Successfully assigned {namespace}/huge-0000 to {big[0]}"
                return any(e.reason == "Scheduled" and e.type == "Normal" and e.message == wanted
                           for e in events), str([(e.reason, e.message) for e in events])

            await until(scheduled_recorded, timeout=30, what="kube-scheduler's Normal Scheduled event")
        finally:
            await cluster.delete_pods(namespace)
            await cluster.delete_nodes(big)
