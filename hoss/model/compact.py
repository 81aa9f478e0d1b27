"""Compact, versioned descriptions of pods and nodes: what a scheduling decision reads, nothing else. Pure.

The dispatcher is the only component that watches pending pods; each work item carries the pod's compact form,
so a worker never watches or reads pods. The resolver's sync writes each node's compact form into the ledger,
so workers learn nodes from Redis instead of watching the apiserver. Both forms keep the apiserver's JSON shape
(camelCase, the same nesting), so the parsers that read full objects read them unchanged; fields a decision
never reads (status of a pending pod, managed fields, volumes not backed by a claim, images, heartbeat times)
are left out.

``digest`` names a version: two compact pods with the same digest schedule the same way. A pod's form keeps its
metadata.resourceVersion, which the worker's Binding names (the apiserver binds the pod only at that version, so
with the requests its reservation holds), but the digest leaves it out, as kube-scheduler's queue ignores an update
that changes only the pod's resourceVersion, status, managedFields or finalizers: a write to the pod's status (the
PodScheduled=False condition a worker writes, above all) makes no new version, so the dispatcher sends none. A
pod whose digest changed while it was queued is caught before it is reserved (see `hoss.queue`); a Binding refused
because only the resourceVersion moved on is posted again at the current one (`same_but_version`,
`workers.binding`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any

import orjson

from hoss.model.admission import LANE_LABEL
from hoss.model.gangs import raw_gang_of
from hoss.model.objects import Json
from hoss.model.resources import NODE_RESERVATION_ANNOTATION

COMPACT_VERSION = 1
"""Bumped when the compact shape changes; a reader refuses a version it does not know."""

_POD_METADATA = ("uid", "namespace", "name", "labels", "annotations", "creationTimestamp", "generation",
                 "ownerReferences", "resourceVersion")
_POD_SPEC = (
    "schedulerName", "nodeName", "nodeSelector", "affinity", "tolerations", "priority", "priorityClassName",
    "preemptionPolicy", "topologySpreadConstraints", "schedulingGates", "overhead", "resources", "hostNetwork",
    "runtimeClassName", "resourceClaims", "schedulingGroup",
)
_CONTAINER = ("name", "resources", "ports", "restartPolicy")
CLAIM_SOURCES = ("persistentVolumeClaim", "ephemeral")
"""Volume sources backed by a PersistentVolumeClaim, which kube-scheduler's VolumeBinding reads (the claim named,
or the generic ephemeral claim ``<pod>-<volume>``); a compact pod keeps these volumes, by name and claim, and the
dispatcher puts what their claims need into `STORAGE`. Every other volume source (emptyDir, configMap, secret,
projected, hostPath, nfs, inline csi, ...) constrains no node and is left out."""
_DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})


def _pick(source: Mapping[str, Any], keys: tuple[str, ...]) -> Json:
    return {key: source[key] for key in keys if source.get(key) not in (None, "", [], {})}


def _containers(value: object) -> list[Json]:
    if not isinstance(value, list):
        return [] if value is None else value  # type: ignore[return-value]  # malformed: the parser names it
    return [_pick(c, _CONTAINER) if isinstance(c, dict) else c for c in value]


IN_TREE_VOLUMES = ("gcePersistentDisk", "awsElasticBlockStore", "rbd", "iscsi", "azureDisk", "azureFile", "cinder",
                   "vsphereVolume", "portworxVolume")
"""In-tree volume sources the compact form keeps whole: VolumeRestrictions' disk conflicts (the first four) and
NodeVolumeLimits' CSI migration (`hoss.model.storage.MIGRATED_PLUGINS`) read them."""
DISK_CONFLICTS = {"gcePersistentDisk": "pdName", "awsElasticBlockStore": "volumeID", "iscsi": "iqn", "rbd": "image"}
"""The in-tree disks VolumeRestrictions keeps from being used twice on a node, and the field that names the disk."""


def disk_volumes(pod: Mapping[str, Any]) -> list[Json]:
    """The pod's in-tree disks that VolumeRestrictions checks (`DISK_CONFLICTS`), as ``{"kind", "id", "ro"}`` (and
    ``"monitors"`` for rbd, whose id is ``<pool>/<image>``), from a raw or compact pod."""
    spec = pod.get("spec")
    volumes = spec.get("volumes") if isinstance(spec, dict) else None
    found: list[Json] = []
    for volume in volumes if isinstance(volumes, list) else []:
        if not isinstance(volume, dict):
            continue
        for kind, key in DISK_CONFLICTS.items():
            source = volume.get(kind)
            if not isinstance(source, dict):
                continue
            disk: Json = {"kind": kind, "id": str(source.get(key) or ""), "ro": source.get("readOnly") is True}
            if kind == "rbd":
                disk["id"] = f"{source.get('pool') or 'rbd'}/{disk['id']}"
                monitors = source.get("monitors")
                disk["monitors"] = sorted({str(m) for m in monitors}) if isinstance(monitors, list) else []
            found.append(disk)
    return found


def _volumes(value: object) -> list[Json]:
    """The volumes, when any is backed by a claim or an in-tree source of `IN_TREE_VOLUMES`: each keeps its place (so
    a message names its index, as the user wrote it) but only its name and, for a claim, the claim's name (an
    ephemeral one: ``{}``), or the in-tree source whole; else none."""
    if not isinstance(value, list):
        return []
    kept: list[Json] = []
    for volume in value:
        if not isinstance(volume, dict):
            kept.append({"name": ""})
            continue
        entry: Json = {"name": volume.get("name", "")}
        source = volume.get("persistentVolumeClaim")
        if isinstance(source, dict):
            entry["persistentVolumeClaim"] = {"claimName": source.get("claimName", "")}
        elif isinstance(volume.get("ephemeral"), dict):
            entry["ephemeral"] = {}
        else:
            for kind in IN_TREE_VOLUMES:
                if isinstance(volume.get(kind), dict):
                    entry[kind] = volume[kind]
        kept.append(entry)
    return kept if any(len(entry) > 1 for entry in kept) else []


def claim_names(pod: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """The claims a (raw or compact) pod's volumes use, in order: (claim name, ephemeral). A generic ephemeral
    volume's claim is ``<pod name>-<volume name>``, made by the ephemeral-volume controller."""
    spec = pod.get("spec")
    metadata = pod.get("metadata")
    volumes = spec.get("volumes") if isinstance(spec, dict) else None
    pod_name = str(metadata.get("name") or "") if isinstance(metadata, dict) else ""
    found: list[tuple[str, bool]] = []
    for volume in volumes if isinstance(volumes, list) else []:
        if not isinstance(volume, dict):
            continue
        claim = volume.get("persistentVolumeClaim")
        if isinstance(claim, dict):
            found.append((str(claim.get("claimName") or ""), False))
        elif isinstance(volume.get("ephemeral"), dict):
            found.append((f"{pod_name}-{volume.get('name', '')}", True))
    return found


def compact_pod(pod: Mapping[str, Any], *, namespaces: Mapping[str, Mapping[str, str]] | None = None,
                default_spread: Json | None = None) -> Json:
    """The scheduling-relevant part of a raw pod, in the pod's own JSON shape, with ``v`` = `COMPACT_VERSION`.

    Malformed parts are kept as they are, so the worker's parser reports them by field, as it would on the full
    pod. With `namespaces` (every namespace's labels, from the dispatcher's watch) the form also carries
    `NAMESPACES`: see `namespace_context`. `default_spread` (the selector of kube-scheduler's cluster-default
    spread constraints, see `dispatcher.spreading`) is kept as `DEFAULT_SPREAD` when the pod has no
    topologySpreadConstraints of its own.
    """
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    compact: Json = {"v": COMPACT_VERSION}
    if isinstance(metadata, dict):
        picked = _pick(metadata, _POD_METADATA)
        annotations = picked.get("annotations")
        if isinstance(annotations, dict) and _DROPPED_ANNOTATIONS & annotations.keys():
            picked["annotations"] = {k: v for k, v in annotations.items() if k not in _DROPPED_ANNOTATIONS}
        compact["metadata"] = picked
    else:
        compact["metadata"] = metadata
    if isinstance(spec, dict):
        picked = _pick(spec, _POD_SPEC)
        picked["containers"] = _containers(spec.get("containers"))
        volumes = _volumes(spec.get("volumes"))
        if volumes:
            picked["volumes"] = volumes
        if spec.get("initContainers") is not None:
            picked["initContainers"] = _containers(spec.get("initContainers"))
        compact["spec"] = picked
    else:
        compact["spec"] = spec
    status = pod.get("status")
    if isinstance(status, dict) and status.get("resourceClaimStatuses"):
        # the names of the ResourceClaims made from the pod's templates: DynamicResources reads them
        compact["status"] = {"resourceClaimStatuses": status["resourceClaimStatuses"]}
    if namespaces is not None:
        compact[NAMESPACES] = namespace_context(compact, namespaces)
    if default_spread and isinstance(spec, dict) and not spec.get("topologySpreadConstraints"):
        compact[DEFAULT_SPREAD] = default_spread
    return compact


DEFAULT_SPREAD = "defaultSpread"
"""Top-level key of a compact pod: the label selector of the profile's default spread constraints."""


NAMESPACES = "namespaces"
"""Top-level key of a compact pod with what the worker needs of namespaces (`namespace_context`)."""
AFFINITY_KINDS = ("podAffinity", "podAntiAffinity")


def selector_key(selector: object) -> str:
    """How a namespaceSelector names its resolved namespaces in `NAMESPACES` ``selected`` (canonical JSON)."""
    return orjson.dumps(selector, option=orjson.OPT_SORT_KEYS).decode()


def requirement_holds(operator: str, values: Collection[str], value: str | None) -> bool:
    """One label selector requirement (In, NotIn, Exists, DoesNotExist) against a label's `value` (None: absent)."""
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    return operator == "DoesNotExist" and value is None


def _selector_holds(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool | None:
    """A metav1.LabelSelector against `labels`; None when it is malformed (the worker's parser names the field)."""
    pairs = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(pairs, dict) or not isinstance(expressions, list):
        return None
    holds = all(labels.get(key) == value for key, value in pairs.items())
    for expression in expressions:
        if not isinstance(expression, dict) or not isinstance(expression.get("operator"), str) \
                or not isinstance(expression.get("values") or [], list):
            return None
        holds = holds and requirement_holds(expression["operator"], expression.get("values") or [],
                                            labels.get(str(expression.get("key"))))
    return holds


def namespace_selectors(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The non-empty namespaceSelectors of a pod's inter-pod terms, required and preferred ({} selects every
    namespace and needs no labels)."""
    spec = pod.get("spec")
    affinity = spec.get("affinity") if isinstance(spec, dict) else None
    if not isinstance(affinity, dict):
        return []
    found: list[Mapping[str, Any]] = []
    for kind in AFFINITY_KINDS:
        section = affinity.get(kind)
        if not isinstance(section, dict):
            continue
        terms = section.get("requiredDuringSchedulingIgnoredDuringExecution")
        preferred = section.get("preferredDuringSchedulingIgnoredDuringExecution")
        listed = [*(terms if isinstance(terms, list) else []),
                  *(entry.get("podAffinityTerm") for entry in (preferred if isinstance(preferred, list) else [])
                    if isinstance(entry, dict))]
        for term in listed:
            selector = term.get("namespaceSelector") if isinstance(term, dict) else None
            if isinstance(selector, dict) and (selector.get("matchLabels") or selector.get("matchExpressions")):
                found.append(selector)
    return found


def namespace_context(pod: Mapping[str, Any], namespaces: Mapping[str, Mapping[str, str]]) -> Json:
    """What a worker needs of namespaces to read the pod's inter-pod terms as kube-scheduler does:

    - ``labels``: the labels of the pod's own namespace (absent when the namespace is unknown), against which
      the namespaceSelectors of pods already placed are matched (kube-scheduler matches an existing pod's term
      by the incoming pod's namespace labels);
    - ``selected``: for each non-empty namespaceSelector of the pod's own terms (by `selector_key`), the
      namespaces it selects now, sorted; a term's namespaces are then its ``namespaces`` list plus these.
    """
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    own = namespaces.get(str(metadata.get("namespace") or "default")) if isinstance(metadata, dict) else None
    context: Json = {}
    if own is not None:
        context["labels"] = dict(own)
    selected: Json = {}
    for selector in namespace_selectors(pod):
        names = []
        for name, labels in namespaces.items():
            holds = _selector_holds(selector, labels)
            if holds is None:
                break
            if holds:
                names.append(name)
        else:
            selected[selector_key(selector)] = sorted(names)
    if selected:
        context["selected"] = selected
    return context


def compact_node(node: Mapping[str, Any]) -> Json:
    """The scheduling-relevant part of a raw node: name, labels, taints, unschedulable, allocatable, Ready."""
    metadata = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
    spec = node.get("spec") if isinstance(node.get("spec"), dict) else {}
    status = node.get("status") if isinstance(node.get("status"), dict) else {}
    assert isinstance(metadata, dict) and isinstance(spec, dict) and isinstance(status, dict)
    conditions = status.get("conditions")
    ready = [
        {"type": "Ready", "status": c.get("status")}
        for c in (conditions if isinstance(conditions, list) else [])
        if isinstance(c, dict) and c.get("type") == "Ready"
    ]
    return {
        "v": COMPACT_VERSION,
        "metadata": {**_pick(metadata, ("name", "labels")), **_node_annotations(metadata)},
        "spec": _pick(spec, ("taints", "unschedulable")),
        "status": {**_pick(status, ("allocatable", "capacity")), "conditions": ready},
    }


def _node_annotations(metadata: Mapping[str, Any]) -> Json:
    """The node annotations a decision reads: only the reserved resources (`NODE_RESERVATION_ANNOTATION`)."""
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict) or NODE_RESERVATION_ANNOTATION not in annotations:
        return {}
    return {"annotations": {NODE_RESERVATION_ANNOTATION: annotations[NODE_RESERVATION_ANNOTATION]}}


def encode(compact: Json) -> bytes:
    """Canonical bytes of a compact form (sorted keys), as stored in work items and the ledger."""
    return orjson.dumps(compact, option=orjson.OPT_SORT_KEYS)


VERSION_FIELD = "resourceVersion"
"""The metadata field a compact pod keeps for the Binding's precondition and leaves out of its digest."""


def _unversioned(metadata: object) -> object:
    """A compact pod's metadata without its resourceVersion (anything else as it is)."""
    if isinstance(metadata, dict) and VERSION_FIELD in metadata:
        return {key: value for key, value in metadata.items() if key != VERSION_FIELD}
    return metadata


def digest(form: Json) -> str:
    """A short name of one version of a compact pod: of its canonical bytes without metadata.resourceVersion (see
    the module docstring)."""
    if isinstance(form.get("metadata"), dict) and VERSION_FIELD in form["metadata"]:
        form = {**form, "metadata": _unversioned(form["metadata"])}
    return hashlib.blake2b(encode(form), digest_size=8).hexdigest()


def same_but_version(form: Mapping[str, Any], raw: Mapping[str, Any]) -> bool:
    """Whether pod `raw`, as the apiserver has it now, is the pod compact `form` describes but for its
    resourceVersion: the same metadata and spec as a compact form keeps them (so the same uid, requests, labels
    and constraints), and not being deleted. What the dispatcher adds to a form (namespace context, the default
    spread, Reservation hints) is not the pod's and not compared."""
    metadata = raw.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("deletionTimestamp"):
        return False
    now = compact_pod(raw)
    return _unversioned(now.get("metadata")) == _unversioned(form.get("metadata")) \
        and now.get("spec") == form.get("spec")


def decode(encoded: bytes | str) -> Json:
    """A compact form back from its bytes; raises ValueError for a version this code does not know."""
    value = orjson.loads(encoded)
    if not isinstance(value, dict) or value.get("v") != COMPACT_VERSION:
        raise ValueError(f"compact form of unknown version {value.get('v') if isinstance(value, dict) else value!r}")
    return value


ANY_HOST_IP = "0.0.0.0"


def host_ports(pod: Mapping[str, Any]) -> list[str]:
    """The host ports a pod holds on its node, as kube-scheduler's NodePorts reads them (containers and restartable
    init containers, hostPort > 0; protocol TCP and hostIP 0.0.0.0 when empty): ``['TCP/0.0.0.0/80', ...]``.
    Lenient: malformed entries are skipped (the worker's parser refuses such a pod before it is placed)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return []
    ports: list[str] = []
    for kind in ("initContainers", "containers"):
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else []:
            if not isinstance(container, dict) or (kind == "initContainers"
                                                   and container.get("restartPolicy") != "Always"):
                continue
            items = container.get("ports")
            for port in items if isinstance(items, list) else []:
                if not isinstance(port, dict):
                    continue
                number = port.get("hostPort")
                if isinstance(number, int) and not isinstance(number, bool) and number > 0:
                    protocol = port.get("protocol") if isinstance(port.get("protocol"), str) else ""
                    ip = port.get("hostIP") if isinstance(port.get("hostIP"), str) else ""
                    ports.append(f"{protocol or 'TCP'}/{ip or ANY_HOST_IP}/{number}")
    return ports


def controller_uid(pod: Mapping[str, Any]) -> str:
    """The uid of the pod's controller (the ownerReference with ``controller: true``), or ''."""
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    assert isinstance(metadata, dict)
    owners = metadata.get("ownerReferences")
    for ref in owners if isinstance(owners, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True and isinstance(ref.get("uid"), str):
            return str(ref["uid"])
    return ""


def pod_meta(pod: Mapping[str, Any], *, request: Mapping[str, int] | None = None) -> tuple[str, str]:
    """What the ledger keeps of a placed pod beyond its request: its host ports as the reserve scripts check them
    ('TCP/0.0.0.0/80,UDP/10.0.0.1/53', '' for none), and its meta for the workers' pod index (JSON: namespace,
    name, labels (but the webhook lane's, see below), host ports, required anti-affinity terms as ``anti``, for
    InterPodAffinity's score the required affinity terms ``aff`` and the preferred ones ``paff``/``panti``, and for
    preemption spec.priority (left out when 0), the effective `request` when given, metadata.creationTimestamp,
    and ``terminating`` when metadata.deletionTimestamp is set) -- what NodePorts,
    InterPodAffinity, PodTopologySpread and DefaultPreemption read of the pods already on a node. The scripts read
    the priority too: room held for a preempting pod is kept from pods of lower priority; and ``owner``, the
    controller's uid, by which a replacement pod claims the room the rescheduler held for the pod it replaces; and
    ``gang``, the gang it belongs to (`hoss.model.gangs.GangKey.ident`), for preemption; ``claims``, the claims its
    volumes use (VolumeRestrictions' ReadWriteOncePod check, NodeVolumeLimits' count), and ``disks``, its in-tree
    disks (`disk_volumes`, VolumeRestrictions)."""
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    assert isinstance(metadata, dict)
    labels = metadata.get("labels")
    ports = host_ports(pod)
    meta: Json = {"namespace": metadata.get("namespace") or "default"}
    if isinstance(metadata.get("name"), str) and metadata["name"]:
        meta["name"] = metadata["name"]
    if isinstance(labels, dict) and LANE_LABEL in labels:
        # the webhook lane of the pod's Binding, which the apiserver (PodTopologyLabelsAdmission, on by default from
        # 1.35) copies onto the pod: not the user's, so the description is the same before and after the binding
        labels = {key: value for key, value in labels.items() if key != LANE_LABEL}
    if isinstance(labels, dict) and labels:
        meta["labels"] = labels
    if ports:
        meta["ports"] = ports
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    priority = spec.get("priority")
    if isinstance(priority, int) and not isinstance(priority, bool) and priority:
        meta["priority"] = priority
    if request:
        meta["request"] = dict(request)
    if isinstance(metadata.get("creationTimestamp"), str) and metadata["creationTimestamp"]:
        meta["created"] = metadata["creationTimestamp"]
    if metadata.get("deletionTimestamp"):
        meta["terminating"] = True  # PodTopologySpread counts no terminating pod (InterPodAffinity still does)
    owner = controller_uid(pod)
    if owner:
        meta["owner"] = owner  # the rescheduler's hold for a moved pod is claimed by its replacement's controller
    claims = sorted({name for name, _ephemeral in claim_names(pod)})
    if claims:
        meta["claims"] = claims  # VolumeRestrictions: a ReadWriteOncePod claim is used by one pod at most
    disks = disk_volumes(pod)
    if disks:
        meta["disks"] = disks  # VolumeRestrictions: an in-tree disk is used once per node (read-only aside)
    gang = raw_gang_of(pod)
    if gang is not None:
        meta["gang"] = gang.ident  # a running gang is evicted whole or not at all (workers/victims.py)
    affinity = spec.get("affinity") if isinstance(spec.get("affinity"), dict) else {}
    assert isinstance(affinity, dict)
    anti = affinity.get("podAntiAffinity") if isinstance(affinity.get("podAntiAffinity"), dict) else {}
    assert isinstance(anti, dict)
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(terms, list) and terms:
        meta["anti"] = terms  # existing pods' anti-affinity holds against pods placed later
    # ... and their affinity terms weigh in InterPodAffinity's score of pods placed later
    pod_affinity = affinity.get("podAffinity") if isinstance(affinity.get("podAffinity"), dict) else {}
    assert isinstance(pod_affinity, dict)
    for field, source, kind in (("aff", pod_affinity, "required"), ("paff", pod_affinity, "preferred"),
                                ("panti", anti, "preferred")):
        listed = source.get(f"{kind}DuringSchedulingIgnoredDuringExecution")
        if isinstance(listed, list) and listed:
            meta[field] = listed
    return ",".join(ports), orjson.dumps(meta, option=orjson.OPT_SORT_KEYS).decode()
