"""What the storage e2e tests share: the storage objects they make (classes, PVs, claims, CSIDrivers), node sets
for kube-scheduler and for hoss, and pods with claims."""


from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio import client

from dev.local.cluster import Cluster
from hoss.model.objects import Json
from tests.e2e.hoss import (
    delete_each,
    node_set,
    pinned,
)

TWO = [("vol-0", ["default"]), ("vol-1", ["binpack"])]
"""Two workers, each serving one policy: pods of both policies make them race for the same volumes."""
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
SCHEDULERS = (("default-scheduler", "k"), ("hoss", "h"))
NO_PROVISIONER = "kubernetes.io/no-provisioner"
_tags = itertools.count()


def node_affinity(node: str) -> Json:
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOST, "operator": "In", "values": [node]}]}]}}


def local_volume(name: str, node: str | None, storage_class: str, *, size: str = "10Gi",
                 labels: dict[str, str] | None = None, mode: str = "ReadWriteOnce") -> Json:
    """A static PV of `storage_class`; on `node` (a local volume) or, without one, anywhere its labels allow."""
    spec: Json = {"capacity": {"storage": size}, "accessModes": [mode], "storageClassName": storage_class,
                  "persistentVolumeReclaimPolicy": "Retain"}
    if node is not None:
        spec |= {"local": {"path": f"/mnt/{name}"}, "nodeAffinity": node_affinity(node)}
    else:
        spec["hostPath"] = {"path": f"/mnt/{name}"}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "labels": labels or {}},
            "spec": spec}


def volume_claim(name: str, storage_class: str, *, size: str = "1Gi", selector: dict[str, str] | None = None,
                 mode: str = "ReadWriteOnce") -> Json:
    """A claim; with `selector`, only PVs with those labels can take it."""
    spec: Json = {"accessModes": [mode], "storageClassName": storage_class,
                  "resources": {"requests": {"storage": size}}}
    if selector:
        spec["selector"] = {"matchLabels": selector}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def with_claims(pod: Json, *claims: str) -> Json:
    pod["spec"]["volumes"] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": claim}}
                              for i, claim in enumerate(claims)]
    return pod


def for_scheduler(pods: list[Json], scheduler: str, set_label: str) -> list[Json]:
    for pod in pinned(pods, "vol-set", set_label):
        pod["spec"]["schedulerName"] = scheduler
    return pods


class Storage:
    """Cluster-scoped storage objects a test makes (classes, PVs, CSIDrivers), deleted after it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.core: Any = cluster.core
        self.storage: Any = client.StorageV1Api(cluster.api)
        self.classes: list[str] = []
        self.volumes: list[str] = []
        self.drivers: list[str] = []

    async def storage_class(self, name: str, *, mode: str, provisioner: str = NO_PROVISIONER,
                            topologies: list[Json] | None = None) -> str:
        body: Json = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
                      "provisioner": provisioner, "volumeBindingMode": mode}
        if topologies is not None:
            body["allowedTopologies"] = topologies
        await self.storage.create_storage_class(body)
        self.classes.append(name)
        return name

    async def volume(self, manifest: Json) -> str:
        await self.core.create_persistent_volume(manifest)
        self.volumes.append(manifest["metadata"]["name"])
        return str(manifest["metadata"]["name"])

    async def claim(self, namespace: str, manifest: Json) -> None:
        await self.core.create_namespaced_persistent_volume_claim(namespace, manifest)

    async def driver(self, name: str) -> None:
        await self.storage.create_csi_driver({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                                              "metadata": {"name": name},
                                              "spec": {"storageCapacity": True, "attachRequired": False}})
        self.drivers.append(name)

    async def capacity(self, namespace: str, name: str, *, storage_class: str, labels: dict[str, str],
                       size: str) -> None:
        await self.storage.create_namespaced_csi_storage_capacity(namespace, {
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity", "metadata": {"name": name},
            "storageClassName": storage_class, "nodeTopology": {"matchLabels": labels}, "capacity": size})

    async def claims(self, namespace: str) -> dict[str, Json]:
        body = await self.cluster.raw_list("list_namespaced_persistent_volume_claim", namespace)
        return {c["metadata"]["name"]: c for c in body}

    async def pv_nodes(self) -> dict[str, str]:
        """PV name -> the node its node affinity names (the first value), for every PV with one."""
        found = {}
        for pv in await self.cluster.raw_list("list_persistent_volume"):
            terms = ((pv["spec"].get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms") or []
            for term in terms:
                for expression in term.get("matchExpressions") or []:
                    if expression.get("key") == HOST:
                        found[pv["metadata"]["name"]] = expression["values"][0]
        return found

    async def delete(self) -> None:
        await delete_each(((self.core.delete_persistent_volume, self.volumes),
                           (self.storage.delete_storage_class, self.classes),
                           (self.storage.delete_csi_driver, self.drivers)))


@asynccontextmanager
async def storage_objects(cluster: Cluster) -> AsyncIterator[Storage]:
    made = Storage(cluster)
    try:
        yield made
    finally:
        await made.delete()


@asynccontextmanager
async def two_sets(cluster: Cluster, count: int, *,
                   labels: Sequence[dict[str, str]] | None = None) -> AsyncIterator[dict[str, tuple[str, list[str]]]]:
    """`count` nodes for kube-scheduler and `count` for hoss (node i of each with ``labels[i]``): scheduler ->
    (the set's label value, its nodes in order)."""
    tag = f"vs{next(_tags)}"
    sets: dict[str, tuple[str, list[str]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for scheduler, prefix in SCHEDULERS:
            names: list[str] = []
            for i in range(count):
                extra = (labels[i] if labels else {})
                [name] = await stack.enter_async_context(
                    node_set(cluster, 1, labels={"vol-set": f"{tag}{prefix}", **extra}))
                names.append(name)
            sets[scheduler] = (f"{tag}{prefix}", names)
        yield sets
