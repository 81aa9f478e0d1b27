"""CSI attach limits (NodeVolumeLimits) on the real plane: a CSINode gives a driver an attach limit on a node
(kwok nodes have no kubelet to publish one: the tests make the CSINodes), PVs of that driver are bound to claims,
and pods beyond the limit wait with kube-scheduler's reason, counting the volumes of the pods already on the node
(one placed there by another writer included) once each. The scenario runs under kube-scheduler and under hoss, on
nodes of their own; the race of two workers for a node's last slots is hoss's alone. Each test ends with the
oversell check and checks which pods are left Pending."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import (
    hoss_pods,
    node_of,
    node_set,
    pending,
    pinned,
    scheduled_condition,
    wait_bound,
    wait_reason,
    workers,
)
from tests.e2e.volumes import (
    SCHEDULERS,
    TWO,
    Storage,
    for_scheduler,
    storage_objects,
    two_sets,
    volume_claim,
    with_claims,
)
from tests.waiting import until

MAX_VOLUME_COUNT = "node(s) exceed max volume count"


@asynccontextmanager
async def attach_limits(cluster: Cluster, driver: str, limits: dict[str, int]) -> AsyncIterator[None]:
    """A CSINode per node of `limits` giving `driver` that attach limit (what a kubelet's node-driver-registrar
    publishes), deleted after the block."""
    storage: Any = client.StorageV1Api(cluster.api)
    for node, count in limits.items():
        await storage.create_csi_node({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                                       "metadata": {"name": node},
                                       "spec": {"drivers": [{"name": driver, "nodeID": node,
                                                             "allocatable": {"count": count}}]}})
    try:
        yield
    finally:
        for node in limits:
            with contextlib.suppress(ApiException):
                await storage.delete_csi_node(node)


def csi_volume(name: str, driver: str, storage_class: str) -> Json:
    """A static PV of `driver` (any node), labelled for the claim of the same name."""
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "labels": {"for": name}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Retain",
                     "csi": {"driver": driver, "volumeHandle": f"handle-{name}"}}}


async def bound_claims(storage: Storage, namespace: str, names: list[str], storage_class: str, driver: str) -> None:
    """Make a CSI PV of `driver` and a claim bound to it for each name (the PV binder binds them)."""
    for name in names:
        await storage.volume(csi_volume(f"{namespace}-{name}", driver, storage_class))
        await storage.claim(namespace, volume_claim(name, storage_class, selector={"for": f"{namespace}-{name}"}))

    async def bound() -> tuple[bool, str]:
        claims = await storage.claims(namespace)
        phases = {name: (claims.get(name) or {}).get("status", {}).get("phase") for name in names}
        return all(phase == "Bound" for phase in phases.values()), str(phases)

    await until(bound, timeout=90, what="the PV binder to bind the claims")


async def test_pods_beyond_a_node_s_attach_limit_wait_counting_the_volumes_already_there(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A node whose CSINode allows two volumes of the driver. A pod created on it directly (by another writer)
    mounts one; a pod with a second volume is placed there; then a pod with a third waits with kube-scheduler's
    reason, while a pod mounting the first pod's volume (attached already: counted once) is placed. Once the second
    pod is deleted, the waiting one is placed."""
    driver = f"{namespace.split('-', 1)[0]}.csi.test.hoss.io"
    async with two_sets(cluster, 1) as sets, storage_objects(cluster) as storage, workers(plane, TWO), \
            attach_limits(cluster, driver, {sets[s][1][0]: 2 for s, _prefix in SCHEDULERS}):
        immediate = await storage.storage_class(f"{namespace}-imm", mode="Immediate")
        outcomes = {}
        for scheduler, prefix in SCHEDULERS:
            tag, [node] = sets[scheduler]
            await bound_claims(storage, namespace, [f"{prefix}-first", f"{prefix}-second", f"{prefix}-third"],
                               immediate, driver)
            first, second, third, sharing = hoss_pods(f"{prefix}att", 4)
            with_claims(first, f"{prefix}-first")
            first["spec"]["nodeName"] = node  # placed by another writer: its volume counts all the same
            with_claims(second, f"{prefix}-second")
            with_claims(third, f"{prefix}-third")
            with_claims(sharing, f"{prefix}-first")
            [first_name] = await cluster.create_pods([first], namespace=namespace)
            [second_name] = await cluster.create_pods(for_scheduler([second], scheduler, tag), namespace=namespace)
            placed = await wait_bound(cluster, namespace, [second_name])
            third_name, sharing_name = await cluster.create_pods(for_scheduler([third, sharing], scheduler, tag),
                                                                 namespace=namespace)
            placed |= await wait_bound(cluster, namespace, [sharing_name])
            reason = await wait_reason(cluster, namespace, third_name, f"1 {MAX_VOLUME_COUNT}")
            await cluster.core.delete_namespaced_pod(second_name, namespace, grace_period_seconds=0)
            later = await wait_bound(cluster, namespace, [third_name], timeout=180)
            outcomes[scheduler] = (placed[second_name] == node, placed[sharing_name] == node,
                                   reason.startswith("0/"), later[third_name] == node,
                                   await node_of(cluster, namespace, first_name) == node)
        assert outcomes["hoss"] == outcomes["default-scheduler"] == (True, True, True, True, True), outcomes
        assert await pending(cluster, namespace) == []


async def test_two_workers_racing_for_a_node_s_last_attach_slots_never_exceed_its_limit(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A node whose CSINode allows three volumes of the driver, one used by a pod placed there by another writer,
    and eight pods with a volume each, half for each of two workers (policies default and binpack), released at
    once: exactly two are bound, and the other six wait with kube-scheduler's reason."""
    driver = f"{namespace.split('-', 1)[0]}.race.csi.test.hoss.io"
    # each worker reads the others' reservations up to a second late (--feed-linger-ms, at its most): both decide on
    # a pod index that lacks the other's pods, the race the ledger's promise of the slots must settle
    async with node_set(cluster, 1, labels={"vol-set": "attach-race"}) as [node], \
            storage_objects(cluster) as storage, workers(plane, TWO, extra_args=["--feed-linger-ms=1000"]), \
            attach_limits(cluster, driver, {node: 3}):
        immediate = await storage.storage_class(f"{namespace}-imm", mode="Immediate")
        names = [f"slot-{i}" for i in range(8)]
        await bound_claims(storage, namespace, ["resident", *names], immediate, driver)
        [resident] = hoss_pods("resident", 1)
        resident["spec"]["nodeName"] = node
        await cluster.create_pods([with_claims(resident, "resident")], namespace=namespace)
        pods = []
        for i, claim in enumerate(names):
            [pod] = hoss_pods(f"slot{i}", 1, policy="binpack" if i % 2 else None)
            pod["spec"]["schedulingGates"] = [{"name": "test.hoss.io/together"}]
            pods.append(with_claims(pod, claim))
        created = await cluster.create_pods(pinned(pods, "vol-set", "attach-race"), namespace=namespace)
        # the gates go at once, so both workers get their pods together
        await asyncio.gather(*(cluster.core.patch_namespaced_pod(
            name, namespace, [{"op": "remove", "path": "/spec/schedulingGates"}]) for name in created))

        async def settled() -> tuple[bool, str]:
            waiting = await pending(cluster, namespace)
            assert len(waiting) >= 6, f"more pods bound than the node's attach limit allows; pending: {waiting}"
            reasons = [(await scheduled_condition(cluster, namespace, name))[1] for name in waiting]
            return (len(waiting) == 6 and all(f"1 {MAX_VOLUME_COUNT}" in r for r in reasons),
                    f"{waiting}: {reasons[:2]}")

        await until(settled, timeout=120, what="two pods bound and six waiting for an attach slot")
        placed = [p["metadata"]["name"] for p in await cluster.raw_list("list_namespaced_pod", namespace)
                  if p["spec"].get("nodeName") == node]
        assert len(placed) == 3 and "resident-0000" in placed, placed


async def test_an_in_tree_disk_is_mounted_once_per_node_unless_every_pod_mounts_it_read_only(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """VolumeRestrictions' disk conflicts on one node per scheduler: a pod mounting a gcePersistentDisk read-write is
    placed, a second pod mounting it waits with kube-scheduler's reason until the first is deleted; two pods mounting
    another disk read-only share the node."""
    async with two_sets(cluster, 1) as sets, workers(plane, TWO):
        outcomes = {}
        for scheduler, prefix in SCHEDULERS:
            tag, [node] = sets[scheduler]
            writer, second, reader, other_reader = hoss_pods(f"{prefix}disk", 4)
            for pod, disk, read_only in ((writer, "data", False), (second, "data", False),
                                         (reader, "shared", True), (other_reader, "shared", True)):
                pod["spec"]["volumes"] = [{"name": "disk", "gcePersistentDisk": {"pdName": f"{prefix}-{disk}",
                                                                                 "readOnly": read_only}}]
            [writer_name] = await cluster.create_pods(for_scheduler([writer], scheduler, tag), namespace=namespace)
            placed = await wait_bound(cluster, namespace, [writer_name])
            names = await cluster.create_pods(for_scheduler([second, reader, other_reader], scheduler, tag),
                                              namespace=namespace)
            placed |= await wait_bound(cluster, namespace, names[1:])
            reason = await wait_reason(cluster, namespace, names[0], "1 node(s) had no available disk")
            await cluster.core.delete_namespaced_pod(writer_name, namespace, grace_period_seconds=0)
            later = await wait_bound(cluster, namespace, names[:1], timeout=180)
            outcomes[scheduler] = (sorted(set(placed.values()) | set(later.values())) == [node],
                                   reason.startswith("0/"))
        assert outcomes["hoss"] == outcomes["default-scheduler"] == (True, True), outcomes
        assert await pending(cluster, namespace) == []
