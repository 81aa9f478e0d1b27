"""Extended resources backed by DRA devices: which names DeviceClasses map, and what of a pod's request the ledger
counts on a node. Pure, no I/O.

Since Kubernetes 1.36 (feature gate DRAExtendedResource, beta and on by default) a pod may ask for an extended
resource that a DeviceClass (resource.k8s.io/v1) maps to devices: its ``spec.extendedResourceName``, and always
``deviceclass.resource.kubernetes.io/<class name>``. No node lists such a resource in its allocatable; on a node
that has none of it, kube-scheduler's NodeResourcesFit leaves it to the DynamicResources plugin, which allocates
devices through a ResourceClaim (``shouldDelegateResourceToDRA``, pkg/scheduler/framework/plugins/noderesources/
fit.go). A node whose allocatable has the resource (a device plugin serves it there) is fit-checked as usual.

The ledger counts a pod by the same rule (`without_dra`): the devices are the scheduler's and the DRA driver's
business, the rest of the request (CPU, memory, ...) is guarded as any other.

hoss places such a pod as kube-scheduler does (extendeddynamicresources.go): the resource's class is the one
`class_for` names (an explicit name maps to the oldest class that sets it); each container asks its own request
named ``container-<i>-request-<j>`` (`extended_requests`: init containers that run before the others reuse the
long-lived containers' requests and share the largest of their own), and on a node that leaves the resource to DRA
the requests of every such resource form one ResourceClaim, made for the pod when it binds (annotated
``resource.kubernetes.io/extended-resource-claim: "true"``, owned by the pod); the pod's
``status.extendedResourceClaimStatus`` maps each container's resource to its request.

Invariant: `DeviceClasses.names` is the union of the names every class it was given maps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from hoss.model.objects import Json, section
from hoss.model.resources import ResourceVector, parse_quantity

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


EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
"""The annotation (value "true") of the ResourceClaim a scheduler makes for a pod's extended resources."""


def class_for(resource: str, classes: Mapping[str, Json]) -> str | None:
    """The DeviceClass (by name, of `classes` by name) that serves the extended resource `resource`, as
    kube-scheduler's extended resource cache resolves it: the implicit name names its class; an explicit
    ``spec.extendedResourceName`` maps to the oldest class that sets it (the first by name among equals)."""
    if resource.startswith(IMPLICIT_PREFIX):
        name = resource[len(IMPLICIT_PREFIX):]
        return name if name in classes else None
    setting = [(str(section(raw, "metadata").get("creationTimestamp") or ""), name)
               for name, raw in classes.items() if section(raw, "spec").get("extendedResourceName") == resource]
    return min(setting)[1] if setting else None


def _count(container: Mapping[str, object], resource: str) -> int:
    """The container's request of `resource` as a whole count (0 when it asks none or a fraction)."""
    requests = section(section(dict(container), "resources"), "requests")
    value = requests.get(resource)
    if not isinstance(value, (str, int, float)):
        return 0
    amount = parse_quantity(value, field=f"resources.requests[{resource}]")
    return int(amount) if amount.denominator == 1 else 0


def _request_name(index: int, container: Mapping[str, object], resource: str) -> str:
    """``container-<i>-request-<j>``: i the container's place among init containers then containers, j the
    resource's among the container's requests sorted by name."""
    names = sorted(str(name) for name in section(section(dict(container), "resources"), "requests"))
    return f"container-{index}-request-{names.index(resource) if resource in names else 0}"


def extended_requests(pod: Mapping[str, object], resource: str, class_name: str) -> tuple[list[Json], list[Json]]:
    """The device requests (sorted by name) and the container mappings (``{containerName, resourceName,
    requestName}``) with which the pod asks `resource` of the DeviceClass `class_name`, as kube-scheduler's
    createRequestsAndMappings: each long-lived container (regular, or a restartable init container) asks its own
    count; an init container that runs before them first reuses the requests of the long-lived containers after
    it, asks only what they lack, and all such init requests become the largest one."""
    spec = section(dict(pod), "spec")
    inits = [c for c in spec.get("initContainers") or [] if isinstance(c, dict)]
    containers = [*inits, *(c for c in spec.get("containers") or [] if isinstance(c, dict))]

    def request(index: int, count: int) -> Json:
        return {"name": _request_name(index, containers[index], resource),
                "exactly": {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": count}}

    def mapping(index: int, name: str) -> Json:
        return {"containerName": str(containers[index].get("name") or ""), "resourceName": resource,
                "requestName": name}

    short_lived = [i for i in range(len(inits)) if containers[i].get("restartPolicy") != "Always"]
    long_requests: dict[int, Json] = {}
    long_mappings: list[Json] = []
    for index in (i for i in range(len(containers)) if i not in short_lived):
        if (count := _count(containers[index], resource)) > 0:
            long_requests[index] = request(index, count)
            long_mappings.append(mapping(index, long_requests[index]["name"]))
    largest: Json | None = None
    short_names: set[str] = set()
    short_mappings: list[Json] = []
    for index in short_lived:
        wanted = _count(containers[index], resource)
        if wanted <= 0:
            continue
        reused = 0
        for later in sorted(i for i in long_requests if i >= index):
            reused += long_requests[later]["exactly"]["count"]
            short_mappings.append(mapping(index, long_requests[later]["name"]))
            if reused >= wanted:
                break
        if reused >= wanted:
            continue
        own = request(index, wanted - reused)
        short_names.add(own["name"])
        short_mappings.append(mapping(index, own["name"]))
        if largest is None or largest["exactly"]["count"] < own["exactly"]["count"]:
            largest = own
    if largest is not None:
        short_mappings = [{**m, "requestName": largest["name"]} if m["requestName"] in short_names else m
                          for m in short_mappings]
    requests = ([largest] if largest is not None else []) + list(long_requests.values())
    return sorted(requests, key=lambda r: str(r["name"])), long_mappings + short_mappings


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
