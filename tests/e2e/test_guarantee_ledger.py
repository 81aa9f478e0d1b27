"""The guarantee, round 2 (issue 33), the ledger's side, on the real plane: what enters the ledger unchecked, and
what Redis loses without anyone noticing.

Item 2: a Koordinator Reservation marked Available by anyone but the hoss worker that held its room (Koordinator's
scheduler, or any client with ``reservations/status``) on a node without room for it holds no room in the ledger,
its owners cannot use it, and a Warning event on it says why. Item 3: Redis coming back with a copy taken after the
sync's last stamp tick, without an admitted write made after the copy, is noticed at the next write of the resolver
that made it, the ledger is rebuilt from the apiserver, and nothing is oversold meanwhile. Every test ends with the
independent oversell check (conftest's no_node_oversold).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.kube.client import KubeError, request_json
from hoss.ledger.client import Ledger
from hoss.model import reservations
from hoss.model.objects import Json
from tests.e2e.guard import create, ledger_agrees, ledger_counter, one_node, pod_on
from tests.waiting import until

KOORDINATOR = "koord-scheduler"
"""schedulerName of a Reservation's template that hoss does not place: Koordinator's scheduler marks it Available."""




@pytest.fixture(scope="module")
def hoss_worker(plane: LocalPlane, dispatcher: Process) -> Iterator[Process]:
    process = plane.start_worker("guarantee-ledger-0")
    try:
        yield process
    finally:
        plane.stop_process(process.name)








async def refused(cluster: Cluster, namespace: str, pod: Json) -> str:
    """The apiserver's refusal of creating `pod` (its message)."""
    with pytest.raises(KubeError) as caught:
        await create(cluster, namespace, pod)
    return str(caught.value)






# -- item 2: a Reservation's status is a claim, the ledger decides -----------------------------------------------


def koordinator_reservation(name: str, pool: str, *, cpu: str) -> Json:
    """A Reservation of `cpu` for pods labelled app=`name`, scheduled by Koordinator (not by hoss)."""
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation", "metadata": {"name": name},
        "spec": {
            "template": {"metadata": {"namespace": "default"}, "spec": {
                "schedulerName": KOORDINATOR, "nodeSelector": {"e2e.hoss.io/pool": pool},
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}},
            "owners": [{"labelSelector": {"matchLabels": {"app": name}}}],
            "ttl": "10m",
        },
    }


async def reservation_warnings(cluster: Cluster, name: str) -> list[tuple[str, str]]:
    events = await cluster.raw_list("list_namespaced_event", "default",
                                    field_selector=f"involvedObject.name={name},involvedObject.kind=Reservation")
    return [(e.get("reason") or "", e.get("message") or "") for e in events if e.get("type") == "Warning"]


async def test_a_reservation_marked_available_on_a_full_node_holds_no_room_and_its_owner_cannot_use_it(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger, hoss_worker: Process
) -> None:
    """A 4-cpu node holds a 3-cpu pod; someone with reservations/status (here: the test, as Koordinator's scheduler
    would) marks a 3-cpu Reservation Available there. The ledger does not count it as holding room (the node would
    be oversold), a Warning event on the Reservation says why, and its owner pod, which hoss schedules, is not put
    on the node through it."""
    pool = f"gl-rsv-{namespace}"[:60]
    name = f"koord-{namespace}"[:60]
    node = await one_node(cluster, pool[:50], "4", labels={"e2e.hoss.io/pool": pool})
    custom: Any = client.CustomObjectsApi(cluster.api)
    try:
        await create(cluster, namespace, pod_on("filler", node, "3"))
        await ledger_agrees(cluster, ledger, node)
        await custom.create_cluster_custom_object(*reservations.API, koordinator_reservation(name, pool, cpu="3"))
        await custom.patch_cluster_custom_object_status(*reservations.API, name,
                                                        reservations.available_status(node, {"cpu": 3000}),
                                                        _content_type="application/merge-patch+json")

        async def warned() -> tuple[bool, str]:
            found = await reservation_warnings(cluster, name)
            return any(node in message and "no room" in message for _reason, message in found), str(found)

        await until(warned, timeout=60, what="a Warning event saying the Reservation holds no room on the node")
        await ledger_agrees(cluster, ledger, node)  # the Reservation holds nothing there

        owner = pod_manifest("owner", requests={"cpu": "3", "memory": "64Mi"}, scheduler_name="hoss")
        owner["metadata"]["labels"] = {"app": name}
        owner["spec"]["nodeSelector"] = {"e2e.hoss.io/pool": pool}
        await create(cluster, namespace, owner)

        async def told() -> tuple[bool, str]:
            messages = [e.message or "" for e in await cluster.events_for(namespace, "owner")]
            return any("Insufficient cpu" in m for m in messages), str(messages[-2:])

        await until(told, timeout=90, what="the owner pod to be told the node has no room for it")
        found = await request_json(cluster.core.read_namespaced_pod, "owner", namespace)
        assert not found["spec"].get("nodeName"), "the owner was put on the node through a Reservation without room"
    finally:
        await cluster.delete_pods(namespace)
        try:
            await custom.delete_cluster_custom_object(*reservations.API, name)
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise
        await cluster.delete_nodes([node])


# -- item 3: Redis back from a copy younger than the last stamp tick ---------------------------------------------


async def test_a_redis_copy_taken_after_the_last_stamp_tick_is_detected_before_anything_oversells(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    """Redis comes back with a copy taken right after a write, younger than the sync's last stamp tick, so the
    stamp it holds is the one the sync expects next. The copy lacks a pod admitted (and bound) after it. The next
    write of the resolver that admitted it sees that Redis lost it: that write is refused, the ledger is rebuilt
    from the apiserver (counted as a stale ledger), and the lost pod is counted again before anything else fits."""
    node = await one_node(cluster, "gl-copy", "4")
    raw = aioredis.Redis.from_url(plane.state().redis_url)
    try:
        await create(cluster, namespace, pod_on("early", node, "1"))
        await ledger_agrees(cluster, ledger, node)
        before = await ledger_counter(plane, "stale_ledger")
        keys = [key async for key in raw.scan_iter(match="{hoss}:*", count=1000)]
        copy = {key: await raw.dump(key) for key in keys}
        await create(cluster, namespace, pod_on("late", node, "2"))  # admitted after the copy
        await ledger_agrees(cluster, ledger, node)
        stamp = await raw.get("{hoss}:stamp")
        pipe = raw.pipeline(transaction=True)
        pipe.flushdb()
        for key, value in copy.items():
            if value is not None:
                pipe.restore(key, 0, value)
        if stamp is not None:
            pipe.set("{hoss}:stamp", stamp)  # the copy was taken after the sync's last tick
        await pipe.execute()
        assert await ledger.is_ready(), "the copy says it is ready"

        message = await refused(cluster, namespace, pod_on("over", node, "2"))  # 1 + 2 fit in the copy's ledger
        assert "not ready" in message or "has no room" in message, message

        async def counted() -> tuple[bool, str]:
            now = await ledger_counter(plane, "stale_ledger")
            return now > before, f"stale_ledger {now} (before {before})"

        await until(counted, timeout=30, what="the resolver to count the stale copy")
        await ledger_agrees(cluster, ledger, node)
        assert "has no room" in await refused(cluster, namespace, pod_on("over", node, "2"))
    finally:
        await raw.aclose()
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])
