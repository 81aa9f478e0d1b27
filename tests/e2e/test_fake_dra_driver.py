"""The local plane's fake DRA driver on the real plane: a kwok node labelled ``dra.hoss.dev/gpus`` gets one
ResourceSlice of that many GPUs, as a node-local driver publishes it; a node without the label gets none; the slice
follows a new label value (pool generation one higher) and goes when the node is deleted."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from dev.local.cluster import Cluster
from dev.local.devices import DEVICE_CLASS, DRIVER, GPUS_LABEL, MODEL_LABEL, PCIE_ROOT
from hoss.kube.client import request_json
from hoss.model.objects import Json
from tests.waiting import until

CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}
TIMEOUT = 60.0


async def driver_slices(cluster: Cluster) -> dict[str, Json]:
    """The fake driver's ResourceSlices, by node."""
    api: Any = client.ResourceV1Api(cluster.api)
    body = await request_json(api.list_resource_slice, field_selector=f"spec.driver={DRIVER}")
    return {s["spec"]["nodeName"]: s for s in body["items"]}


async def slice_of(cluster: Cluster, node: str, *, devices: int) -> Json:
    """The node's slice, once it holds ``devices`` devices."""
    found: dict[str, Json] = {}

    async def published() -> tuple[bool, str]:
        found.update(await driver_slices(cluster))
        held = len(found[node]["spec"].get("devices") or []) if node in found else None
        return held == devices, f"{node}'s slice holds {held} devices" if held is not None else f"no slice of {node}"

    await until(published, timeout=TIMEOUT, what=f"{node}'s ResourceSlice with {devices} devices")
    return found[node]


async def test_a_labelled_kwok_node_gets_a_slice_of_its_gpus_and_an_unlabelled_node_none(cluster: Cluster) -> None:
    # The unlabelled node first: the driver hears of nodes in the order they are made, so once the labelled node's
    # slice is there, the unlabelled node had its chance.
    plain = await cluster.create_nodes(1, prefix="dra-plain", capacity=CAPACITY)
    asking = await cluster.create_nodes(1, prefix="dra-asking", capacity=CAPACITY,
                                        labels={GPUS_LABEL: "4", MODEL_LABEL: "a100"})
    try:
        published = await slice_of(cluster, asking[0], devices=4)
        spec = published["spec"]
        assert published["metadata"]["name"] == f"{asking[0]}-{DRIVER}"
        assert spec["driver"] == DRIVER and spec["nodeName"] == asking[0]
        assert spec["pool"] == {"name": asking[0], "generation": 1, "resourceSliceCount": 1}
        assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        assert [d["attributes"]["nvlinkDomain"]["int"] for d in spec["devices"]] == [0, 0, 1, 1]
        assert [d["attributes"]["index"]["int"] for d in spec["devices"]] == [0, 1, 2, 3]
        assert [d["attributes"][PCIE_ROOT]["string"] for d in spec["devices"]] == ["pci0000:00", "pci0000:00",
                                                                                   "pci0001:00", "pci0001:00"]
        assert {d["attributes"]["model"]["string"] for d in spec["devices"]} == {"a100"}
        assert {d["capacity"]["memory"]["value"] for d in spec["devices"]} == {"80Gi"}
        assert plain[0] not in await driver_slices(cluster)
        api: Any = client.ResourceV1Api(cluster.api)
        devices_class = await request_json(api.read_device_class, DEVICE_CLASS)
        assert devices_class["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    finally:
        await cluster.delete_nodes([*plain, *asking])


async def test_the_slice_follows_the_label_and_is_deleted_with_the_node(cluster: Cluster) -> None:
    [name] = await cluster.create_nodes(1, prefix="dra-relabel", capacity=CAPACITY, labels={GPUS_LABEL: "2"})
    try:
        await slice_of(cluster, name, devices=2)
        await cluster.call(cluster.core.patch_node, name, {"metadata": {"labels": {GPUS_LABEL: "8"}}})
        relabelled = await slice_of(cluster, name, devices=8)
        assert relabelled["spec"]["pool"]["generation"] == 2
    finally:
        await cluster.delete_nodes([name])

    async def withdrawn() -> tuple[bool, str]:
        left = await driver_slices(cluster)
        return name not in left, f"slices of {sorted(left)}"

    await until(withdrawn, timeout=TIMEOUT, what=f"{name}'s ResourceSlice to be deleted with the node")
