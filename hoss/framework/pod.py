"""The scheduler's view of a pending pod, parsed once from the raw pod. Pure, no I/O.

`parse_pod` is the one entry for raw pods: it checks every field the plugins read and raises `PodSpecError` naming
the field by its JSON path, so a plugin never meets a malformed pod. Selector and toleration rules are checked the
way the apiserver validates them (e.g. ``Gt`` takes exactly one integer, ``Exists`` takes no values), because a
pod that slipped past validation must not be placed by a guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hoss.errors import PodSpecError, QuantityError
from hoss.framework import payload
from hoss.framework.errors import UnsupportedPodField
from hoss.framework.node import TAINT_EFFECTS, Taint
from hoss.framework.podindex import ANY_HOST_IP, Disk, HostPort, PlacedPod, parse_disks
from hoss.framework.podterms import (
    LabelSelector,
    PodAffinityTerm,
    SpreadConstraint,
    WeightedPodTerm,
    label_selector,
    parse_spread,
    parse_terms,
    parse_weighted_terms,
)
from hoss.model.compact import DEFAULT_SPREAD, NAMESPACES, claim_names, disk_volumes, selector_key
from hoss.model.dra import without_dra
from hoss.model.objects import Json
from hoss.model.resourceclaims import DEVICES
from hoss.model.resources import ResourceVector, pod_requests
from hoss.model.storage import STORAGE

POLICY_LABEL = "hoss.io/policy"
POOL_LABEL = "hoss.io/pool"
DEFAULT_SCHEDULER = "default-scheduler"

LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
FIELD_OPERATORS = frozenset({"In", "NotIn"})
NODE_NAME_FIELD = "metadata.name"
TOLERATION_OPERATORS = frozenset({"Equal", "Exists"})

_INTEGER = re.compile(r"[+-]?[0-9]+")
_AFFINITY_FIELD = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def parse_integer(text: str) -> int | None:
    """`text` as a base-10 integer the way Kubernetes' ``Gt``/``Lt`` read it, or None when it is not one."""
    return int(text) if _INTEGER.fullmatch(text) else None


@dataclass(frozen=True)
class SelectorRequirement:
    """One ``matchExpressions`` / ``matchFields`` entry: `key` `operator` `values`."""

    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class SelectorTerm:
    """One ``nodeSelectorTerms`` entry: all its requirements must hold; a term with none matches no node."""

    match_expressions: tuple[SelectorRequirement, ...]
    match_fields: tuple[SelectorRequirement, ...]


@dataclass(frozen=True)
class Toleration:
    """A pod toleration; an empty `key` (with ``Exists``) matches every key, an empty `effect` every effect."""

    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' ``Toleration.ToleratesTaint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class PreferredTerm:
    """One ``preferredDuringSchedulingIgnoredDuringExecution`` node-affinity term: its weight (1..100) and term."""

    weight: int
    term: SelectorTerm


@dataclass(frozen=True)
class BoundVolume:
    """A fully bound claim of the pod and its PV: the PV's node affinity (None: any node) and zone labels."""

    claim: str
    pv: str
    affinity: tuple[SelectorTerm, ...] | None
    zones: dict[str, str]
    missing: bool = False
    """The PV does not exist (kube-scheduler's "bound to non-existent pv(s)" on every node)."""


@dataclass(frozen=True)
class VolumeOption:
    """A PV that could take a claim of a WaitForFirstConsumer class, on the nodes its node affinity allows."""

    name: str
    version: str
    """Its resourceVersion as the dispatcher read it."""
    size: int
    affinity: tuple[SelectorTerm, ...] | None
    prebound: bool
    """Its claimRef names the claim already: the only PV the claim may take."""


@dataclass(frozen=True)
class DelayedClaim:
    """A claim of a WaitForFirstConsumer class, not bound yet: a PV of `volumes` on the node, or provisioning."""

    claim: str
    uid: str
    version: str
    size: int
    storage_class: str
    provisioner: str
    selected_node: str
    """volume.kubernetes.io/selected-node already on the claim ('' for none): only that node may take it."""
    volumes: tuple[VolumeOption, ...]
    topologies: tuple[SelectorTerm, ...] | None
    """The class's allowedTopologies (ORed terms; None: anywhere)."""
    capacities: tuple[tuple[tuple[SelectorRequirement, ...], int], ...] | None
    """CSIStorageCapacities of the class: (node topology as ANDed requirements, bytes); None: not checked."""


@dataclass(frozen=True)
class AttachNeeds:
    """What NodeVolumeLimits needs (`hoss.model.storage.attach_context`)."""

    volumes: tuple[tuple[str, str], ...]
    """The pod's own volumes that count against a limit: (CSI driver, volume handle)."""
    limits: dict[str, dict[str, int]]
    """CSI driver -> node -> attach limit (CSINode.spec.drivers[].allocatable.count)."""
    claims: dict[str, tuple[str, str]]
    """Every claim of those drivers, ``namespace/name`` -> (driver, handle): the volumes of the pods on a node."""
    attachments: dict[str, frozenset[tuple[str, str]]] = field(default_factory=dict)
    """Node -> (driver, handle) of its VolumeAttachments of those drivers."""

    def attached(self, pods: Iterable[PlacedPod]) -> dict[str, set[str]]:
        """The handles of the limited drivers that `pods` (those on one node) use, by driver."""
        found: dict[str, set[str]] = {}
        for other in pods:
            for claim in other.claims:
                volume = self.claims.get(f"{other.namespace}/{claim}")
                if volume is not None:
                    found.setdefault(volume[0], set()).add(volume[1])
        return found

    def new_on(self, node: str, attached: Mapping[str, set[str]]) -> dict[str, set[str]]:
        """The pod's volumes not attached yet, by driver, of the drivers `node` limits."""
        new: dict[str, set[str]] = {}
        for driver, handle in self.volumes:
            if node in self.limits.get(driver, {}) and handle not in attached.get(driver, ()):
                new.setdefault(driver, set()).add(handle)
        return new

    def counted(self, node: str, attached: Mapping[str, set[str]]) -> dict[str, set[str]]:
        """Per driver, what counts as attached on `node`: the pods' volumes (`attached`), and its VolumeAttachments
        not among them (kept apart by a ``va:`` prefix: kube-scheduler 1.36 does not take a new volume that is only
        in a VolumeAttachment off the pod's count)."""
        counted = {driver: set(handles) for driver, handles in attached.items()}
        for driver, handle in self.attachments.get(node, ()):
            if handle not in attached.get(driver, ()):
                counted.setdefault(driver, set()).add(f"va:{handle}")
        return counted

    def exceeds(self, node: str, attached: Mapping[str, set[str]]) -> bool:
        """kube-scheduler's check: some driver's attached volumes plus the pod's new ones exceed its limit."""
        counted = self.counted(node, attached)
        return any(len(counted.get(driver, ())) + len(handles) > self.limits[driver][node]
                   for driver, handles in self.new_on(node, attached).items())


@dataclass(frozen=True)
class StorageNeeds:
    """What the pod's volume claims need (`hoss.model.storage`): a `problem` (no node can take it now, in
    kube-scheduler's words), or bound claims' PVs and claims waiting for their first consumer."""

    problem: str = ""
    bound: tuple[BoundVolume, ...] = ()
    delayed: tuple[DelayedClaim, ...] = ()
    once: tuple[str, ...] = ()
    """The claims with the ReadWriteOncePod access mode (VolumeRestrictions: no other pod may use them)."""
    attach: AttachNeeds | None = None
    """What NodeVolumeLimits needs; None when no volume of the pod counts against an attach limit."""


@dataclass(frozen=True)
class ClaimUse:
    """One ResourceClaim the pod uses (`hoss.model.resourceclaims`): allocated already (its `allocation`, whose
    `selector` decides the nodes) or to be allocated (its `devices`, spec.devices)."""

    entry: str
    """The pod's spec.resourceClaims entry naming it."""
    claim: str
    uid: str
    version: str
    """Its resourceVersion as the dispatcher read it: the allocation is written at that version only."""
    allocation: Json | None = None
    selector: tuple[SelectorTerm, ...] | None = None
    """The allocation's nodeSelector terms (ORed; None: any node)."""
    reserved: bool = False
    """The pod is in its status.reservedFor already."""
    devices: Json | None = None


@dataclass(frozen=True)
class ExtendedResource:
    """An extended resource the pod asks that a DeviceClass serves (`hoss.model.dra`): on a node without it in
    allocatable, DRA allocates its `requests` through the claim made for the pod."""

    resource: str
    device_class: str
    requests: tuple[Json, ...]
    """Device requests (``container-<i>-request-<j>``, exactly `device_class`, a count each)."""
    mappings: tuple[Json, ...]
    """``{containerName, resourceName, requestName}`` per container that asks it."""


@dataclass(frozen=True)
class DeviceNeeds:
    """What the pod's ResourceClaims need (`hoss.model.resourceclaims`): a `problem` (no node can take it now, in
    kube-scheduler's words), or its claims and, when some is to be allocated, the DeviceClasses, ResourceSlices and
    devices held by other claims that allocating reads."""

    problem: str = ""
    namespace: str = ""
    """The pod's namespace, which is its claims'."""
    claims: tuple[ClaimUse, ...] = ()
    classes: tuple[tuple[str, Json], ...] = ()
    slices: tuple[Json, ...] = ()
    allocated: frozenset[tuple[str, str, str]] = frozenset()
    extended: tuple[ExtendedResource, ...] = ()
    """The extended resources DeviceClasses serve, by name."""
    stale: tuple[str, str] | None = None
    """(name, uid) of the claim an earlier attempt made for the extended resources: deleted before a new one."""
    parsed: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """What the DynamicResources plugin parsed of these needs once (`hoss.framework.plugins.devices.prepare`)."""

    @property
    def to_allocate(self) -> tuple[ClaimUse, ...]:
        return tuple(claim for claim in self.claims if claim.allocation is None)

    def left_to_dra(self, allocatable: Mapping[str, int]) -> frozenset[str]:
        """The extended resources a node with `allocatable` leaves to DRA: those it has none of (a node whose
        device plugin serves one counts it as any resource)."""
        return frozenset(e.resource for e in self.extended if allocatable.get(e.resource, 0) <= 0)


@dataclass(frozen=True)
class PodView:
    """What the scheduler needs of one pod."""

    uid: str
    namespace: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    scheduler_name: str
    request: ResourceVector
    """Effective request in base units, always with ``pods: 1`` (see `hoss.model.resources.pod_requests`)."""
    node_selector: dict[str, str]
    required_affinity: tuple[SelectorTerm, ...] | None
    """Required node affinity terms (ORed); None when the pod has none."""
    tolerations: tuple[Toleration, ...]
    policy: str | None
    """The ``hoss.io/policy`` label: the profile that schedules the pod; None (absent or empty) means the default."""
    pool: str | None
    """The ``hoss.io/pool`` label: the node pool the pod must run in; None (absent or empty) means any."""
    priority: int
    preferred_affinity: tuple[PreferredTerm, ...] = ()
    """Preferred node-affinity terms (scored by NodeAffinity); empty when the pod has none."""
    host_ports: tuple[HostPort, ...] = ()
    """Host ports of the containers (and restartable init containers), as NodePorts reads them."""
    scheduling_gates: tuple[str, ...] = ()
    """spec.schedulingGates names: while any is left the pod must not be scheduled."""
    affinity_terms: tuple[PodAffinityTerm, ...] = ()
    """Required pod affinity terms (InterPodAffinity): every one must find a matching pod in the node's domain."""
    anti_affinity_terms: tuple[PodAffinityTerm, ...] = ()
    """Required pod anti-affinity terms: no matching pod may run in the node's domain."""
    preferred_affinity_terms: tuple[WeightedPodTerm, ...] = ()
    """Preferred pod affinity terms (InterPodAffinity's score)."""
    preferred_anti_affinity_terms: tuple[WeightedPodTerm, ...] = ()
    """Preferred pod anti-affinity terms (InterPodAffinity's score)."""
    spread_constraints: tuple[SpreadConstraint, ...] = ()
    """spec.topologySpreadConstraints (PodTopologySpread: DoNotSchedule filters, ScheduleAnyway scores)."""
    namespace_labels: dict[str, str] | None = None
    """The labels of the pod's namespace (from the dispatcher; None: unknown), matched by placed pods' terms'
    namespaceSelectors."""
    default_spread_selector: LabelSelector | None = None
    """For a pod without spread constraints: the selector of kube-scheduler's cluster-default constraints (its
    Services' and controller's, from the dispatcher; None: none), which PodTopologySpread's profile defaults use."""
    storage: StorageNeeds | None = None
    """What the pod's volume claims need (from the dispatcher); None for a pod without claims."""
    claims: tuple[str, ...] = ()
    """The names of the volume claims it uses (its namespace's), as the pod index keeps them."""
    devices: DeviceNeeds | None = None
    """What the pod's ResourceClaims need (from the dispatcher); None for a pod without any."""
    disks: tuple[Disk, ...] = ()
    """The in-tree disks it mounts (VolumeRestrictions)."""
    resource_version: str = ""
    """metadata.resourceVersion of the pod as read: its binding names it, so the apiserver binds that version only
    (the spec, requests included, the decision and the reservation were made for); "" when unknown."""

    @property
    def dra_resources(self) -> frozenset[str]:
        """The extended resources it asks that DeviceClasses serve: a node without them leaves them to DRA."""
        return frozenset(e.resource for e in self.devices.extended) if self.devices is not None else frozenset()

    def counted_on(self, allocatable: Mapping[str, int]) -> ResourceVector:
        """Its request as a node with `allocatable` counts it (`hoss.model.dra.without_dra`), which the ledger
        holds."""
        dra = self.dra_resources
        return without_dra(self.request, allocatable=allocatable, dra=dra) if dra else self.request

    @property
    def hard_spread(self) -> tuple[SpreadConstraint, ...]:
        """The DoNotSchedule constraints."""
        return tuple(c for c in self.spread_constraints if c.hard)

    @property
    def reads_pod_index(self) -> bool:
        """Whether the pod has terms or constraints that depend on the pods already placed (its decision is then
        not shared with other pods of its signature once one of them is placed): inter-pod terms, spread
        constraints, and volumes whose count (NodeVolumeLimits) or in-tree disks (VolumeRestrictions) depend on the
        pods on the node."""
        return bool(self.affinity_terms or self.anti_affinity_terms or self.spread_constraints
                    or self.preferred_affinity_terms or self.preferred_anti_affinity_terms
                    or self.default_spread_selector is not None or self.disks
                    or (self.storage is not None and self.storage.attach is not None))

    @property
    def domain_keys(self) -> frozenset[str]:
        """Topology keys whose domains decide where the pod may go (required inter-pod terms, DoNotSchedule
        constraints): the ledger refuses the pod on a node where such a domain changed after the decision."""
        return frozenset({term.topology_key for term in (*self.affinity_terms, *self.anti_affinity_terms)}
                         | {c.topology_key for c in self.spread_constraints if c.hard})

    @property
    def key(self) -> str:
        """``namespace/name``, as events and logs name a pod."""
        return f"{self.namespace}/{self.name}"

    def tolerates(self, taint: Taint) -> bool:
        """Whether any of the pod's tolerations tolerates `taint`."""
        return any(toleration.tolerates(taint) for toleration in self.tolerations)


def placed_view(pod: PodView, node: str) -> PlacedPod:
    """How the pod index holds `pod` once it is placed on `node` (a worker's tentative placement)."""
    return PlacedPod(uid=pod.uid, node=node, namespace=pod.namespace, labels=pod.labels, ports=pod.host_ports,
                     claims=pod.claims, disks=pod.disks,
                     anti=pod.anti_affinity_terms, affinity=pod.affinity_terms,
                     preferred=pod.preferred_affinity_terms, preferred_anti=pod.preferred_anti_affinity_terms,
                     name=pod.name, priority=pod.priority, request=dict(pod.request))


def parse_pod(pod: Mapping[str, Any]) -> PodView:
    """The typed view of a raw pod; raises `PodSpecError` naming the bad field."""
    error = PodSpecError
    metadata = payload.mapping(pod.get("metadata"), field="metadata", error=error, required=True)
    spec = payload.mapping(pod.get("spec"), field="spec", error=error, required=True)
    labels = payload.string_map(metadata.get("labels"), field="metadata.labels", error=error)
    affinity = payload.mapping(spec.get("affinity"), field="spec.affinity", error=error)
    node_affinity = payload.mapping(affinity.get("nodeAffinity"), field="spec.affinity.nodeAffinity", error=error)
    tolerations = payload.items(spec.get("tolerations"), field="spec.tolerations", error=error)
    gates = payload.items(spec.get("schedulingGates"), field="spec.schedulingGates", error=error)
    namespace = payload.string(metadata.get("namespace"), field="metadata.namespace", error=error) or "default"
    context = payload.mapping(pod.get(NAMESPACES), field=NAMESPACES, error=error)
    selected = payload.mapping(context.get("selected"), field=f"{NAMESPACES}.selected", error=error)

    def resolve(selector: Mapping[str, object]) -> frozenset[str] | None:
        names = selected.get(selector_key(selector))
        return frozenset(str(name) for name in names) if isinstance(names, list) else None

    inter_pod = {
        key: parse_terms(
            payload.mapping(affinity.get(key), field=f"spec.affinity.{key}", error=error).get(REQUIRED),
            field=f"spec.affinity.{key}.{REQUIRED}", owner_namespace=namespace, resolve=resolve)
        for key in POD_AFFINITY_KINDS
    }
    preferred = {
        key: parse_weighted_terms(
            payload.mapping(affinity.get(key), field=f"spec.affinity.{key}", error=error).get(PREFERRED),
            field=f"spec.affinity.{key}.{PREFERRED}", owner_namespace=namespace, resolve=resolve)
        for key in POD_AFFINITY_KINDS
    }
    return PodView(
        uid=payload.string(metadata.get("uid"), field="metadata.uid", error=error, required=True),
        namespace=namespace,
        name=payload.string(metadata.get("name"), field="metadata.name", error=error, required=True),
        labels=labels,
        annotations=payload.string_map(metadata.get("annotations"), field="metadata.annotations", error=error),
        scheduler_name=payload.string(spec.get("schedulerName"), field="spec.schedulerName", error=error)
        or DEFAULT_SCHEDULER,
        request=_requests(pod),
        node_selector=payload.string_map(spec.get("nodeSelector"), field="spec.nodeSelector", error=error),
        required_affinity=_required_affinity(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")),
        tolerations=tuple(
            _toleration(raw, field=f"spec.tolerations[{position}]") for position, raw in enumerate(tolerations)
        ),
        policy=labels.get(POLICY_LABEL) or None,
        pool=labels.get(POOL_LABEL) or None,
        priority=payload.integer(spec.get("priority"), field="spec.priority", error=error),
        preferred_affinity=_preferred_affinity(
            node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")),
        host_ports=_host_ports(spec),
        affinity_terms=inter_pod["podAffinity"],
        anti_affinity_terms=inter_pod["podAntiAffinity"],
        preferred_affinity_terms=preferred["podAffinity"],
        preferred_anti_affinity_terms=preferred["podAntiAffinity"],
        spread_constraints=parse_spread(spec.get("topologySpreadConstraints"), pod_labels=labels),
        namespace_labels=payload.string_map(context.get("labels"), field=f"{NAMESPACES}.labels", error=error)
        if context.get("labels") is not None else None,
        default_spread_selector=label_selector(pod[DEFAULT_SPREAD], field=DEFAULT_SPREAD)
        if pod.get(DEFAULT_SPREAD) and not spec.get("topologySpreadConstraints") else None,
        scheduling_gates=tuple(
            payload.string(payload.mapping(gate, field=f"spec.schedulingGates[{i}]", error=error,
                                           required=True).get("name"),
                           field=f"spec.schedulingGates[{i}].name", error=error, required=True)
            for i, gate in enumerate(gates)
        ),
        resource_version=payload.string(metadata.get("resourceVersion"), field="metadata.resourceVersion",
                                        error=error),
        storage=parse_storage(pod.get(STORAGE)) if pod.get(STORAGE) is not None else None,
        claims=tuple(sorted({name for name, _ephemeral in claim_names(pod)})),
        devices=parse_devices(pod.get(DEVICES), namespace=namespace) if pod.get(DEVICES) is not None else None,
        disks=parse_disks(disk_volumes(pod)),
    )


POD_AFFINITY_KINDS = ("podAffinity", "podAntiAffinity")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def check_supported(pod: Mapping[str, Any]) -> None:
    """Raise `UnsupportedPodField` naming the first field kube-scheduler's default plugins honour and hoss does not
    yet, so such a pod is refused loudly instead of being placed as if the field were absent.

    Refused: resourceClaims the dispatcher did not describe (`DEVICES`); a volume claim the dispatcher did not
    describe (`STORAGE`); a non-empty namespaceSelector the dispatcher did not resolve is refused by `parse_pod`.
    Call it on a pod `parse_pod` accepted.
    """
    spec = pod.get("spec") or {}
    storage = pod.get(STORAGE)
    if isinstance(storage, Mapping) and storage.get("unsupported"):
        raise UnsupportedPodField(str(storage["unsupported"]))
    if storage is None:
        for position, volume in enumerate(spec.get("volumes") or []):
            for source in ("persistentVolumeClaim", "ephemeral"):
                if isinstance(volume, Mapping) and volume.get(source) is not None:
                    # queued by a dispatcher that does not watch claims: what the claim needs is unknown
                    raise UnsupportedPodField(f"spec.volumes[{position}].{source}")
    if spec.get("resourceClaims") and pod.get(DEVICES) is None:
        # queued by a dispatcher that does not watch ResourceClaims: what the claims need is unknown
        raise UnsupportedPodField("spec.resourceClaims")


def parse_storage(raw: object) -> StorageNeeds:
    """The `STORAGE` context of a compact pod (`hoss.model.storage.storage_context`); raises `PodSpecError`."""
    error = PodSpecError
    context = payload.mapping(raw, field=STORAGE, error=error, required=True)
    problem = payload.string(context.get("problem"), field=f"{STORAGE}.problem", error=error)
    if problem:
        return StorageNeeds(problem=problem)
    if context.get("unsupported"):
        return StorageNeeds()  # refused by `check_supported`
    bound = []
    for i, item in enumerate(payload.items(context.get("bound"), field=f"{STORAGE}.bound", error=error)):
        field = f"{STORAGE}.bound[{i}]"
        entry = payload.mapping(item, field=field, error=error, required=True)
        bound.append(BoundVolume(
            claim=payload.string(entry.get("claim"), field=f"{field}.claim", error=error, required=True),
            pv=payload.string(entry.get("pv"), field=f"{field}.pv", error=error),
            affinity=volume_terms(entry.get("affinity"), field=f"{field}.affinity"),
            zones=payload.string_map(entry.get("zones"), field=f"{field}.zones", error=error),
            missing=entry.get("missing") is True))
    delayed = []
    for i, item in enumerate(payload.items(context.get("delayed"), field=f"{STORAGE}.delayed", error=error)):
        field = f"{STORAGE}.delayed[{i}]"
        entry = payload.mapping(item, field=field, error=error, required=True)
        options = []
        for j, option in enumerate(payload.items(entry.get("pvs"), field=f"{field}.pvs", error=error)):
            where = f"{field}.pvs[{j}]"
            pv = payload.mapping(option, field=where, error=error, required=True)
            options.append(VolumeOption(
                name=payload.string(pv.get("name"), field=f"{where}.name", error=error, required=True),
                version=payload.string(pv.get("rv"), field=f"{where}.rv", error=error),
                size=payload.integer(pv.get("size"), field=f"{where}.size", error=error),
                affinity=volume_terms(pv.get("affinity"), field=f"{where}.affinity"),
                prebound=pv.get("prebound") is True))
        topologies = None
        if entry.get("topologies") is not None:
            topologies = tuple(
                _topology_term(term, field=f"{field}.topologies[{k}]")
                for k, term in enumerate(payload.items(entry.get("topologies"), field=f"{field}.topologies",
                                                       error=error)))
        capacities = None
        if entry.get("capacities") is not None:
            capacities = tuple(
                (_selector_requirements(payload.mapping(capacity, field=f"{field}.capacities[{k}]", error=error,
                                                        required=True).get("topology"),
                                        field=f"{field}.capacities[{k}].topology"),
                 payload.integer(capacity.get("size"), field=f"{field}.capacities[{k}].size", error=error))
                for k, capacity in enumerate(payload.items(entry.get("capacities"), field=f"{field}.capacities",
                                                           error=error)))
        delayed.append(DelayedClaim(
            claim=payload.string(entry.get("claim"), field=f"{field}.claim", error=error, required=True),
            uid=payload.string(entry.get("uid"), field=f"{field}.uid", error=error),
            version=payload.string(entry.get("rv"), field=f"{field}.rv", error=error),
            size=payload.integer(entry.get("size"), field=f"{field}.size", error=error),
            storage_class=payload.string(entry.get("class"), field=f"{field}.class", error=error),
            provisioner=payload.string(entry.get("provisioner"), field=f"{field}.provisioner", error=error),
            selected_node=payload.string(entry.get("selectedNode"), field=f"{field}.selectedNode", error=error),
            volumes=tuple(options), topologies=topologies, capacities=capacities))
    once = tuple(payload.string(name, field=f"{STORAGE}.rwop[{i}]", error=error, required=True)
                 for i, name in enumerate(payload.items(context.get("rwop"), field=f"{STORAGE}.rwop", error=error)))
    attach = _attach(context["attach"]) if context.get("attach") is not None else None
    return StorageNeeds(bound=tuple(bound), delayed=tuple(delayed), once=once, attach=attach)


def _attach(raw: object) -> AttachNeeds:
    """The ``attach`` part of the storage context (`hoss.model.storage.attach_context`)."""
    error = PodSpecError
    where = f"{STORAGE}.attach"
    context = payload.mapping(raw, field=where, error=error, required=True)

    def pair(value: object, *, field: str) -> tuple[str, str]:
        items = payload.items(value, field=field, error=error)
        if len(items) != 2:
            raise PodSpecError(field=field, reason=f"expected [driver, handle], got {value!r}")
        return (payload.string(items[0], field=f"{field}[0]", error=error, required=True),
                payload.string(items[1], field=f"{field}[1]", error=error, required=True))

    limits: dict[str, dict[str, int]] = {}
    for driver, nodes in payload.mapping(context.get("limits"), field=f"{where}.limits", error=error).items():
        limits[str(driver)] = {
            str(node): payload.integer(count, field=f"{where}.limits.{driver}.{node}", error=error)
            for node, count in payload.mapping(nodes, field=f"{where}.limits.{driver}", error=error).items()}
    attachments = {
        str(node): frozenset(pair(item, field=f"{where}.attachments.{node}[{i}]")
                             for i, item in enumerate(payload.items(items, field=f"{where}.attachments.{node}",
                                                                    error=error)))
        for node, items in payload.mapping(context.get("attachments"), field=f"{where}.attachments",
                                           error=error).items()}
    return AttachNeeds(
        attachments=attachments,
        volumes=tuple(pair(item, field=f"{where}.volumes[{i}]")
                      for i, item in enumerate(payload.items(context.get("volumes"), field=f"{where}.volumes",
                                                             error=error))),
        limits=limits,
        claims={str(key): pair(value, field=f"{where}.claims.{key}")
                for key, value in payload.mapping(context.get("claims"), field=f"{where}.claims",
                                                  error=error).items()})


def parse_devices(raw: object, *, namespace: str) -> DeviceNeeds:
    """The `DEVICES` context of a compact pod (`hoss.model.resourceclaims.device_context`); raises
    `PodSpecError`. The claims' spec.devices, the classes and the slices stay raw: the allocator
    (`hoss.model.devices`) parses them and names what it refuses."""
    error = PodSpecError
    context = payload.mapping(raw, field=DEVICES, error=error, required=True)
    problem = payload.string(context.get("problem"), field=f"{DEVICES}.problem", error=error)
    if problem:
        return DeviceNeeds(problem=problem)
    claims = []
    for i, item in enumerate(payload.items(context.get("claims"), field=f"{DEVICES}.claims", error=error)):
        field = f"{DEVICES}.claims[{i}]"
        entry = payload.mapping(item, field=field, error=error, required=True)
        allocation = payload.mapping(entry.get("allocation"), field=f"{field}.allocation", error=error) \
            if entry.get("allocation") is not None else None
        selector = None
        if allocation is not None and allocation.get("nodeSelector") is not None:
            terms = payload.mapping(allocation.get("nodeSelector"), field=f"{field}.allocation.nodeSelector",
                                    error=error).get("nodeSelectorTerms")
            selector = volume_terms(terms, field=f"{field}.allocation.nodeSelector.nodeSelectorTerms")
        claims.append(ClaimUse(
            entry=payload.string(entry.get("entry"), field=f"{field}.entry", error=error),
            claim=payload.string(entry.get("claim"), field=f"{field}.claim", error=error, required=True),
            uid=payload.string(entry.get("uid"), field=f"{field}.uid", error=error),
            version=payload.string(entry.get("rv"), field=f"{field}.rv", error=error),
            allocation=dict(allocation) if allocation is not None else None, selector=selector,
            reserved=entry.get("reserved") is True,
            devices=dict(payload.mapping(entry.get("devices"), field=f"{field}.devices", error=error))
            if allocation is None else None))
    classes = payload.mapping(context.get("classes"), field=f"{DEVICES}.classes", error=error)
    slices = payload.items(context.get("slices"), field=f"{DEVICES}.slices", error=error)
    allocated = []
    for i, item in enumerate(payload.items(context.get("allocated"), field=f"{DEVICES}.allocated", error=error)):
        parts = payload.items(item, field=f"{DEVICES}.allocated[{i}]", error=error)
        if len(parts) != 3:
            raise PodSpecError(field=f"{DEVICES}.allocated[{i}]",
                               reason=f"expected [driver, pool, device], got {item!r}")
        allocated.append((str(parts[0]), str(parts[1]), str(parts[2])))
    extended = []
    for i, item in enumerate(payload.items(context.get("extended"), field=f"{DEVICES}.extended", error=error)):
        field = f"{DEVICES}.extended[{i}]"
        entry = payload.mapping(item, field=field, error=error, required=True)
        extended.append(ExtendedResource(
            resource=payload.string(entry.get("resource"), field=f"{field}.resource", error=error, required=True),
            device_class=payload.string(entry.get("class"), field=f"{field}.class", error=error, required=True),
            requests=tuple(dict(payload.mapping(r, field=f"{field}.requests", error=error, required=True))
                           for r in payload.items(entry.get("requests"), field=f"{field}.requests", error=error)),
            mappings=tuple(dict(payload.mapping(m, field=f"{field}.mappings", error=error, required=True))
                           for m in payload.items(entry.get("mappings"), field=f"{field}.mappings", error=error))))
    stale = None
    if context.get("stale") is not None:
        found = payload.mapping(context.get("stale"), field=f"{DEVICES}.stale", error=error, required=True)
        stale = (payload.string(found.get("claim"), field=f"{DEVICES}.stale.claim", error=error, required=True),
                 payload.string(found.get("uid"), field=f"{DEVICES}.stale.uid", error=error))
    return DeviceNeeds(namespace=namespace, claims=tuple(claims), classes=tuple(sorted(classes.items())),
                       slices=tuple(slice_ for slice_ in slices if isinstance(slice_, dict)),
                       allocated=frozenset(allocated), extended=tuple(extended), stale=stale)


def volume_terms(raw: object, *, field: str) -> tuple[SelectorTerm, ...] | None:
    """A PV's nodeAffinity.required.nodeSelectorTerms (None: the PV has no node affinity)."""
    if raw is None:
        return None
    return tuple(_term(term, field=f"{field}[{position}]")
                 for position, term in enumerate(payload.items(raw, field=field, error=PodSpecError)))


def _topology_term(raw: object, *, field: str) -> SelectorTerm:
    """A StorageClass's allowedTopologies term: every matchLabelExpressions entry is an ``In`` requirement."""
    term = payload.mapping(raw, field=field, error=PodSpecError, required=True)
    expressions = payload.items(term.get("matchLabelExpressions"), field=f"{field}.matchLabelExpressions",
                                error=PodSpecError)
    return SelectorTerm(match_expressions=tuple(
        _requirement({"key": expression.get("key") if isinstance(expression, Mapping) else None, "operator": "In",
                      "values": expression.get("values") if isinstance(expression, Mapping) else None},
                     field=f"{field}.matchLabelExpressions[{position}]", operators=LABEL_OPERATORS)
        for position, expression in enumerate(expressions)), match_fields=())


def _selector_requirements(raw: object, *, field: str) -> tuple[SelectorRequirement, ...]:
    """A metav1.LabelSelector over node labels as ANDed requirements (matchLabels read as ``In``)."""
    selector = payload.mapping(raw, field=field, error=PodSpecError, required=True)
    pairs = payload.string_map(selector.get("matchLabels"), field=f"{field}.matchLabels", error=PodSpecError)
    expressions = payload.items(selector.get("matchExpressions"), field=f"{field}.matchExpressions",
                                error=PodSpecError)
    return (*(SelectorRequirement(key=key, operator="In", values=(value,)) for key, value in sorted(pairs.items())),
            *(_requirement(item, field=f"{field}.matchExpressions[{position}]", operators=LABEL_OPERATORS)
              for position, item in enumerate(expressions)))


def _preferred_affinity(raw: object) -> tuple[PreferredTerm, ...]:
    field = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    terms = []
    for position, item in enumerate(payload.items(raw, field=field, error=PodSpecError)):
        entry_field = f"{field}[{position}]"
        entry = payload.mapping(item, field=entry_field, error=PodSpecError, required=True)
        weight = payload.integer(entry.get("weight"), field=f"{entry_field}.weight", error=PodSpecError)
        if not 1 <= weight <= 100:
            raise PodSpecError(field=f"{entry_field}.weight", reason=f"must be in the range 1-100, got {weight}")
        terms.append(PreferredTerm(weight=weight, term=_term(entry.get("preference"),
                                                            field=f"{entry_field}.preference")))
    return tuple(terms)


def _host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    ports: list[HostPort] = []
    for kind in ("initContainers", "containers"):
        for position, raw in enumerate(payload.items(spec.get(kind), field=f"spec.{kind}", error=PodSpecError)):
            field = f"spec.{kind}[{position}]"
            container = payload.mapping(raw, field=field, error=PodSpecError, required=True)
            if kind == "initContainers" and container.get("restartPolicy") != "Always":
                continue  # only sidecars run for the pod's whole life
            for index, item in enumerate(payload.items(container.get("ports"), field=f"{field}.ports",
                                                      error=PodSpecError)):
                port_field = f"{field}.ports[{index}]"
                port = payload.mapping(item, field=port_field, error=PodSpecError, required=True)
                host_port = payload.integer(port.get("hostPort"), field=f"{port_field}.hostPort", error=PodSpecError)
                if host_port <= 0:
                    continue
                ports.append(HostPort(
                    protocol=payload.string(port.get("protocol"), field=f"{port_field}.protocol",
                                            error=PodSpecError) or "TCP",
                    ip=payload.string(port.get("hostIP"), field=f"{port_field}.hostIP", error=PodSpecError)
                    or ANY_HOST_IP,
                    port=host_port,
                ))
    return tuple(ports)


def _requests(pod: Mapping[str, Any]) -> ResourceVector:
    try:
        return pod_requests(pod)
    except QuantityError as error:
        # One error type for a malformed pod, whatever part of it is wrong.
        raise PodSpecError(field=error.field, reason=f"invalid quantity {error.value!r}: {error.reason}") from error


def _required_affinity(raw: object) -> tuple[SelectorTerm, ...] | None:
    if raw is None:
        return None
    selector = payload.mapping(raw, field=_AFFINITY_FIELD, error=PodSpecError)
    field = f"{_AFFINITY_FIELD}.nodeSelectorTerms"
    terms = payload.items(selector.get("nodeSelectorTerms"), field=field, error=PodSpecError)
    if not terms:
        raise PodSpecError(field=field, reason="must have at least one node selector term")
    return tuple(_term(term, field=f"{field}[{position}]") for position, term in enumerate(terms))


def _term(raw: object, *, field: str) -> SelectorTerm:
    term = payload.mapping(raw, field=field, error=PodSpecError, required=True)
    expressions = payload.items(term.get("matchExpressions"), field=f"{field}.matchExpressions", error=PodSpecError)
    fields = payload.items(term.get("matchFields"), field=f"{field}.matchFields", error=PodSpecError)
    return SelectorTerm(
        match_expressions=tuple(
            _requirement(item, field=f"{field}.matchExpressions[{position}]", operators=LABEL_OPERATORS)
            for position, item in enumerate(expressions)
        ),
        match_fields=tuple(
            _requirement(item, field=f"{field}.matchFields[{position}]", operators=FIELD_OPERATORS)
            for position, item in enumerate(fields)
        ),
    )


def _requirement(raw: object, *, field: str, operators: frozenset[str]) -> SelectorRequirement:
    requirement = payload.mapping(raw, field=field, error=PodSpecError, required=True)
    key = payload.string(requirement.get("key"), field=f"{field}.key", error=PodSpecError, required=True)
    operator = payload.string(requirement.get("operator"), field=f"{field}.operator", error=PodSpecError, required=True)
    if operator not in operators:
        raise PodSpecError(
            field=f"{field}.operator", reason=f"unknown operator {operator!r}, expected one of {sorted(operators)}"
        )
    values_field = f"{field}.values"
    raw_values = payload.items(requirement.get("values"), field=values_field, error=PodSpecError)
    values = tuple(
        payload.string(value, field=f"{values_field}[{position}]", error=PodSpecError)
        for position, value in enumerate(raw_values)
    )
    if operator in ("In", "NotIn") and not values:
        raise PodSpecError(field=values_field, reason=f"must be non-empty for operator {operator}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise PodSpecError(field=values_field, reason=f"must be empty for operator {operator}")
    if operator in ("Gt", "Lt") and (len(values) != 1 or parse_integer(values[0]) is None):
        raise PodSpecError(field=values_field, reason=f"must be a single integer for operator {operator}")
    if operators is FIELD_OPERATORS and key != NODE_NAME_FIELD:
        raise PodSpecError(field=f"{field}.key", reason=f"unsupported field {key!r}, only {NODE_NAME_FIELD}")
    return SelectorRequirement(key=key, operator=operator, values=values)


def _toleration(raw: object, *, field: str) -> Toleration:
    toleration = payload.mapping(raw, field=field, error=PodSpecError, required=True)
    key = payload.string(toleration.get("key"), field=f"{field}.key", error=PodSpecError)
    operator = payload.string(toleration.get("operator"), field=f"{field}.operator", error=PodSpecError) or "Equal"
    value = payload.string(toleration.get("value"), field=f"{field}.value", error=PodSpecError)
    effect = payload.string(toleration.get("effect"), field=f"{field}.effect", error=PodSpecError)
    if operator not in TOLERATION_OPERATORS:
        raise PodSpecError(field=f"{field}.operator", reason=f"unknown operator {operator!r}, expected Equal or Exists")
    if operator == "Exists" and value:
        raise PodSpecError(field=f"{field}.value", reason="must be empty when operator is Exists")
    if not key and operator != "Exists":
        raise PodSpecError(field=f"{field}.operator", reason="must be Exists when key is empty")
    if effect and effect not in TAINT_EFFECTS:
        raise PodSpecError(field=f"{field}.effect", reason=f"unknown effect {effect!r}")
    return Toleration(key=key, operator=operator, value=value, effect=effect)
