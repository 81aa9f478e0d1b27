"""A hoss pod that fits nowhere, on the real plane: its worker writes PodScheduled=False, a user labels it, someone
else writes its status; the worker holds one work item for it all along and tries it at its backoff's pace (a new
version takes the older's place and backoff, a status write makes no new version), and binds it once room appears,
at the resourceVersion the pod has then (its item names an older one: the binding reads the pod again and is
posted at the current version).

Before, every write to the pod (the worker's own condition write first) queued a new version behind the old one,
which the worker held and tried as well, each at its own pace: two or three copies, attempts far faster than the
backoff."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.kube.client import request_json
from hoss.kube.rest import STRATEGIC_MERGE_PATCH
from hoss.model.objects import Json
from tests.waiting import until

BACKOFF = ["--backoff-initial-seconds=2", "--backoff-max-seconds=30"]
"""Retries 2, 4, 8, 16 s after the attempts before, each ±20 %: the fourth attempt is at most 16.8 s after the first,
the fifth at least 24 s."""
WINDOW_SECONDS = 22.0
"""How long after its first attempt the pod's attempts are counted: exactly four at the backoff's pace."""
MERGE_PATCH = "application/merge-patch+json"


async def worker_status(worker: Process) -> Json:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{worker.port}/status") as answer:
        status: Json = await answer.json()
    return status


async def worker_sample(worker: Process, name: str, **labels: str) -> float:
    """The sum of the worker's /metrics samples `name` with these `labels`."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{worker.port}/metrics") as answer:
        text = await answer.text()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


async def unschedulable_attempts(worker: Process) -> float:
    return await worker_sample(worker, "scheduler_schedule_attempts_total", result="unschedulable")


async def read_pod(cluster: Cluster, namespace: str, name: str) -> Json:
    pod: Json = await request_json(cluster.core.read_namespaced_pod, name, namespace)
    return pod


def told_unschedulable(pod: Json) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


async def test_an_unschedulable_pod_is_tried_at_its_backoffs_pace_as_one_item_and_binds_once_room_appears(
    plane: LocalPlane, cluster: Cluster, namespace: str, dispatcher: Process
) -> None:
    label = {"hoss.io/test-node": namespace[:63]}
    capacity = {"memory": "8Gi", "pods": "110"}
    (small,) = await cluster.create_nodes(1, prefix="versions-small", capacity={"cpu": "2", **capacity},
                                          labels=label)
    nodes = [small]
    worker: Process | None = None
    try:
        await cluster.wait_nodes_ready([small])
        worker = await asyncio.to_thread(plane.start_worker, "versions", extra_args=BACKOFF)
        pod = pod_manifest("waiting", requests={"cpu": "3", "memory": "64Mi"}, scheduler_name="hoss")
        pod["spec"]["nodeSelector"] = label
        await request_json(cluster.core.create_namespaced_pod, namespace, pod)
        assert worker is not None
        running = worker

        async def first_attempt() -> tuple[bool, str]:
            tried = await unschedulable_attempts(running)
            return tried == 1, f"{tried} unschedulable attempts"

        await until(first_attempt, timeout=60, what="the worker's first attempt", interval=0.1)
        first = time.monotonic()

        async def condition_written() -> tuple[bool, str]:
            now = await read_pod(cluster, namespace, "waiting")
            return told_unschedulable(now), f"conditions {(now.get('status') or {}).get('conditions')}"

        await until(condition_written, timeout=30, what="the worker to write PodScheduled=False")
        # A change scheduling reads (a new version), then a status write someone else makes (none).
        await request_json(cluster.core.patch_namespaced_pod, "waiting", namespace,
                           {"metadata": {"labels": {"changed": "while-waiting"}}}, _content_type=MERGE_PATCH)
        await request_json(cluster.core.patch_namespaced_pod_status, "waiting", namespace,
                           {"status": {"conditions": [{"type": "example.io/Seen", "status": "True"}]}},
                           _content_type=STRATEGIC_MERGE_PATCH)

        held: list[int] = []

        async def window_over() -> tuple[bool, str]:
            held.append(int((await worker_status(running))["queue_depth"]))
            return time.monotonic() - first >= WINDOW_SECONDS, f"items held {held[-5:]}"

        await until(window_over, timeout=WINDOW_SECONDS + 30, what="the window to pass", interval=0.2)
        assert max(held) == 1, f"one work item for the pod at a time, held: {sorted(set(held))}"
        assert await unschedulable_attempts(running) == 4, "tried at the backoff's pace, as one pod"
        assert await worker_sample(running, "hoss_worker_pods_total", outcome="stale") == 1, \
            "one newer version (the label's) replaced the older; the status writes made none"

        (roomy,) = await cluster.create_nodes(1, prefix="versions-roomy", capacity={"cpu": "4", **capacity},
                                              labels=label)
        nodes.append(roomy)

        async def bound() -> tuple[bool, str]:
            now = await read_pod(cluster, namespace, "waiting")
            return now["spec"].get("nodeName") == roomy, f"nodeName {now['spec'].get('nodeName')}"

        await until(bound, timeout=60, what="the pod to be bound once room appeared")
        assert await worker_sample(running, "hoss_worker_pods_total", outcome="bound") == 1
        assert await worker_sample(running, "hoss_worker_pods_total", outcome="stale") == 1, \
            "bound at the pod's current version, read again, not refused as out of date"
        assert (await worker_status(running))["queue_depth"] == 0
    finally:
        if worker is not None:
            await asyncio.to_thread(plane.stop_process, worker.name)
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)
