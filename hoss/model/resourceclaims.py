"""What a pending pod's ResourceClaims (resource.k8s.io/v1, Dynamic Resource Allocation) need, as kube-scheduler's
DynamicResources plugin reads them. Pure: the dispatcher keeps the DRA objects (`DeviceCatalog`, from its watches
of ResourceClaims, ResourceSlices and DeviceClasses) and puts `device_context` of each pod with claims into its
compact form under `DEVICES`; the worker's DynamicResources plugin (`hoss.framework.plugins.devices`) reads only
that, never the apiserver.

The context is one of:

- ``{"problem": text}``: no node can take the pod now, in kube-scheduler's words (its PreFilter's
  Unschedulable): a claim not created yet (a template's, made by the resourceclaim controller), missing, being
  deleted, not the pod's, or asking a DeviceClass that does not exist. The claim's change changes the context,
  so the dispatcher sends the pod again.
- ``{"claims": [...], ...}``: each claim in the pod's order with its uid and resourceVersion; an allocated one with
  its allocation (its node selector decides the nodes; the worker only adds the pod to ``reservedFor``), an
  unallocated one with its ``spec.devices``. When any is unallocated the context also carries what allocating it
  reads: the DeviceClasses its requests name (``classes``), the ResourceSlices (``slices``: name, generation-less
  spec; only the slices of the drivers the classes name when each names its driver in a selector
  ``device.driver == "..."``, as most do, so a pod does not carry every driver's devices) and the devices other
  claims hold already (``allocated``: [driver, pool, device], admin access aside).
  A pod asking extended resources that DeviceClasses serve (`hoss.model.dra`) has ``extended``: per resource (by
  name) its class, device requests and container mappings, for the claim made for it on a node that leaves the
  resource to DRA; ``stale`` names that claim when an earlier attempt made it already (the worker deletes it first,
  as kube-scheduler's PostFilter does). Its classes, slices and allocated devices come with it as above.

Keys of the claims carry their resourceVersion, so the worker's allocation (`workers.devices`) is written only on
the version the decision read: the apiserver refuses a status write to a claim that changed since.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hoss.errors import SpecError
from hoss.model.catalog import ObjectCatalog, object_name, object_namespace
from hoss.model.dra import EXTENDED_CLAIM_ANNOTATION, class_for, extended_requests, extended_resource_names
from hoss.model.objects import Json, section
from hoss.model.resources import pod_requests

DEVICES = "devices"
"""Top-level key of a compact pod with what its ResourceClaims need (`device_context`); absent for a pod without."""

NOT_CREATED = "ResourceClaim not created yet"


@dataclass
class DeviceCatalog(ObjectCatalog):
    """The DRA objects a dispatcher knows, as its watches keep them (raw objects, by key)."""

    claims: dict[tuple[str, str], Json] = field(default_factory=dict)
    """ResourceClaims by (namespace, name)."""
    slices: dict[str, Json] = field(default_factory=dict)
    """ResourceSlices by name."""
    classes: dict[str, Json] = field(default_factory=dict)
    """DeviceClasses by name."""

    KINDS: ClassVar[tuple[str, ...]] = ("claims", "slices", "classes")
    NAMESPACED: ClassVar[frozenset[str]] = frozenset({"claims"})
    _extended: dict[str, Json] | None = field(default=None, repr=False, compare=False)
    """The claims made for pods' extended resources, by owning pod uid; built on first use after the claims change."""

    def replace(self, kind: str, items: list[Json]) -> None:
        super().replace(kind, items)
        if kind == "claims":
            self._extended = None

    def apply(self, kind: str, event: str, raw: Json) -> None:
        super().apply(kind, event, raw)
        if kind == "claims":
            self._extended = None

    def extended_claim(self, pod_uid: str) -> Json | None:
        """The claim made for the pod's extended resources by an earlier attempt (annotated, the pod its
        controlling owner)."""
        if self._extended is None:
            self._extended = {}
            for claim in self.claims.values():
                if section(section(claim, "metadata"), "annotations").get(EXTENDED_CLAIM_ANNOTATION) != "true":
                    continue
                owners = section(claim, "metadata").get("ownerReferences")
                for ref in owners if isinstance(owners, list) else []:
                    if isinstance(ref, dict) and ref.get("controller") is True and ref.get("uid"):
                        self._extended[str(ref["uid"])] = claim
        return self._extended.get(pod_uid)

    def allocated_devices(self, *, besides: frozenset[str] = frozenset()) -> list[list[str]]:
        """The devices the claims' allocations hold (admin access aside), except those of the claims whose uid
        is in `besides`: [driver, pool, device], sorted."""
        held: set[tuple[str, str, str]] = set()
        for claim in self.claims.values():
            if str(section(claim, "metadata").get("uid") or "") in besides:
                continue
            held.update(allocation_devices(claim))
        return [list(device) for device in sorted(held)]

    def extended_names(self) -> frozenset[str]:
        """The extended resource names the DeviceClasses serve (`hoss.model.dra.extended_resource_names`)."""
        return frozenset[str]().union(*(extended_resource_names(raw) for raw in self.classes.values()))


def allocation_devices(claim: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The devices a claim's status.allocation holds (results with admin access hold none)."""
    results = section(section(section(dict(claim), "status"), "allocation"), "devices").get("results")
    held = []
    for result in results if isinstance(results, list) else []:
        if isinstance(result, dict) and not result.get("adminAccess"):
            held.append((str(result.get("driver") or ""), str(result.get("pool") or ""),
                         str(result.get("device") or "")))
    return held


def pod_claim_names(pod: Mapping[str, Any]) -> list[tuple[str, str | None, bool]] | str:
    """The ResourceClaims a (raw or compact) pod uses, as kube-scheduler's resourceclaim.Name finds them: per
    spec.resourceClaims entry (entry name, claim name, made from a template); claim name None for a template's
    claim the controller chose not to create. A problem text instead when an entry's claim is not known yet."""
    spec = section(dict(pod), "spec")
    metadata = section(dict(pod), "metadata")
    pod_key = f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"
    statuses = section(dict(pod), "status").get("resourceClaimStatuses")
    made = {str(entry.get("name")): entry.get("resourceClaimName")
            for entry in (statuses if isinstance(statuses, list) else []) if isinstance(entry, dict)}
    found: list[tuple[str, str | None, bool]] = []
    entries = spec.get("resourceClaims")
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        name = str(entry.get("name") or "")
        if entry.get("resourceClaimName"):
            found.append((name, str(entry["resourceClaimName"]), False))
        elif entry.get("resourceClaimTemplateName"):
            if name not in made:
                return f'pod "{pod_key}": {NOT_CREATED}'
            claim = made[name]
            found.append((name, str(claim) if claim else None, True))
        else:
            return f'pod "{pod_key}", spec.resourceClaim "{name}": none of the supported fields are set'
    return found


def _owned_by(claim: Mapping[str, Any], uid: str) -> bool:
    owners = section(dict(claim), "metadata").get("ownerReferences")
    return any(isinstance(ref, dict) and ref.get("controller") is True and ref.get("uid") == uid
               for ref in (owners if isinstance(owners, list) else []))


def _class_problem(claim: Mapping[str, Any], classes: Mapping[str, Json]) -> str | None:
    """kube-scheduler's PreFilter check of a claim to allocate: every request's (and subrequest's) class exists."""
    devices = section(section(dict(claim), "spec"), "devices")
    requests = devices.get("requests")
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, dict):
            continue
        name = str(request.get("name") or "")
        exactly = request.get("exactly")
        alternatives = request.get("firstAvailable")
        if isinstance(exactly, dict):
            wanted = [(name, str(exactly.get("deviceClassName") or ""))]
        elif isinstance(alternatives, list) and alternatives:
            wanted = [(f"{name}/{sub.get('name', '')}", str(sub.get("deviceClassName") or ""))
                      for sub in alternatives if isinstance(sub, dict)]
        else:
            return (f"resource claim {object_namespace(claim)}/{object_name(claim)}, request {name}: "
                    f"unknown request type")
        for request_name, class_name in wanted:
            if class_name not in classes:
                return f"request {request_name}: device class {class_name} does not exist"
    return None


def _class_names(claim: Mapping[str, Any]) -> set[str]:
    devices = section(section(dict(claim), "spec"), "devices")
    names: set[str] = set()
    requests = devices.get("requests")
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            names.add(str(request["exactly"].get("deviceClassName") or ""))
        for sub in request.get("firstAvailable") or []:
            if isinstance(sub, dict):
                names.add(str(sub.get("deviceClassName") or ""))
    return names


_DRIVER_SELECTOR = re.compile(r"""\s*device\.driver\s*==\s*(?:"([^"\\]+)"|'([^'\\]+)')\s*""")
"""A class selector that names its driver alone, as most DeviceClasses do: ``device.driver == "gpu.example.com"``."""


def _drivers(classes: Mapping[str, Json]) -> frozenset[str] | None:
    """The drivers whose devices the classes can select, when each class names its driver in a selector of its own
    (a device must pass every selector of its class); None when some class does not (every slice may matter)."""
    found: set[str] = set()
    for raw in classes.values():
        named = None
        for selector in section(raw, "spec").get("selectors") or []:
            expression = section(selector, "cel").get("expression") if isinstance(selector, dict) else None
            if isinstance(expression, str) and (match := _DRIVER_SELECTOR.fullmatch(expression)):
                named = match.group(1) or match.group(2)
                break
        if named is None:
            return None
        found.add(named)
    return frozenset(found)


def extended_context(pod: Mapping[str, Any], catalog: DeviceCatalog) -> list[Json]:
    """Per extended resource the pod asks that a DeviceClass serves (by name): the class, the device requests and
    the container mappings (`hoss.model.dra.extended_requests`); empty when it asks none."""
    found = []
    try:
        asked = pod_requests(pod)
    except SpecError:
        return []  # the worker refuses the pod by its parse, naming the field
    for resource, amount in sorted(asked.items()):
        if amount <= 0 or "/" not in resource or (name := class_for(resource, catalog.classes)) is None:
            continue
        requests, mappings = extended_requests(pod, resource, name)
        found.append({"resource": resource, "class": name, "requests": requests, "mappings": mappings})
    return found


def device_context(pod: Mapping[str, Any], catalog: DeviceCatalog) -> Json | None:
    """What the pod's ResourceClaims and its extended resources DeviceClasses serve need (see the module
    docstring); None for a pod without either."""
    spec = section(dict(pod), "spec")
    extended = extended_context(pod, catalog) if catalog.classes else []
    if not spec.get("resourceClaims") and not extended:
        return None
    named = pod_claim_names(pod)
    if isinstance(named, str):
        return {"problem": named}
    metadata = section(dict(pod), "metadata")
    namespace = str(metadata.get("namespace") or "default")
    pod_uid = str(metadata.get("uid") or "")
    claims: list[Json] = []
    to_allocate: list[Json] = []
    for entry, name, templated in named:
        if name is None:
            continue  # the controller chose not to make this claim: nothing to allocate
        claim = catalog.claims.get((namespace, name))
        if claim is None:
            return {"problem": f'resourceclaim.resource.k8s.io "{name}" not found'}
        claim_meta = section(claim, "metadata")
        if claim_meta.get("deletionTimestamp"):
            return {"problem": f'resourceclaim "{name}" is being deleted'}
        if templated and not _owned_by(claim, pod_uid):
            return {"problem": f"ResourceClaim {namespace}/{name} was not created for Pod "
                               f"{namespace}/{metadata.get('name') or ''} (Pod is not owner)"}
        described: Json = {"entry": entry, "claim": name, "uid": str(claim_meta.get("uid") or ""),
                           "rv": str(claim_meta.get("resourceVersion") or "")}
        allocation = section(claim, "status").get("allocation")
        if isinstance(allocation, dict):
            described["allocation"] = allocation
            reserved = section(claim, "status").get("reservedFor")
            described["reserved"] = any(isinstance(ref, dict) and ref.get("uid") == pod_uid
                                        for ref in (reserved if isinstance(reserved, list) else []))
        else:
            if (problem := _class_problem(claim, catalog.classes)) is not None:
                return {"problem": problem}
            described["devices"] = section(section(claim, "spec"), "devices")
            to_allocate.append(claim)
        claims.append(described)
    context: Json = {"claims": claims}
    besides = {str(section(claim, "metadata").get("uid") or "") for claim in to_allocate}
    if extended:
        context["extended"] = extended
        if (stale := catalog.extended_claim(pod_uid)) is not None and object_namespace(stale) == namespace:
            stale_meta = section(stale, "metadata")
            context["stale"] = {"claim": str(stale_meta.get("name") or ""), "uid": str(stale_meta.get("uid") or "")}
            besides.add(context["stale"]["uid"])
    if to_allocate or extended:
        wanted = set().union(*(_class_names(claim) for claim in to_allocate), (e["class"] for e in extended))
        context["classes"] = {name: section(catalog.classes[name], "spec") for name in sorted(wanted)}
        drivers = _drivers({name: catalog.classes[name] for name in wanted})
        context["slices"] = [{"name": name, "spec": section(raw, "spec")}
                             for name, raw in sorted(catalog.slices.items())
                             if drivers is None or section(raw, "spec").get("driver") in drivers]
        context["allocated"] = catalog.allocated_devices(besides=frozenset(besides))
    return context


def pod_claims_problem(form: Mapping[str, Any]) -> str:
    """The problem of a compact pod's `DEVICES` context ('' when it has none): its claims are not there to use."""
    context = form.get(DEVICES)
    return str(context.get("problem") or "") if isinstance(context, dict) else ""
