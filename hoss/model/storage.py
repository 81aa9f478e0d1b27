"""What a pending pod's volume claims need of a node, as kube-scheduler's VolumeBinding and VolumeZone read them.
Pure: the dispatcher keeps the storage objects (`StorageCatalog`, from its watches of PersistentVolumeClaims,
PersistentVolumes, StorageClasses, CSIDrivers, CSIStorageCapacities and CSINodes) and puts `storage_context` of
each pod into its compact form under `STORAGE`; the worker's volume plugins (`hoss.framework.plugins.volumes`)
read only that, never the apiserver.

The context is one of:

- ``{"problem": text}``: the pod cannot be scheduled anywhere now, in kube-scheduler's words (its PreFilter's
  UnschedulableAndUnresolvable): a claim missing, being deleted or lost, an ephemeral claim not created yet or not
  the pod's, a claim that is neither bound nor waiting for its first consumer ("pod has unbound immediate
  PersistentVolumeClaims"). The claim's change changes the context, so the dispatcher sends the pod again.
- ``{"unsupported": text}``: the pod has an in-tree volume that kube-scheduler counts under CSI migration against
  an attach limit some CSINode sets; hoss refuses it naming the field (`migrated_volume`).
- ``{"bound": [...], "delayed": [...], "rwop": [...], "attach": {...}}``: the fully bound claims with their PV's
  node affinity and zone labels, and the claims of a WaitForFirstConsumer class with the PVs that could take them
  (class, access modes, capacity, volume mode, selector and pre-binding already checked here: only the node
  affinity is left to the node), and how their class provisions (provisioner, allowedTopologies, the
  CSIStorageCapacities that apply); ``rwop`` names the claims with the ReadWriteOncePod access mode
  (VolumeRestrictions), when there are any; ``attach`` what NodeVolumeLimits needs, when any claim counts against
  a CSI driver's attach limit (`attach_context`).

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
    csinodes: dict[str, Json] = field(default_factory=dict)
    """CSINodes by name (the node's name): their drivers' attach limits (NodeVolumeLimits)."""
    attachments: dict[str, Json] = field(default_factory=dict)
    """VolumeAttachments by name: the volumes attached to a node, which NodeVolumeLimits counts too."""

    KINDS = ("claims", "volumes", "classes", "drivers", "capacities", "csinodes", "attachments")

    def key(self, kind: str, raw: Mapping[str, Any]) -> Any:
        return (_namespace(raw), _name(raw)) if kind in ("claims", "capacities") else _name(raw)

    attach_cache: AttachTables | None = field(default=None, repr=False)
    """Cached `attach_tables` (dropped on any change)."""

    def replace(self, kind: str, items: list[Json]) -> None:
        """The watch of `kind` listed `items`."""
        setattr(self, kind, {self.key(kind, raw): raw for raw in items if _name(raw)})
        self.attach_cache = None

    def apply(self, kind: str, event: str, raw: Json) -> None:
        """One watch event of `kind`."""
        if not _name(raw):
            return
        table: dict[Any, Json] = getattr(self, kind)
        self.attach_cache = None
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
    """What the pod's claims need (see the module docstring); None for a pod without claims (nor an in-tree volume
    hoss refuses, `migrated_volume`)."""
    refused = migrated_volume(pod, catalog)
    if refused:
        return {"unsupported": refused}
    claims = pod_claims(pod)
    if not claims:
        return None
    context = _claims_context(pod, claims, catalog)
    if "problem" not in context:
        attach = attach_context(pod, catalog)
        if attach is not None:
            context["attach"] = attach
    return context


def _claims_context(pod: Mapping[str, Any], claims: list[tuple[str, bool]], catalog: StorageCatalog) -> Json:
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



# --- NodeVolumeLimits -------------------------------------------------------------------------------------------

MIGRATED_PLUGINS: Mapping[str, tuple[str, str]] = {
    "awsElasticBlockStore": ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
    "gcePersistentDisk": ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
    "azureDisk": ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
    "cinder": ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
    "portworxVolume": ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
}
"""In-tree volume source (its field in a pod's volume or a PV's spec) -> (its provisioner name, the CSI driver it
is migrated to): the plugins kube-scheduler 1.36's NodeVolumeLimits counts under CSI migration (isCSIMigrationOn)
against the CSI driver's attach limit."""
_MIGRATED_PROVISIONERS = {provisioner: source for source, (provisioner, _driver) in MIGRATED_PLUGINS.items()}


def attach_limits(csinodes: Mapping[str, Json]) -> dict[str, dict[str, int]]:
    """CSI driver -> node -> its attach limit, from the CSINodes' spec.drivers[].allocatable.count (kube-scheduler's
    getVolumeLimits; a driver without a count has no limit)."""
    limits: dict[str, dict[str, int]] = {}
    for node, csinode in csinodes.items():
        drivers = section(csinode, "spec").get("drivers")
        for driver in drivers if isinstance(drivers, list) else []:
            if not isinstance(driver, dict):
                continue
            count = section(driver, "allocatable").get("count")
            if isinstance(count, int) and not isinstance(count, bool) and driver.get("name"):
                limits.setdefault(str(driver["name"]), {})[node] = count
    return limits


def claim_volume(claim: Mapping[str, Any], catalog: StorageCatalog) -> tuple[str, str] | None:
    """The (CSI driver, volume handle) a claim counts as, as kube-scheduler's getCSIDriverInfo: the bound PV's CSI
    source; for a claim without a PV (not bound yet, or its PV not found), its class's provisioner with a handle of
    the claim's own (``pvc:<namespace>/<name>``, never a real one, as kube-scheduler's random prefix); None for a
    volume that counts against no CSI limit (no class, a class not found, a PV of another kind). In-tree volumes
    under CSI migration are not resolved here: `migrated_volume` refuses the pod that has them."""
    spec = section(dict(claim), "spec")
    pv = catalog.volumes.get(str(spec.get("volumeName") or "")) if spec.get("volumeName") else None
    if pv is not None:
        csi = section(section(pv, "spec"), "csi")
        if csi.get("driver") and csi.get("volumeHandle"):
            return str(csi["driver"]), str(csi["volumeHandle"])
        return None
    class_name = claim_class(claim)
    storage_class = catalog.classes.get(class_name) if class_name else None
    provisioner = str(storage_class.get("provisioner") or "") if storage_class is not None else ""
    if not provisioner or provisioner in _MIGRATED_PROVISIONERS:
        return None
    return provisioner, f"pvc:{_namespace(claim)}/{_name(claim)}"


@dataclass(frozen=True)
class AttachTables:
    """What NodeVolumeLimits reads of the whole catalog (`attach_tables`)."""

    limits: dict[str, dict[str, int]]
    """CSI driver -> node -> attach limit (`attach_limits`)."""
    claims: dict[str, list[str]]
    """Every claim of a limited driver, ``namespace/name`` -> [driver, handle] (`claim_volume`)."""
    attached: dict[str, list[list[str]]]
    """Node -> the [driver, handle] of its VolumeAttachments of limited drivers (the attacher, the PV's CSI handle),
    which kube-scheduler 1.36 counts besides the pods' volumes."""


def attach_tables(catalog: StorageCatalog) -> AttachTables:
    """`AttachTables` of the catalog, computed once per change of it."""
    if catalog.attach_cache is None:
        limits = attach_limits(catalog.csinodes)
        claims: dict[str, list[str]] = {}
        attached: dict[str, list[list[str]]] = {}
        if limits:
            for (namespace, name), claim in catalog.claims.items():
                volume = claim_volume(claim, catalog)
                if volume is not None and volume[0] in limits:
                    claims[f"{namespace}/{name}"] = list(volume)
            for attachment in catalog.attachments.values():
                spec = section(attachment, "spec")
                attacher = str(spec.get("attacher") or "")
                pv = catalog.volumes.get(str(section(spec, "source").get("persistentVolumeName") or ""))
                handle = section(section(pv, "spec"), "csi").get("volumeHandle") if pv is not None else None
                if attacher in limits and handle and spec.get("nodeName"):
                    attached.setdefault(str(spec["nodeName"]), []).append([attacher, str(handle)])
        catalog.attach_cache = AttachTables(limits=limits, claims=claims, attached=attached)
    return catalog.attach_cache


def attach_context(pod: Mapping[str, Any], catalog: StorageCatalog) -> Json | None:
    """What NodeVolumeLimits needs of a pod whose claims count against a CSI driver's attach limit on some node
    (None for any other): its own volumes as [driver, handle] pairs, the limits of those drivers per node, and
    every claim of those drivers in the cluster (``namespace/name`` -> [driver, handle]), by which the worker
    counts the volumes of the pods already on a node from their claims (the pod index names them), and the
    VolumeAttachments of those drivers per node. Inline CSI volumes are not counted, as kube-scheduler does not
    count them."""
    tables = attach_tables(catalog)
    limits, claims = tables.limits, tables.claims
    if not limits:
        return None
    namespace = _namespace(pod)
    own: set[tuple[str, str]] = set()
    for name, _ephemeral in pod_claims(pod):
        entry = claims.get(f"{namespace}/{name}")
        if entry is not None:
            own.add((entry[0], entry[1]))
    drivers = sorted({driver for driver, _handle in own})
    if not drivers:
        return None
    context: Json = {"volumes": [list(volume) for volume in sorted(own)],
                     "limits": {driver: limits[driver] for driver in drivers},
                     "claims": {key: value for key, value in claims.items() if value[0] in drivers}}
    attachments = {node: sorted(pair for pair in pairs if pair[0] in drivers)
                   for node, pairs in tables.attached.items() if any(pair[0] in drivers for pair in pairs)}
    if attachments:
        context["attachments"] = attachments
    return context


def migrated_volume(pod: Mapping[str, Any], catalog: StorageCatalog) -> str:
    """The field of the pod's first in-tree volume that kube-scheduler counts under CSI migration against a CSI
    driver's attach limit some CSINode sets (an inline source, or a claim whose PV has that source or whose class
    has the in-tree provisioner), with why; '' when none. hoss does not translate in-tree volumes to their CSI
    handles, so such a pod is refused, naming the field, instead of being placed as if its volume were absent."""
    limits = attach_tables(catalog).limits
    if not limits:
        return ""
    metadata = section(dict(pod), "metadata")
    namespace = str(metadata.get("namespace") or "default")
    pod_name = str(metadata.get("name") or "")
    volumes = section(dict(pod), "spec").get("volumes")
    for position, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if not isinstance(volume, dict):
            continue
        source = next((key for key in MIGRATED_PLUGINS if isinstance(volume.get(key), dict)), "")
        where = f"spec.volumes[{position}].{source}"
        if not source:
            claim_name = section(volume, "persistentVolumeClaim").get("claimName") \
                if isinstance(volume.get("persistentVolumeClaim"), dict) \
                else f"{pod_name}-{volume.get('name', '')}" if isinstance(volume.get("ephemeral"), dict) else None
            claim = catalog.claims.get((namespace, str(claim_name))) if claim_name is not None else None
            if claim is None:
                continue
            pv = catalog.volumes.get(str(section(claim, "spec").get("volumeName") or ""))
            if pv is not None:
                source = next((key for key in MIGRATED_PLUGINS if isinstance(section(pv, "spec").get(key), dict)), "")
            else:
                storage_class = catalog.classes.get(claim_class(claim))
                source = _MIGRATED_PROVISIONERS.get(str(storage_class.get("provisioner") or "")
                                                    if storage_class is not None else "", "")
            where = f"spec.volumes[{position}] (claim {claim_name!r}: in-tree {source})"
        if source and MIGRATED_PLUGINS[source][1] in limits:
            return f"{where} counted under CSI migration against the attach limit of {MIGRATED_PLUGINS[source][1]}"
    return ""
