"""What a pending pod's volume claims need of a node, as kube-scheduler's VolumeBinding and VolumeZone read them.
Pure: the dispatcher keeps the storage objects (`StorageCatalog`, from its watches of PersistentVolumeClaims,
PersistentVolumes, StorageClasses, CSIDrivers and CSIStorageCapacities) and puts `storage_context` of each pod into
its compact form under `STORAGE`; the worker's VolumeBinding plugin (`hoss.framework.plugins.volumes`) reads only
that, never the apiserver.

The context is one of:

- ``{"problem": text}``: the pod cannot be scheduled anywhere now, in kube-scheduler's words (its PreFilter's
  UnschedulableAndUnresolvable): a claim missing, being deleted or lost, an ephemeral claim not created yet or not
  the pod's, a claim that is neither bound nor waiting for its first consumer ("pod has unbound immediate
  PersistentVolumeClaims"). The claim's change changes the context, so the dispatcher sends the pod again.
- ``{"bound": [...], "delayed": [...], "rwop": [...]}``: the fully bound claims with their PV's node affinity and
  zone labels, and the claims of a WaitForFirstConsumer class with the PVs that could take them (class, access modes,
  capacity, volume mode, selector and pre-binding already checked here: only the node affinity is left to the
  node), and how their class provisions (provisioner, allowedTopologies, the CSIStorageCapacities that apply);
  ``rwop`` names the claims with the ReadWriteOncePod access mode (VolumeRestrictions), when there are any.

Keys of the claims and PVs carry their resourceVersion, so the worker's writes (`workers.volumes`) are made only
on the versions the decision read: the apiserver refuses a write to a PV or a claim that changed since.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hoss.errors import QuantityError
from hoss.model.compact import claim_names, requirement_holds
from hoss.model.objects import Json, section
from hoss.model.resources import parse_quantity

STORAGE = "storage"
"""Top-level key of a compact pod with what its claims need (`storage_context`); absent for a pod without."""

BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
ZONE_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region",
               "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region")
"""The PV labels VolumeZone matches against the node's (kube-scheduler's topologyLabels)."""

UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"


def _name(obj: Mapping[str, Any]) -> str:
    return str(section(dict(obj), "metadata").get("name") or "")


def _namespace(obj: Mapping[str, Any]) -> str:
    return str(section(dict(obj), "metadata").get("namespace") or "default")


@dataclass
class StorageCatalog:
    """The storage objects a dispatcher knows, as its watches keep them (raw objects, by key)."""

    claims: dict[tuple[str, str], Json] = field(default_factory=dict)
    """PersistentVolumeClaims by (namespace, name)."""
    volumes: dict[str, Json] = field(default_factory=dict)
    """PersistentVolumes by name."""
    classes: dict[str, Json] = field(default_factory=dict)
    """StorageClasses by name."""
    drivers: dict[str, Json] = field(default_factory=dict)
    """CSIDrivers by name (those with spec.storageCapacity get their capacities checked)."""
    capacities: dict[tuple[str, str], Json] = field(default_factory=dict)
    """CSIStorageCapacities by (namespace, name)."""

    KINDS = ("claims", "volumes", "classes", "drivers", "capacities")

    def key(self, kind: str, raw: Mapping[str, Any]) -> Any:
        return (_namespace(raw), _name(raw)) if kind in ("claims", "capacities") else _name(raw)

    def replace(self, kind: str, items: list[Json]) -> None:
        """The watch of `kind` listed `items`."""
        setattr(self, kind, {self.key(kind, raw): raw for raw in items if _name(raw)})

    def apply(self, kind: str, event: str, raw: Json) -> None:
        """One watch event of `kind`."""
        if not _name(raw):
            return
        table: dict[Any, Json] = getattr(self, kind)
        if event == "DELETED":
            table.pop(self.key(kind, raw), None)
        else:
            table[self.key(kind, raw)] = raw


def pod_claims(pod: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """The claims a (raw or compact) pod's volumes use (`hoss.model.compact.claim_names`)."""
    return claim_names(pod)


def _bytes(value: object) -> int:
    """A storage quantity in bytes (0 when it is not one: the apiserver validated it)."""
    if not isinstance(value, str | int) or isinstance(value, bool):
        return 0
    try:
        return int(parse_quantity(value, field="storage"))
    except QuantityError:
        return 0


def _request(claim: Mapping[str, Any]) -> int:
    resources = section(section(dict(claim), "spec"), "resources")
    return _bytes(section(resources, "requests").get("storage"))


def _capacity(pv: Mapping[str, Any]) -> int:
    return _bytes(section(section(dict(pv), "spec"), "capacity").get("storage"))


def claim_class(claim: Mapping[str, Any]) -> str:
    """The claim's class (spec.storageClassName; '' for none), as kube-scheduler's GetPersistentVolumeClaimClass."""
    spec = section(dict(claim), "spec")
    return str(spec.get("storageClassName") or "")


def fully_bound(claim: Mapping[str, Any]) -> bool:
    """spec.volumeName set and the bind-completed annotation: kube-scheduler's isPVCFullyBound."""
    annotations = section(section(dict(claim), "metadata"), "annotations")
    return bool(section(dict(claim), "spec").get("volumeName")) and BIND_COMPLETED in annotations


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    pairs = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(pairs, dict) or not isinstance(expressions, list):
        return False
    if any(labels.get(key) != value for key, value in pairs.items()):
        return False
    for expression in expressions:
        if not isinstance(expression, dict):
            return False
        values = expression.get("values") or []
        if not requirement_holds(str(expression.get("operator")), values if isinstance(values, list) else [],
                                 labels.get(str(expression.get("key")))):
            return False
    return True


def _bound_to(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """kube-scheduler's IsVolumeBoundToClaim: the PV's claimRef names the claim (and its uid, when it has one)."""
    ref = section(section(dict(pv), "spec"), "claimRef")
    metadata = section(dict(claim), "metadata")
    if ref.get("name") != metadata.get("name") or (ref.get("namespace") or "default") != _namespace(claim):
        return False
    return not ref.get("uid") or ref.get("uid") == metadata.get("uid")


def _modes(obj: Mapping[str, Any]) -> set[str]:
    modes = section(dict(obj), "spec").get("accessModes")
    return {str(mode) for mode in modes} if isinstance(modes, list) else set()


def _volume_mode(obj: Mapping[str, Any]) -> str:
    return str(section(dict(obj), "spec").get("volumeMode") or "Filesystem")


def candidate_volumes(claim: Mapping[str, Any], volumes: Mapping[str, Json]) -> list[Json]:
    """The PVs that could take an unbound claim on some node, as kube-scheduler's FindMatchingVolume checks them
    except for the node affinity (left to the node): the claim's class, free (or pre-bound to this claim),
    large enough, the same volume mode, every access mode the claim asks, its selector, not being deleted and
    without a VolumeAttributesClass. A PV pre-bound to the claim comes first (it is the only one the claim may
    take), then by capacity, smallest first, as kube-scheduler picks the smallest that fits."""
    wanted_class = claim_class(claim)
    wanted = _request(claim)
    modes = _modes(claim)
    selector = section(dict(claim), "spec").get("selector")
    found: list[tuple[int, int, str, Json]] = []
    for name, pv in volumes.items():
        spec = section(pv, "spec")
        metadata = section(pv, "metadata")
        prebound = _bound_to(pv, claim)
        if spec.get("claimRef") and not prebound:
            continue
        if str(spec.get("storageClassName") or "") != wanted_class or metadata.get("deletionTimestamp"):
            continue
        if _capacity(pv) < wanted or _volume_mode(pv) != _volume_mode(claim) or spec.get("volumeAttributesClassName"):
            continue
        if not modes <= _modes(pv):
            continue
        labels = metadata.get("labels") if isinstance(metadata.get("labels"), dict) else {}
        if isinstance(selector, dict) and not _selector_matches(selector, labels or {}):
            continue
        affinity = section(section(spec, "nodeAffinity"), "required")
        found.append((0 if prebound else 1, _capacity(pv), name, {
            "name": name, "rv": str(metadata.get("resourceVersion") or ""), "size": _capacity(pv),
            "affinity": affinity.get("nodeSelectorTerms") if affinity else None, "prebound": prebound}))
    found.sort(key=lambda entry: entry[:3])
    return [entry[3] for entry in found]


def _capacities(claim: Mapping[str, Any], *, class_name: str, provisioner: str,
                catalog: StorageCatalog) -> list[Json] | None:
    """The CSIStorageCapacities of the claim's class, when its CSI driver asks for capacity checks (None: no check,
    as kube-scheduler's hasEnoughCapacity when the claim asks no storage or the driver does not opt in)."""
    if "storage" not in section(section(section(dict(claim), "spec"), "resources"), "requests"):
        return None
    driver = catalog.drivers.get(provisioner)
    if driver is None or section(driver, "spec").get("storageCapacity") is not True:
        return None
    found = []
    for capacity in catalog.capacities.values():
        if capacity.get("storageClassName") != class_name:
            continue
        limit = capacity.get("maximumVolumeSize") if capacity.get("maximumVolumeSize") is not None \
            else capacity.get("capacity")
        if limit is None or not isinstance(capacity.get("nodeTopology"), dict):
            continue
        found.append({"topology": capacity["nodeTopology"], "size": _bytes(limit)})
    return found


def storage_context(pod: Mapping[str, Any], catalog: StorageCatalog) -> Json | None:
    """What the pod's claims need (see the module docstring); None for a pod without claims."""
    claims = pod_claims(pod)
    if not claims:
        return None
    metadata = section(dict(pod), "metadata")
    namespace = str(metadata.get("namespace") or "default")
    bound: list[Json] = []
    delayed: list[Json] = []
    once: list[str] = []
    immediate = False
    for name, ephemeral in claims:
        claim = catalog.claims.get((namespace, name))
        if claim is None:
            if ephemeral:
                return {"problem": f"waiting for ephemeral volume controller to create the persistentvolumeclaim "
                                   f"\"{name}\""}
            return {"problem": f"persistentvolumeclaim \"{name}\" not found"}
        spec = section(claim, "spec")
        claim_meta = section(claim, "metadata")
        if section(claim, "status").get("phase") == "Lost":
            return {"problem": f"persistentvolumeclaim \"{name}\" bound to non-existent persistentvolume "
                               f"\"{spec.get('volumeName', '')}\""}
        if claim_meta.get("deletionTimestamp"):
            return {"problem": f"persistentvolumeclaim \"{name}\" is being deleted"}
        if ephemeral:
            owners = claim_meta.get("ownerReferences")
            if not any(isinstance(ref, dict) and ref.get("controller") is True and ref.get("uid") == metadata.get("uid")
                       for ref in (owners if isinstance(owners, list) else [])):
                return {"problem": f"PVC {namespace}/{name} was not created for pod {namespace}/{_name(pod)} "
                                   f"(pod is not owner)"}
        if READ_WRITE_ONCE_POD in _modes(claim):
            once.append(name)
        if fully_bound(claim):
            volume_name = str(spec.get("volumeName"))
            pv = catalog.volumes.get(volume_name)
            if pv is None:
                bound.append({"claim": name, "pv": volume_name, "missing": True})
                continue
            affinity = section(section(section(pv, "spec"), "nodeAffinity"), "required")
            labels = section(section(pv, "metadata"), "labels")
            bound.append({"claim": name, "pv": volume_name,
                          "affinity": affinity.get("nodeSelectorTerms") if affinity else None,
                          "zones": {key: str(labels[key]) for key in ZONE_LABELS if key in labels}})
            continue
        class_name = claim_class(claim)
        storage_class = catalog.classes.get(class_name) if class_name else None
        if class_name and storage_class is None:
            # kube-scheduler's IsDelayBindingMode fails on a class it cannot find (the pod waits likewise)
            return {"problem": f"storageclass.storage.k8s.io \"{class_name}\" not found"}
        delay = storage_class is not None and storage_class.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER
        if not delay or spec.get("volumeName"):
            immediate = True
            continue
        assert storage_class is not None
        provisioner = str(storage_class.get("provisioner") or "")
        annotations = section(claim_meta, "annotations")
        delayed.append({
            "claim": name, "uid": str(claim_meta.get("uid") or ""), "rv": str(claim_meta.get("resourceVersion") or ""),
            "size": _request(claim), "class": class_name, "provisioner": provisioner,
            "selectedNode": str(annotations.get(SELECTED_NODE) or ""),
            "pvs": candidate_volumes(claim, catalog.volumes),
            "topologies": storage_class.get("allowedTopologies") or None,
            "capacities": _capacities(claim, class_name=class_name, provisioner=provisioner, catalog=catalog),
        })
    if immediate:
        return {"problem": UNBOUND_IMMEDIATE}
    delayed.sort(key=lambda entry: int(entry["size"]))  # kube-scheduler matches the smallest claims first
    context: Json = {"bound": bound, "delayed": delayed}
    if once:
        context["rwop"] = sorted(set(once))
    return context

