"""GPUs that are DRA devices (resource.k8s.io/v1), as the planner counts them. Pure.

The planner counts GPUs per node and per pod (`rescheduler.plan`). Where GPUs are published as DRA devices, no node
has the GPU resource in allocatable; this module counts them from the DRA objects instead:

- a device is a GPU when the DeviceClass that serves the GPU resource selects it (the class whose
  ``spec.extendedResourceName`` names it, the oldest of several, as kube-scheduler resolves it:
  `hoss.model.dra.class_for`); without such a class no device counts;
- a node's device GPUs are those its node-local ResourceSlices publish; the GPUs used there are those some claim's
  allocation holds;
- a pod's device GPUs are those the allocations of its ResourceClaims hold (a pod asking the GPU resource itself
  is counted by that request already, and its claim is left out).

A pod whose GPUs are devices moves only between nodes whose GPUs are devices, and only when each of its claims is a
template's (the claim goes with the pod; the replacement gets a new one); a shared claim stays allocated where it
is. The ledger does not count device GPUs, so the room held for such a pod leaves them out (`held`); the devices on
the target are not held: another pod may take them first, and the replacement then waits or goes elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hoss.errors import HossError
from hoss.model import devices as dra
from hoss.model.devices.cel import CelError, device_matches
from hoss.model.devices.claims import parse_device_class
from hoss.model.dra import class_for
from hoss.model.objects import Json, section
from hoss.model.resourceclaims import allocation_devices, pod_claim_names


@dataclass
class DeviceGpus:
    """The device GPUs of a cluster."""

    nodes: dict[str, int] = field(default_factory=dict)
    """node -> GPUs its node-local slices publish"""
    used: dict[str, int] = field(default_factory=dict)
    """node -> those some claim's allocation holds"""
    claims: dict[tuple[str, str], int] = field(default_factory=dict)
    """(namespace, claim) -> the GPUs its allocation holds"""
    served: bool = False
    """Some DeviceClass serves the GPU resource: a pod asking it gets devices on a node without it."""

    def pod_gpus(self, pod: Mapping[str, Any]) -> int:
        """The GPUs the pod's ResourceClaims hold."""
        named = pod_claim_names(pod)
        if isinstance(named, str):
            return 0
        namespace = str(section(dict(pod), "metadata").get("namespace") or "default")
        return sum(self.claims.get((namespace, name), 0) for _entry, name, _templated in named if name)


def device_gpus(*, slices: Iterable[Json], claims: Iterable[Json], classes: Iterable[Json],
                resource: str) -> DeviceGpus:
    """The devices the class serving `resource` selects, per node and per claim (see the module docstring)."""
    by_name = {str(section(raw, "metadata").get("name") or ""): raw for raw in classes}
    found = DeviceGpus()
    serving = class_for(resource, by_name)
    if serving is None:
        return found
    found.served = True
    try:
        selectors = parse_device_class(by_name[serving]).selectors
    except HossError:
        return found  # a class hoss cannot read selects nothing here; the workers say why for the pods asking it
    where: dict[dra.DeviceId, str] = {}
    for raw in slices:
        try:
            parsed = dra.parse_slice(raw)
        except dra.DeviceError:
            continue
        if not parsed.node_name:
            continue  # network-attached devices belong to no one node
        for device in parsed.devices:
            if _selected(selectors, device.cel):
                where[device.id] = parsed.node_name
                found.nodes[parsed.node_name] = found.nodes.get(parsed.node_name, 0) + 1
    for claim in claims:
        metadata = section(claim, "metadata")
        held = [where[held_id] for held_id in allocation_devices(claim) if held_id in where]
        if held:
            key = (str(metadata.get("namespace") or "default"), str(metadata.get("name") or ""))
            found.claims[key] = len(held)
            for node in held:
                found.used[node] = found.used.get(node, 0) + 1
    return found


def _selected(selectors: Iterable[str], device: Any) -> bool:
    try:
        return all(device_matches(expression, device) for expression in selectors)
    except CelError:
        return False


def claims_movable(pod: Mapping[str, Any]) -> str:
    """'' when every ResourceClaim of the pod is made from a template (it goes with the pod), else why not."""
    named = pod_claim_names(pod)
    if isinstance(named, str):
        return named
    shared = [name for _entry, name, templated in named if name and not templated]
    return f"ResourceClaim {shared[0]} is not the pod's own (it stays allocated where it is)" if shared else ""
