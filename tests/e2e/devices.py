"""DRA objects an e2e test makes on the shared plane (DeviceClasses, ResourceSlices as a node-local driver writes
them, ResourceClaims and templates), deleted after it, and what the test reads back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio import client

from dev.local.cluster import Cluster
from hoss.model.objects import Json
from tests.e2e.hoss import delete_each

DRIVER = "gpu.example.com"


def gpu(name: str, *, model: str = "a100", memory: str = "40Gi", nvlink: int = 0) -> Json:
    """One device as a GPU driver publishes it: a model, an NVLink domain and its memory."""
    return {"name": name, "attributes": {"model": {"string": model}, "nvlink": {"int": nvlink},
                                         "driverVersion": {"version": "1.2.3"}},
            "capacity": {"memory": {"value": memory}}}


class Devices:
    """DeviceClasses and ResourceSlices a test makes, deleted after it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.api: Any = client.ResourceV1Api(cluster.api)
        self.classes: list[str] = []
        self.slices: list[str] = []

    async def device_class(self, name: str, *, expression: str = f'device.driver == "{DRIVER}"',
                           extended: str | None = None) -> str:
        spec: Json = {"selectors": [{"cel": {"expression": expression}}]}
        if extended is not None:
            spec["extendedResourceName"] = extended
        await self.api.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                            "metadata": {"name": name}, "spec": spec})
        self.classes.append(name)
        return name

    async def publish(self, node: str, devices: Sequence[Json]) -> None:
        """The node's devices in one ResourceSlice of its own pool, as a node-local DRA driver writes it."""
        name = f"{node}-{DRIVER}"
        await self.api.create_resource_slice({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": list(devices)}})
        self.slices.append(name)

    async def publish_partitioned(self, node: str, *, memory: str, parts: dict[str, str]) -> None:
        """One GPU of `memory` as partitions (name -> the memory each draws on the GPU's counter), in a pool of two
        slices: the counters and the devices, as a driver of partitionable devices publishes them."""
        counters = "gpu-0-memory"
        for kind, extra in (("counters", {"sharedCounters": [{"name": counters,
                                                               "counters": {"memory": {"value": memory}}}]}),
                            ("devices", {"devices": [
                                {"name": name, "attributes": {"profile": {"string": "whole" if size == memory
                                                                          else "half"}},
                                 "consumesCounters": [{"counterSet": counters,
                                                       "counters": {"memory": {"value": size}}}]}
                                for name, size in parts.items()]})):
            name = f"{node}-{DRIVER}-{kind}"
            await self.api.create_resource_slice({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
                "spec": {"driver": DRIVER, "nodeName": node,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 2}, **extra}})
            self.slices.append(name)

    async def claim(self, namespace: str, name: str, requests: Sequence[Json],
                    constraints: Sequence[Json] = ()) -> None:
        spec: Json = {"devices": {"requests": list(requests)}}
        if constraints:
            spec["devices"]["constraints"] = list(constraints)
        await self.api.create_namespaced_resource_claim(namespace, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec})

    async def template(self, namespace: str, name: str, requests: Sequence[Json]) -> None:
        await self.api.create_namespaced_resource_claim_template(namespace, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}})

    async def claims(self, namespace: str) -> list[Json]:
        body = await self.api.list_namespaced_resource_claim(namespace, _preload_content=False)
        items: list[Json] = (await body.json())["items"]
        return items

    async def delete(self) -> None:
        await delete_each(((self.api.delete_resource_slice, self.slices),
                           (self.api.delete_device_class, self.classes)))


def request(name: str, device_class: str, *, count: int = 1, expression: str | None = None) -> Json:
    exactly: Json = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if expression is not None:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {"name": name, "exactly": exactly}


def with_claim(pod: Json, *, claim: str | None = None, template: str | None = None) -> Json:
    entry: Json = {"name": "gpus"}
    if claim is not None:
        entry["resourceClaimName"] = claim
    if template is not None:
        entry["resourceClaimTemplateName"] = template
    pod["spec"]["resourceClaims"] = [entry]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    return pod


@asynccontextmanager
async def device_objects(cluster: Cluster) -> AsyncIterator[Devices]:
    made = Devices(cluster)
    try:
        yield made
    finally:
        await made.delete()


def allocated(claims: Sequence[Json]) -> list[tuple[str, str, str]]:
    """Every device the claims' allocations hold (one entry per allocation result)."""
    return [(result["driver"], result["pool"], result["device"])
            for claim in claims for result in
            ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])]
