"""The local plane's fake DRA driver: what a node's labels ask for becomes one ResourceSlice that hoss reads as a
node-local pool (dev/local/devices.py), and the driver writes a node's slice only when its devices change, with the
pool's generation one higher, deletes the slices of nodes that went, and writes nothing where resource.k8s.io/v1 is
not served (dev/local/dradriver.py, against an in-memory ResourceSlice store)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from dev.local.devices import (
    DEVICE_CLASS,
    DRIVER,
    GPUS_LABEL,
    MODEL_LABEL,
    NVLINK_DOMAIN,
    PCIE_ROOT,
    UnpublishableNode,
    device_class,
    node_devices,
    resource_slice,
)
from dev.local.dradriver import FakeDriver, install_device_class
from hoss.model.devices.inventory import Inventory
from hoss.model.objects import Json


def node(name: str, **labels: str) -> Json:
    return {"metadata": {"name": name, "labels": labels}}


def test_a_node_asking_for_eight_gpus_gets_a_pool_hoss_reads_with_two_nvlink_domains_of_four() -> None:
    asking = node("gpu-a", **{GPUS_LABEL: "8", MODEL_LABEL: "a100"})
    published = resource_slice("gpu-a", devices=node_devices(asking), generation=1)

    assert published["spec"]["nodeName"] == "gpu-a" and published["spec"]["driver"] == DRIVER
    assert published["spec"]["pool"] == {"name": "gpu-a", "generation": 1, "resourceSliceCount": 1}
    [pool] = Inventory.from_slices([published]).pools_for(node="gpu-a", labels={})
    devices = list(pool.all_devices())
    assert pool.usable and [d.id[2] for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert [d.attribute(NVLINK_DOMAIN) for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [d.attribute(f"{DRIVER}/index") for d in devices] == list(range(8))
    assert {d.attribute(f"{DRIVER}/model") for d in devices} == {"a100"}
    assert [d.attribute(PCIE_ROOT) for d in devices][::2] == ["pci0000:00", "pci0001:00", "pci0002:00", "pci0003:00"]
    assert {d.capacity["memory"] for d in devices} == {80 * 2**30}
    assert Inventory.from_slices([published]).pools_for(node="another", labels={}) == []


def test_the_model_defaults_to_h100_and_an_odd_count_puts_the_middle_gpu_in_the_first_domain() -> None:
    devices = node_devices(node("gpu-b", **{GPUS_LABEL: "3"}))
    assert [d["attributes"]["nvlinkDomain"]["int"] for d in devices] == [0, 0, 1]
    assert {d["attributes"]["model"]["string"] for d in devices} == {"h100"}


@pytest.mark.parametrize("labels", [{}, {GPUS_LABEL: "0"}, {MODEL_LABEL: "a100"}])
def test_a_node_without_the_label_or_asking_for_zero_gets_no_devices(labels: dict[str, str]) -> None:
    assert node_devices(node("plain", **labels)) == []


@pytest.mark.parametrize("value", ["lots", "-1", "129", "8.5", ""])
def test_a_label_the_driver_cannot_publish_is_refused_naming_the_node_the_label_and_its_value(value: str) -> None:
    with pytest.raises(UnpublishableNode) as raised:
        node_devices(node("gpu-c", **{GPUS_LABEL: value}))
    assert str(raised.value).startswith(f"node gpu-c: label {GPUS_LABEL}={value!r}: expected a whole number")


def test_a_node_whose_slice_name_would_be_too_long_is_refused_naming_the_field() -> None:
    long_name = "n" * 240
    with pytest.raises(UnpublishableNode, match=r"metadata.name .* longer than 253 characters"):
        node_devices(node(long_name, **{GPUS_LABEL: "1"}))


def test_the_device_class_selects_every_device_of_the_driver() -> None:
    assert device_class()["metadata"]["name"] == DEVICE_CLASS
    assert device_class()["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]


@dataclass
class Answer:
    """An apiserver response as the generated client hands it back with ``_preload_content=False``."""

    status: int
    body: bytes = b"{}"

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass


@dataclass
class ResourceStore:
    """resource.k8s.io/v1 as the driver calls it (ResourceV1Api's methods), kept in memory; ``served=False`` answers
    404 as an apiserver without the API does."""

    served: bool = True
    slices: dict[str, Json] = field(default_factory=dict)
    classes: dict[str, Json] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)

    def _answer(self, body: object) -> Answer:
        return Answer(200, orjson.dumps(body)) if self.served else Answer(404, b'{"message": "not found"}')

    async def list_resource_slice(self, **kwargs: Any) -> Answer:
        driver = str(kwargs.get("field_selector", "")).removeprefix("spec.driver=")
        items = [s for s in self.slices.values() if s["spec"]["driver"] == driver]
        return self._answer({"metadata": {"resourceVersion": "1"}, "items": items})

    async def patch_resource_slice(self, name: str, body: Json, **kwargs: Any) -> Answer:
        assert kwargs["_content_type"] == "application/apply-patch+yaml" and kwargs["force"] is True
        self.slices[name] = body
        self.writes.append(f"apply {name} generation {body['spec']['pool']['generation']}")
        return self._answer(body)

    async def delete_resource_slice(self, name: str, **_: Any) -> Answer:
        if self.slices.pop(name, None) is None:
            return Answer(404, b'{"message": "not found"}')
        self.writes.append(f"delete {name}")
        return self._answer({})

    async def list_device_class(self, **_: Any) -> Answer:
        return self._answer({"metadata": {"resourceVersion": "1"}, "items": list(self.classes.values())})

    async def patch_device_class(self, name: str, body: Json, **_: Any) -> Answer:
        self.classes[name] = body
        self.writes.append(f"apply class {name}")
        return self._answer(body)


async def test_the_driver_writes_a_slice_when_the_devices_change_and_deletes_it_when_the_node_goes() -> None:
    store = ResourceStore()
    driver = FakeDriver(store)
    await driver.on_list([node("a", **{GPUS_LABEL: "2"})])
    await driver.on_event("MODIFIED", node("a", **{GPUS_LABEL: "2"}))  # a status update: nothing to write
    await driver.on_event("MODIFIED", node("a", **{GPUS_LABEL: "4"}))
    await driver.on_event("MODIFIED", node("a", **{GPUS_LABEL: "none"}))
    await driver.on_event("MODIFIED", node("a", **{GPUS_LABEL: "1"}))
    await driver.on_event("DELETED", node("a", **{GPUS_LABEL: "1"}))
    slice_ = f"a-{DRIVER}"
    assert store.writes == [f"apply {slice_} generation 1", f"apply {slice_} generation 2", f"delete {slice_}",
                            f"apply {slice_} generation 1", f"delete {slice_}"]
    assert store.slices == {}


async def test_a_new_list_keeps_what_is_published_and_deletes_the_slices_of_nodes_that_went() -> None:
    store = ResourceStore()
    before = FakeDriver(store)
    await before.on_list([node("kept", **{GPUS_LABEL: "2"}), node("gone", **{GPUS_LABEL: "2"})])
    store.writes.clear()
    after = FakeDriver(store)  # a driver started again, or listing again after 410 Gone
    await after.on_list([node("kept", **{GPUS_LABEL: "2"})])
    assert store.writes == [f"delete gone-{DRIVER}"]
    assert list(store.slices) == [f"kept-{DRIVER}"]


async def test_where_resource_v1_is_not_served_the_driver_applies_no_device_class() -> None:
    store = ResourceStore(served=False)
    assert await install_device_class(store) is False
    assert store.writes == []
    served = ResourceStore()
    assert await install_device_class(served) is True
    assert served.classes == {DEVICE_CLASS: device_class()}
