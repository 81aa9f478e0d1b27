"""What the rescheduler reads before it plans: the ledger's nodes, room and holds, and the apiserver's pods and
PodDisruptionBudgets, turned into the planner's `plan.Node` and `plan.Pod` (rescheduler/plan.py).

Whether a pod may move is decided here, from the pod itself (`movable`):

- it must have a controller (ownerReference ``controller: true``) of a kind in ``movable_owner_kinds`` (by
  default ReplicaSet, StatefulSet, Job, ReplicationController: controllers that create a replacement elsewhere;
  a DaemonSet's pod is recreated on the same node, and a bare pod not at all);
- no ``hoss.io/movable: "false"`` annotation;
- no gang label or annotation (a gang is never split, so its members never move);
- no host ports, required pod (anti-)affinity, DoNotSchedule spread constraints or volume claims (a claim's PV may
  allow only some nodes): the planner checks room, node selectors, node affinity, taints and pools for every
  target, not those;
- ResourceClaims only when each is made from a template (`rescheduler.devices`: GPUs that are DRA devices are
  counted from the DRA objects, and such a pod moves only between nodes whose GPUs are devices);
- running (bound, not being deleted).

Where a pod may run (`plan.Pod.nodes`) comes from the workers' own filters (NodeUnschedulable, TaintToleration,
NodeAffinity, NodePool) over the workers' node table loaded from the ledger, so the rescheduler and the workers
agree on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hoss.errors import HossError
from hoss.framework.budget import Budget, parse_budget
from hoss.framework.cycle import Profile, run_filters
from hoss.framework.feed import NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import parse_pod
from hoss.framework.profiles import parse_profiles
from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from hoss.model import compact
from hoss.model.objects import Json
from hoss.model.resources import pod_requests
from rescheduler.devices import DeviceGpus, claims_movable, device_gpus
from rescheduler.plan import GPU, Node, Pod

MOVABLE_ANNOTATION = "hoss.io/movable"
GANG_KEYS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io/name", "scheduling.k8s.io/group-name")
DEFAULT_MOVABLE_KINDS = ("ReplicaSet", "StatefulSet", "Job", "ReplicationController")

_PLACEMENT_FILTERS = {"defaultProfile": "placement", "profiles": [{"name": "placement", "filters": [
    {"name": "NodeUnschedulable"}, {"name": "TaintToleration"}, {"name": "NodeAffinity"}, {"name": "NodePool"},
]}]}


def _placement_profile() -> Profile:
    profiles, default = parse_profiles(_PLACEMENT_FILTERS, source="rescheduler placement filters")
    return profiles[default]


@dataclass
class ClusterView:
    """One reading of the cluster, as the planner needs it."""

    nodes: list[Node]
    placed: list[Pod]
    pending: list[Pod]
    """Pending GPU pods (no node yet), oldest first."""
    allowed: dict[str, int]
    """Per PodDisruptionBudget (namespace/name), how many more pods it lets go."""
    raw: dict[str, Json]
    """uid -> the pod as read (for events and evictions)."""
    gated: set[str]
    """uids of pending pods held by the `hoss.io/defragment` scheduling gate for the rescheduler."""


DEFRAGMENT_GATE = "hoss.io/defragment"
"""A pod created with this scheduling gate waits for the rescheduler: it plans room for the pod (or finds that no
move helps), holds it, and removes the gate."""


def movable(pod: Mapping[str, Any], kinds: Sequence[str]) -> str:
    """'' when the rescheduler may evict `pod` to move it, else why not."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    if str(annotations.get(MOVABLE_ANNOTATION, "")).lower() == "false":
        return f'annotation {MOVABLE_ANNOTATION} is "false"'
    if any(key in labels or key in annotations for key in GANG_KEYS):
        return "gang member (a gang is never split)"
    owner = next((ref for ref in metadata.get("ownerReferences") or []
                  if isinstance(ref, dict) and ref.get("controller") is True), None)
    if owner is None:
        return "no controller would recreate it"
    if owner.get("kind") not in kinds:
        return f"its controller is a {owner.get('kind')} (movable kinds: {', '.join(kinds)})"
    if metadata.get("deletionTimestamp"):
        return "being deleted"
    affinity = spec.get("affinity") or {}
    if any((affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
           for kind in ("podAffinity", "podAntiAffinity")):
        return "required pod (anti-)affinity (not checked by the rescheduler)"
    if any(c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
           for c in spec.get("topologySpreadConstraints") or [] if isinstance(c, dict)):
        return "DoNotSchedule spread constraints (not checked by the rescheduler)"
    if compact.host_ports(pod):
        return "host ports (not checked by the rescheduler)"
    if compact.claim_names(pod):
        return "volume claims (their volumes' nodes are not checked by the rescheduler)"
    if spec.get("resourceClaims"):
        return claims_movable(pod)
    return ""


def pod_key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', 'default')}/{metadata.get('name', '')}"


def _budgets_of(pod: Mapping[str, Any], budgets: Sequence[Budget]) -> tuple[str, ...]:
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    namespace = metadata.get("namespace", "default")
    return tuple(f"{b.namespace}/{b.name}" for b in budgets
                 if b.selector is not None and labels and b.namespace == namespace and b.selector.matches(labels))


async def read_cluster(rest: KubeREST, ledger: Ledger, *, node_selector: Mapping[str, str] | None = None,
                       movable_kinds: Sequence[str] = DEFAULT_MOVABLE_KINDS,
                       scheduler_names: Sequence[str] = ("hoss",)) -> ClusterView:
    """Read the ledger (nodes, used room, holds) and the apiserver (pods, PodDisruptionBudgets)."""
    table = NodeTable()
    feed = NodeFeed(ledger, table)
    if not await feed.load():
        raise HossError("the ledger is not ready (not rebuilt since Redis started)")
    selector = dict(node_selector or {})
    names = [name for name in table.names
             if all(_label(table, name, key) == value for key, value in selector.items())]
    usage = await ledger.node_usage(names)
    held: dict[str, dict[str, int]] = {}
    for nomination in (await ledger.nominations()).values():
        bucket = held.setdefault(nomination.node, {})
        for resource, amount in nomination.request.items():
            bucket[resource] = bucket.get(resource, 0) + amount
    devices = await _device_gpus(rest)
    nodes = []
    for name, (counted, counted_used) in usage.items():
        extra = devices.nodes.get(name, 0)
        alloc = {**counted, GPU: counted.get(GPU, 0) + extra} if extra else counted
        used = {**counted_used, GPU: counted_used.get(GPU, 0) + devices.used.get(name, 0)} if extra else counted_used
        if alloc.get(GPU, 0) > 0:
            nodes.append(Node(name=name, alloc=alloc, used=used, held=held.get(name, {})))
    gpu_nodes = {n.name for n in nodes}
    device_nodes = {name for name in gpu_nodes if devices.nodes.get(name)}
    pods_json = await rest.request("GET", "/api/v1/pods",
                                   params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"})
    budgets_json = await rest.request("GET", "/apis/policy/v1/poddisruptionbudgets")
    budgets = []
    for raw in budgets_json.get("items") or []:
        try:
            budgets.append(parse_budget(raw))
        except HossError:
            continue  # a malformed budget protects nothing we can read: its pods are left alone below
    allowed = {f"{b.namespace}/{b.name}": b.disruptions_allowed for b in budgets}
    profile = _placement_profile()
    row_names = list(table.names)
    placed, pending, raw_by_uid, gated = [], [], {}, set()
    for raw in pods_json.get("items") or []:
        metadata = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        uid = str(metadata.get("uid") or "")
        try:
            request = pod_requests(raw)
        except HossError:
            continue
        if spec.get("resourceClaims") and (claimed := devices.pod_gpus(raw)):
            request = {**request, GPU: request.get(GPU, 0) + claimed}
        if request.get(GPU, 0) <= 0:
            continue
        node = str(spec.get("nodeName") or "")
        if node and node not in gpu_nodes:
            continue
        # a pod whose GPUs are devices stays on nodes whose GPUs are devices, and the ledger holds the rest of it
        on_devices = node in device_nodes if node else devices.served and bool(device_nodes)
        kind = device_nodes if on_devices else gpu_nodes - device_nodes
        try:
            view = parse_pod(raw)
            mask, _reasons = run_filters(profile.filters, view, table)
            allowed_nodes = frozenset(row_names[i] for i in np.flatnonzero(mask)) & kind
        except HossError:
            continue  # malformed: the workers report it; the rescheduler leaves it alone
        gates = [g.get("name") for g in spec.get("schedulingGates") or [] if isinstance(g, dict)]
        if not node and any(g != DEFRAGMENT_GATE for g in gates):
            continue  # waiting for someone else's gate
        if not node and spec.get("schedulerName", "default-scheduler") not in scheduler_names:
            continue  # its scheduler would not look for the room held for it
        why = movable(raw, movable_kinds) if node else ""
        pod = Pod(key=pod_key(raw), uid=uid, node=node, request=request, movable=why,
                  owner=compact.controller_uid(raw), budgets=_budgets_of(raw, budgets), nodes=allowed_nodes,
                  held={r: a for r, a in request.items() if r != GPU} if on_devices else None)
        raw_by_uid[uid] = raw
        if node:
            placed.append(pod)
        elif not metadata.get("deletionTimestamp"):
            pending.append(pod)
            if DEFRAGMENT_GATE in gates:
                gated.add(uid)
    pending.sort(key=lambda p: str((raw_by_uid[p.uid].get("metadata") or {}).get("creationTimestamp", "")))
    return ClusterView(nodes=nodes, placed=placed, pending=pending, allowed=allowed, raw=raw_by_uid, gated=gated)


async def _device_gpus(rest: KubeREST) -> DeviceGpus:
    """The GPUs that are DRA devices (none where resource.k8s.io/v1 is not served)."""
    lists = []
    for kind in ("resourceslices", "resourceclaims", "deviceclasses"):
        try:
            lists.append((await rest.request("GET", f"/apis/resource.k8s.io/v1/{kind}")).get("items") or [])
        except KubeError as error:
            if error.status != 404:
                raise
            return DeviceGpus()
    slices, claims, classes = lists
    return device_gpus(slices=slices, claims=claims, classes=classes, resource=GPU)


def _label(table: NodeTable, name: str, key: str) -> str | None:
    codes = table.label_codes(key)
    values = table.label_values(key)
    code = int(codes[table.row(name)])
    return values[code] if 0 <= code < len(values) else None
