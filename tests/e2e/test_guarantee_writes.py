"""Pod writes that got around the guard or stopped it (issue 33), each on the real plane: a forged mirror pod, a pod
created under a name another pod holds, one user's creates that the apiserver refuses after the webhook, and a pod
asking for an extended resource that a DeviceClass backs with DRA devices. Every test here ends with the
independent oversell check (conftest's no_node_oversold), unless it oversells on purpose.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from hoss.kube.client import request_json
from tests.e2e.guard import create, pod_on, refused
from tests.waiting import until

MIRROR = {"kubernetes.io/config.mirror": "forged"}
NODES_GROUP = "system:nodes"


async def nodes(cluster: Cluster, prefix: str, cpu: str, *, count: int = 1,
                labels: dict[str, str] | None = None) -> list[str]:
    names = await cluster.create_nodes(count, prefix=prefix, capacity={"cpu": cpu, "memory": "8Gi", "pods": "110"},
                                       labels=labels)
    await cluster.wait_nodes_ready(names)
    return names


async def cleanup(cluster: Cluster, namespace: str, node_names: list[str]) -> None:
    await cluster.delete_pods(namespace)
    await cluster.delete_nodes(node_names)


async def bound_to(cluster: Cluster, namespace: str, name: str, node: str, *, what: str) -> None:
    async def bound() -> tuple[bool, str]:
        pod = await request_json(cluster.core.read_namespaced_pod, name, namespace)
        return pod["spec"].get("nodeName") == node, f"nodeName {pod['spec'].get('nodeName')!r}"

    await until(bound, timeout=60, what=what)


# -- item 4: a forged mirror pod ------------------------------------------------------------------------------


async def test_a_forged_mirror_pod_is_judged_like_any_pod(cluster: Cluster, namespace: str) -> None:
    (node,) = await nodes(cluster, "g4-forged", "2")
    try:
        await create(cluster, namespace, pod_on("full", node, "2"))
        error = await refused(create(cluster, namespace, pod_on("forged", node, "16", annotations=MIRROR)))
        assert f"hoss: node {node} has no room for {namespace}/forged: cpu requested 16, free 0" in str(error)
    finally:
        await cleanup(cluster, namespace, [node])


@pytest.mark.oversells
async def test_a_nodes_own_mirror_pod_is_let_through_even_onto_a_full_node(
    plane: LocalPlane, cluster: Cluster, namespace: str, tmp_path: Path,
) -> None:
    (node,) = await nodes(cluster, "g4-own", "2")
    # The kubelet's identity, as a node authenticates: system:node:<name> in group system:nodes.
    plane.kubectl("create", "role", "pod-writer", "--verb=create", "--resource=pods", "-n", namespace)
    plane.kubectl("create", "rolebinding", "nodes-write-pods", "--role=pod-writer", f"--group={NODES_GROUP}",
                  "-n", namespace)
    manifest = tmp_path / "mirror.json"
    manifest.write_text(json.dumps(pod_on("static-web", node, "1", annotations=MIRROR)))
    try:
        await create(cluster, namespace, pod_on("full", node, "2"))
        plane.kubectl("create", "-n", namespace, "-f", str(manifest), f"--as=system:node:{node}",
                      f"--as-group={NODES_GROUP}")
        mirror = await request_json(cluster.core.read_namespaced_pod, "static-web", namespace)
        assert mirror["spec"]["nodeName"] == node, "the kubelet runs its static pod whatever the apiserver says"
    finally:
        await cleanup(cluster, namespace, [node])


# -- item 6: room pinned by a create that failed --------------------------------------------------------------


async def test_a_create_under_a_taken_name_holds_no_room(cluster: Cluster, namespace: str) -> None:
    (node,) = await nodes(cluster, "g6-taken", "2")
    try:
        await create(cluster, namespace, pod_on("taken", None, "100m"))  # pending: nobody schedules it
        error = await refused(create(cluster, namespace, pod_on("taken", node, "2")))
        assert error.status == 409 and 'pods "taken" already exists' in str(error)
        # The failed create held nothing: a pod needing the whole node gets it at once.
        await create(cluster, namespace, pod_on("after", node, "2"))
    finally:
        await cleanup(cluster, namespace, [node])


@pytest.fixture
async def quota_namespace(cluster: Cluster, plane: LocalPlane, namespace: str) -> AsyncIterator[str]:
    """A namespace whose ResourceQuota refuses every pod asking more than 1 CPU. ResourceQuota admission runs after
    the validating webhooks, so the resolver admits such a pod's create before the apiserver refuses it. The plane
    runs no resource quota controller, so the quota's status is written here (admission enforces what it says)."""
    name = f"{namespace}-quota"[:63]
    await cluster.ensure_namespace(name)
    hard = {"requests.cpu": "1"}
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-cpu"}, "spec": {"hard": hard}}
    await request_json(cluster.core.create_namespaced_resource_quota, name, quota)
    await request_json(cluster.core.patch_namespaced_resource_quota_status, "one-cpu", name,
                       {"status": {"hard": hard, "used": {"requests.cpu": "0"}}})
    yield name
    await cluster.delete_pods(name)
    plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


async def test_one_users_creates_refused_after_the_webhook_pin_at_most_one_nodes_room(
    cluster: Cluster, namespace: str, quota_namespace: str,
) -> None:
    label = {"hoss-test": namespace[:63]}
    pinned, spare = await nodes(cluster, "g6-pin", "2", count=2, labels=label)
    try:
        # Admitted by the resolver, refused by ResourceQuota: the room stays held until the write is surely over.
        error = await refused(create(cluster, quota_namespace, pod_on("over-0", pinned, "2")))
        assert error.status == 403, error
        # The same user's next such create is refused by the resolver: its unconfirmed creates hold a node's room.
        error = await refused(create(cluster, quota_namespace, pod_on("over-1", spare, "2")))
        assert error.status == 429 and "not yet confirmed hold 2 cpu" in str(error), error
        # The victim may go only to the spare node: were the pinned node a candidate too, kube-scheduler would pick
        # between two equal nodes at random and back off after each refused binding to the pinned one.
        victim = pod_on("victim", None, "2", scheduler="default-scheduler")
        victim["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [spare]}]}]}}}
        await create(cluster, namespace, victim)
        await bound_to(cluster, namespace, "victim", spare, what="kube-scheduler to bind the victim to the spare node")
    finally:
        await cleanup(cluster, namespace, [pinned, spare])


# -- item 10: extended resources backed by DRA ----------------------------------------------------------------


@pytest.fixture
async def dra_node(cluster: Cluster, namespace: str) -> AsyncIterator[tuple[str, str]]:
    """A node with two devices published in a ResourceSlice and a DeviceClass that maps an extended resource to them
    (resource.k8s.io/v1; DRAExtendedResource is beta and on by default in Kubernetes 1.36, the plane's version):
    the node's name and the resource. Torn down after the oversell check, which must see the DeviceClass."""
    (node,) = await nodes(cluster, "g10-dra", "4", labels={"hoss-test": namespace[:63]})
    resource = f"example.com/{namespace[:40]}-gpu"
    dra: Any = client.ResourceV1Api(cluster.api)
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": node},
                    "spec": {"extendedResourceName": resource}}
    slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": node},
              "spec": {"driver": "gpu.example.com", "nodeName": node,
                       "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                       "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}
    await request_json(dra.create_device_class, device_class)
    await request_json(dra.create_resource_slice, slice_)
    yield node, resource
    await cluster.delete_pods(namespace)
    for delete in (dra.delete_resource_slice, dra.delete_device_class):
        await request_json(delete, node)
    await cluster.delete_nodes([node])


async def test_a_pod_asking_a_dra_backed_extended_resource_is_bound_by_the_scheduler_that_owns_it(
    cluster: Cluster, namespace: str, dra_node: tuple[str, str],
) -> None:
    node, resource = dra_node
    pod = pod_manifest("dra", requests={"cpu": "1", "memory": "64Mi", resource: "1"})
    pod["spec"]["containers"][0]["resources"]["limits"] = {resource: "1"}  # extended resources are not overcommitted
    pod["spec"]["nodeSelector"] = {"hoss-test": namespace[:63]}
    await create(cluster, namespace, pod)
    await bound_to(cluster, namespace, "dra", node, what="kube-scheduler to bind the pod to the node with devices")
    # Its CPU is guarded as ever: the node's 4 CPUs hold 1 already.
    error = await refused(create(cluster, namespace, pod_on("more", node, "4")))
    assert f"hoss: node {node} has no room for {namespace}/more: cpu requested 4, free 3" in str(error)
