"""Koordinator Reservation fields on the real plane, each honoured with Koordinator's meaning or refused by name:
template.spec.nodeName puts the room on that node, ttl 0 never expires, unschedulable and taints keep owner pods
off it until they are lifted or tolerated, and preAllocation or an unknown field make hoss refuse the Reservation
with a Scheduled=False condition and an event naming the field."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client

from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import dispatcher_rounds_pass, scheduled_condition, worker_tries_again
from tests.e2e.test_reservations import owner_pod, reservation, reservation_status
from tests.waiting import until

API = ("scheduling.koordinator.sh", "v1alpha1", "reservations")
GPU_NODE = {"cpu": "8", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "4"}
_pools = itertools.count()


@pytest.fixture(scope="module")
def hoss_worker(plane: LocalPlane, dispatcher: Process) -> Iterator[Process]:
    process = plane.start_worker("rfield-0")
    try:
        yield process
    finally:
        plane.stop_process(process.name)


@dataclass
class Pool:
    """4-GPU nodes of a pool of their own, and the Reservations made for the test."""

    name: str
    nodes: list[str]
    custom: Any
    made: list[str] = field(default_factory=list)

    async def create(self, body: Json) -> None:
        await self.custom.create_cluster_custom_object(*API, body)
        self.made.append(body["metadata"]["name"])


@contextlib.asynccontextmanager
async def gpu_pool(cluster: Cluster, namespace: str, count: int) -> AsyncIterator[Pool]:
    """``count`` 4-GPU nodes of a pool of their own; afterwards the namespace's pods, the Reservations made with
    `Pool.create`, and the nodes are deleted."""
    name = f"rf{next(_pools)}-{namespace}"[:60]
    nodes = await cluster.create_nodes(count, prefix=name[:50], capacity=GPU_NODE, labels={"e2e.hoss.io/pool": name})
    pool = Pool(name=name, nodes=nodes, custom=client.CustomObjectsApi(cluster.api))
    try:
        await cluster.wait_nodes_ready(nodes)
        yield pool
    finally:
        await cluster.delete_pods(namespace)
        for made in pool.made:
            with contextlib.suppress(Exception):
                await pool.custom.delete_cluster_custom_object(*API, made)
        await cluster.delete_nodes(nodes)


async def phase_is(cluster: Cluster, name: str, phase: str, node: str | None = None) -> tuple[bool, str]:
    status = await reservation_status(cluster, name)
    return status.get("phase") == phase and (node is None or status.get("nodeName") == node), str(status)


async def test_a_template_node_name_puts_the_room_on_that_node_and_a_ttl_of_zero_never_expires(
    plane: LocalPlane, cluster: Cluster, namespace: str, dispatcher: Process, hoss_worker: Process
) -> None:
    """Two Reservations of a whole node's 4 GPUs, both naming the third of three nodes: the first lands there,
    the second, made once the first is placed, fits nowhere else it may go and says so (the two free nodes are not
    for it). ttl "0" and "0s" never expire: both are still there, Available and Pending, after the leader's expiry
    pass has run. (Made together, either could take the node first.)"""
    async with gpu_pool(cluster, namespace, 3) as pool:
        nodes = pool.nodes
        first, second = f"pin0-{namespace}"[:60], f"pin0s-{namespace}"[:60]
        for name, ttl in ((first, "0"), (second, "0s")):
            body = reservation(name, pool.name, gpus="4", owner_label=name, ttl=ttl)
            body["spec"]["template"]["spec"]["nodeName"] = nodes[2]
            await pool.create(body)
            if name == first:
                await until(lambda: phase_is(cluster, first, "Available", nodes[2]), timeout=60,
                            what="the first Reservation to be placed on the node it names")

        async def told() -> tuple[bool, str]:
            status = await reservation_status(cluster, second)
            return (status.get("phase") == "Pending" and not status.get("nodeName")
                    and any(c.get("type") == "Scheduled" and c.get("status") == "False"
                            for c in status.get("conditions") or [])), str(status)

        await until(told, timeout=60, what="the second to say it does not fit on the node it names")
        await dispatcher_rounds_pass(dispatcher, 3)  # the leader's expiry pass has looked at them several times
        assert (await reservation_status(cluster, first)).get("phase") == "Available"
        assert (await reservation_status(cluster, second)).get("phase") == "Pending"


async def test_unschedulable_and_taints_keep_owners_off_a_reservation_until_lifted_or_tolerated(
    plane: LocalPlane, cluster: Cluster, namespace: str, dispatcher: Process, hoss_worker: Process
) -> None:
    async with gpu_pool(cluster, namespace, 1) as pool:
        [node] = pool.nodes
        name = f"closed-{namespace}"[:60]
        body = reservation(name, pool.name, gpus="4", owner_label=name)
        body["spec"]["unschedulable"] = True
        body["spec"]["taints"] = [{"key": "team", "value": "vision", "effect": "NoSchedule"}]
        await pool.create(body)
        await until(lambda: phase_is(cluster, name, "Available", node), timeout=60,
                    what="the Reservation to be placed")
        tolerant = owner_pod("tolerant", pool.name, name, gpus="4")
        tolerant["spec"]["tolerations"] = [{"key": "team", "operator": "Equal", "value": "vision",
                                            "effect": "NoSchedule"}]
        await cluster.create_pods([tolerant], namespace=namespace)

        async def waits(pod: str) -> tuple[bool, str]:
            reason, message = await scheduled_condition(cluster, namespace, pod)
            return reason == "Unschedulable" and "nvidia.com/gpu" in message, f"{reason}: {message}"

        await until(lambda: waits("tolerant"), timeout=60, what="the owner to wait: the Reservation is unschedulable")
        await pool.custom.patch_cluster_custom_object(*API, name, {"spec": {"unschedulable": False}},
                                                      _content_type="application/merge-patch+json")
        await until(lambda: phase_is(cluster, name, "Succeeded"), timeout=90,
                    what="the tolerating owner to use the Reservation once it is schedulable")

        other = f"tainted-{namespace}"[:60]
        body = reservation(other, pool.name, gpus="4", owner_label=other)
        body["spec"]["taints"] = [{"key": "team", "value": "vision", "effect": "NoSchedule"}]
        await cluster.delete_pods(namespace)
        await pool.create(body)
        await until(lambda: phase_is(cluster, other, "Available", node), timeout=90,
                    what="the tainted Reservation to be placed")
        await cluster.create_pods([owner_pod("intolerant", pool.name, other, gpus="4")], namespace=namespace)
        await until(lambda: waits("intolerant"), timeout=60,
                    what="an owner that does not tolerate the taint to wait")
        await worker_tries_again(hoss_worker)  # the owner is its only waiting pod: tried once more, still kept off
        assert (await reservation_status(cluster, other)).get("phase") == "Available"
        assert not (await cluster.core.read_namespaced_pod("intolerant", namespace)).spec.node_name


async def test_pre_allocation_and_an_unknown_field_are_refused_by_name_on_the_reservation(
    plane: LocalPlane, cluster: Cluster, namespace: str, dispatcher: Process, hoss_worker: Process
) -> None:
    async with gpu_pool(cluster, namespace, 1) as pool:
        cases = {f"prealloc-{namespace}"[:60]: ("preAllocation", True, "spec.preAllocation"),
                 f"unknown-{namespace}"[:60]: ("reserveFor", "ever", "spec.reserveFor")}
        for name, (key, value, _says) in cases.items():
            body = reservation(name, pool.name, gpus="1", owner_label=name)
            body["spec"][key] = value
            await pool.create(body)

        async def refused() -> tuple[bool, str]:
            seen = {}
            for name in cases:
                status = await reservation_status(cluster, name)
                conditions = [c for c in status.get("conditions") or [] if c.get("reason") == "Refused"]
                events = await cluster.core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={name},involvedObject.kind=Reservation")
                seen[name] = (status.get("phase"), [c.get("message") for c in conditions],
                              [(e.reason, e.message) for e in events.items])
            ok = all(phase == "Pending" and any(says in m for m in messages)
                     and any(r == "Refused" and says in str(m) for r, m in events)
                     for (phase, messages, events), (_f, _v, says) in zip(seen.values(), cases.values(),
                                                                            strict=True))
            return ok, str(seen)

        await until(refused, timeout=60, what="each refused Reservation to name its field")
        for name in cases:
            assert not (await reservation_status(cluster, name)).get("nodeName")


async def test_a_restricted_reservation_keeps_an_owner_that_asks_more_than_it_holds_off_its_node(
    plane: LocalPlane, cluster: Cluster, namespace: str, dispatcher: Process, hoss_worker: Process
) -> None:
    """allocatePolicy Restricted, 1 GPU reserved on a 4-GPU node: an owner asking 2 GPUs does not go there, though
    the node has 3 free (Koordinator's reservation filter: what it asks of the reserved resources must come from
    the Reservation); it waits, saying why, and an owner asking 1 GPU then uses the Reservation."""
    async with gpu_pool(cluster, namespace, 1) as pool:
        [node] = pool.nodes
        name = f"restricted-{namespace}"[:60]
        body = reservation(name, pool.name, gpus="1", owner_label=name)
        body["spec"]["allocatePolicy"] = "Restricted"
        await pool.create(body)
        await until(lambda: phase_is(cluster, name, "Available", node), timeout=60,
                    what="the Reservation to be placed")
        await cluster.create_pods([owner_pod("big", pool.name, name, gpus="2")], namespace=namespace)

        async def waits() -> tuple[bool, str]:
            reason, message = await scheduled_condition(cluster, namespace, "big")
            return reason == "Unschedulable" and "allocatePolicy Restricted" in message, f"{reason}: {message}"

        await until(waits, timeout=60, what="the owner asking more than the Reservation holds to wait")
        await worker_tries_again(hoss_worker)  # tried once more: still kept off the node
        assert not (await cluster.core.read_namespaced_pod("big", namespace)).spec.node_name
        assert (await reservation_status(cluster, name)).get("phase") == "Available"
        await cluster.create_pods([owner_pod("small", pool.name, name, gpus="1")], namespace=namespace)
        await until(lambda: phase_is(cluster, name, "Succeeded"), timeout=90,
                    what="the owner that fits to use the Reservation")
        assert (await cluster.core.read_namespaced_pod("small", namespace)).spec.node_name == node
