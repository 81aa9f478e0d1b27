"""The local plane's fake GPUs: what its fake DRA driver (dev/local/dradriver.py) publishes for a kwok node, read
from the node's labels. Pure: a node in, resource.k8s.io/v1 objects out.

A node asks for GPUs with the label ``dra.hoss.dev/gpus: "<N>"`` (1 to 128, the most devices one ResourceSlice
holds; "0" asks for none) and may name their model with ``dra.hoss.dev/gpu-model`` (default ``h100``). Its slice
holds devices ``gpu-0`` .. ``gpu-<N-1>`` of driver ``gpu.dra.hoss.dev``, each with the attributes a GPU driver
publishes: ``model`` (string), ``index`` (int), ``nvlinkDomain`` (int: the first half of the GPUs is domain 0, the
second half domain 1) and ``resource.kubernetes.io/pcieRoot`` (string: one PCIe root per pair of GPUs, the
standard attribute Kubernetes compares across drivers), and their ``memory`` capacity (80Gi). The DeviceClass
``gpu.dra.hoss.dev`` selects every device of the driver.

Invariant: one node has at most one slice, named ``<node>-gpu.dra.hoss.dev``, the only slice of its pool (the node's
name); the pool's generation goes up by one whenever its devices change.
"""

from __future__ import annotations

from collections.abc import Mapping

from hoss.model.objects import Json, section

DRIVER = "gpu.dra.hoss.dev"
"""The fake driver's name: its ResourceSlices' ``spec.driver``, the domain of its attributes, its DeviceClass."""
DEVICE_CLASS = DRIVER
GPUS_LABEL = "dra.hoss.dev/gpus"
"""A node with this label asks the fake driver for that many GPUs."""
MODEL_LABEL = "dra.hoss.dev/gpu-model"
"""The model of a node's fake GPUs (attribute ``model``); ``DEFAULT_MODEL`` without it."""
DEFAULT_MODEL = "h100"
GPU_MEMORY = "80Gi"
MAX_DEVICES = 128
"""resource.k8s.io/v1's ResourceSliceMaxDevices: the most devices one slice may hold."""
NVLINK_DOMAIN = f"{DRIVER}/nvlinkDomain"
"""The attribute's fully qualified name, as a claim's ``matchAttribute`` names it."""
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
MAX_NAME_LENGTH = 253
"""An object name's limit (a DNS subdomain)."""


class UnpublishableNode(ValueError):
    """The fake driver cannot publish GPUs for this node (a bad label value, a name too long for its slice's); the
    message names the node and the field."""

    def __init__(self, *, node: str, reason: str) -> None:
        self.node = node
        self.reason = reason
        super().__init__(f"node {node}: {reason}")


def node_name(node: Mapping[str, object]) -> str:
    name = section(node, "metadata").get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a node without metadata.name: {dict(node)!r:.200}")
    return name


def requested_gpus(node: Mapping[str, object]) -> tuple[int, str]:
    """How many fake GPUs the node asks for (0: none) and their model; raises UnpublishableNode on a bad label."""
    name = node_name(node)
    labels = section(section(node, "metadata"), "labels")
    raw = labels.get(GPUS_LABEL)
    if raw is None:
        return 0, DEFAULT_MODEL
    count = int(raw) if isinstance(raw, str) and raw.isdigit() else -1
    if not 0 <= count <= MAX_DEVICES:
        raise UnpublishableNode(node=name, reason=f"label {GPUS_LABEL}={raw!r}: expected a whole number of GPUs "
                                                  f"from 0 to {MAX_DEVICES}")
    return count, str(labels.get(MODEL_LABEL) or DEFAULT_MODEL)


def node_devices(node: Mapping[str, object]) -> list[Json]:
    """The devices the node's labels ask for (none: an empty list); raises UnpublishableNode when the driver cannot
    publish them (a bad label, a node name too long for its slice's)."""
    count, model = requested_gpus(node)
    if count:
        slice_name(node_name(node))
    return gpu_devices(count, model=model)


def gpu_devices(count: int, *, model: str) -> list[Json]:
    """``count`` GPUs as a ResourceSlice lists them: two NVLink domains of half the GPUs each, a PCIe root per
    pair."""
    return [
        {
            "name": f"gpu-{index}",
            "attributes": {
                "model": {"string": model},
                "index": {"int": index},
                "nvlinkDomain": {"int": index * 2 // count},
                PCIE_ROOT: {"string": f"pci{index // 2:04x}:00"},
            },
            "capacity": {"memory": {"value": GPU_MEMORY}},
        }
        for index in range(count)
    ]


def slice_name(node: str) -> str:
    """``<node>-gpu.dra.hoss.dev``; raises UnpublishableNode when that is longer than an object name may be."""
    name = f"{node}-{DRIVER}"
    if len(name) > MAX_NAME_LENGTH:
        raise UnpublishableNode(node=node, reason=f"metadata.name {name!r} of its ResourceSlice would be longer than "
                                                  f"{MAX_NAME_LENGTH} characters")
    return name


def resource_slice(node: str, *, devices: list[Json], generation: int) -> Json:
    """The node's ResourceSlice: its devices in one pool named after the node, as a node-local driver writes it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


EXTENDED_RESOURCE = "dra.hoss.dev/gpu"
"""The extended resource the DeviceClass serves: a pod asking it gets fake GPUs through a claim made for it."""


def device_class() -> Json:
    """The DeviceClass of the fake GPUs: every device of the driver, also served as `EXTENDED_RESOURCE`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                 "extendedResourceName": EXTENDED_RESOURCE},
    }
