"""Extended resources backed by DRA devices: which names DeviceClasses map, and what of a pod's request the ledger
counts on a node. Pure, no I/O.

Since Kubernetes 1.36 (feature gate DRAExtendedResource, beta and on by default) a pod may ask for an extended
resource that a DeviceClass (resource.k8s.io/v1) maps to devices: its ``spec.extendedResourceName``, and always
``deviceclass.resource.kubernetes.io/<class name>``. No node lists such a resource in its allocatable; on a node
that has none of it, kube-scheduler's NodeResourcesFit leaves it to the DynamicResources plugin, which allocates
devices through a ResourceClaim (``shouldDelegateResourceToDRA``, pkg/scheduler/framework/plugins/noderesources/
fit.go). A node whose allocatable has the resource (a device plugin serves it there) is fit-checked as usual.

The ledger counts a pod by the same rule (`without_dra`): the devices are the scheduler's and the DRA driver's
business, the rest of the request (CPU, memory, ...) is guarded as any other. hoss itself places no such pod yet.

Invariant: `DeviceClasses.names` is the union of the names every class it was given maps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from hoss.model.objects import Json
from hoss.model.resources import ResourceVector

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
"""The extended resource name every DeviceClass maps, followed by the class's name."""


def extended_resource_names(device_class: Json) -> frozenset[str]:
    """The extended resources a DeviceClass maps to its devices: the implicit name, and spec.extendedResourceName
    when set."""
    name = (device_class.get("metadata") or {}).get("name")
    explicit = (device_class.get("spec") or {}).get("extendedResourceName")
    names = {f"{IMPLICIT_PREFIX}{name}"} if isinstance(name, str) and name else set()
    if isinstance(explicit, str) and explicit:
        names.add(explicit)
    return frozenset(names)


def without_dra(request: Mapping[str, int], *, allocatable: Mapping[str, int], dra: Set[str]) -> ResourceVector:
    """``request`` as a node with ``allocatable`` counts it: without each resource a DeviceClass maps (``dra``) that
    the node has none of, which kube-scheduler leaves to DRA there."""
    return {resource: amount for resource, amount in request.items()
            if resource not in dra or allocatable.get(resource, 0) > 0}


@dataclass
class DeviceClasses:
    """The cluster's DeviceClasses as the names they map, kept from a list and watch of them."""

    by_class: dict[str, frozenset[str]] = field(default_factory=dict)
    names: frozenset[str] = frozenset()
    """every extended resource name some DeviceClass maps"""

    def replace(self, items: Iterable[Json]) -> frozenset[str]:
        """Take a full list; returns the names that came or went."""
        self.by_class = {str((item.get("metadata") or {}).get("name")): extended_resource_names(item)
                         for item in items}
        return self._update()

    def apply(self, kind: str, device_class: Json) -> frozenset[str]:
        """Take one watch event (ADDED, MODIFIED, DELETED); returns the names that came or went."""
        name = str((device_class.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self.by_class.pop(name, None)
        else:
            self.by_class[name] = extended_resource_names(device_class)
        return self._update()

    def _update(self) -> frozenset[str]:
        names = frozenset[str]().union(*self.by_class.values())
        changed, self.names = names ^ self.names, names
        return changed
