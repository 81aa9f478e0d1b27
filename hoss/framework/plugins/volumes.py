"""VolumeBinding and VolumeZone: the nodes a pod's volume claims allow, as kube-scheduler's plugins of those names
read them. Pure, vectorised over the nodes; what the claims need comes from the dispatcher in the pod's compact
form (`hoss.model.storage`, `PodView.storage`), never from the apiserver.

VolumeBinding:
- PreFilter (`prefilter`): a claim missing, being deleted or lost, an ephemeral claim not created yet, or a claim
  neither bound nor of a WaitForFirstConsumer class ("pod has unbound immediate PersistentVolumeClaims") leaves the
  pod unschedulable on every node with that message (``0/N nodes are available: <message>.``). The dispatcher
  sends the pod again when the claim changes.
- Filter, per node (kube-scheduler's FindPodVolumes): every bound claim's PV must allow the node by its node
  affinity (``node(s) didn't match PersistentVolume's node affinity``; a PV that does not exist rejects every
  node: ``node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)``). The claims of a
  WaitForFirstConsumer class, smallest first, each take the smallest free PV the node's labels allow (one taken by
  an earlier claim of the pod is not taken twice; a PV pre-bound to the claim is the only one it may take); a claim
  with no such PV, or with ``volume.kubernetes.io/selected-node`` on this node, is provisioned: its class needs a
  provisioner and allowedTopologies matching the node (else ``node(s) didn't find available persistent volumes to
  bind``), and, where the CSI driver publishes CSIStorageCapacity, one capacity with the node in its topology and
  room for the claim (else ``node(s) did not have enough free storage``). A claim already naming another node as
  selected rejects the node.
- `plan` is the per-node choice of PVs; the worker binds the chosen node's (`workers.volumes`).

VolumeRestrictions: a claim with the ReadWriteOncePod access mode that another pod already uses (any pod with a
ledger entry, on any node: the pod index) rejects every node (``node(s) unavailable due to PersistentVolumeClaim
with ReadWriteOncePod access mode already in-use by another pod``), as kube-scheduler's Filter does, so preemption
may evict a lower-priority user. Two workers deciding at once are kept apart by the ledger's promise of the claim
before the binding (`workers.volumes`, ``promise_claims.lua``). First, as there, an in-tree disk of the pod
(gcePersistentDisk, awsElasticBlockStore, rbd, iscsi inline volumes) that a pod on the node mounts already rejects
the node (``node(s) had no available disk``), unless both mount it read-only (GCE PD, iSCSI, rbd; an EBS volume
conflicts in any mode; rbd images are one when pool and image match and the monitors overlap).

NodeVolumeLimits: on a node whose CSINode gives a CSI driver an attach limit (spec.drivers[].allocatable.count),
the volumes of that driver the pods on the node use (unique by volume handle) plus the pod's own not among them
must not exceed it (``node(s) exceed max volume count``), as kube-scheduler's CSILimits counts them: a bound
claim's CSI PV, a claim without a PV by its class's provisioner (a handle of its own), generic ephemeral volumes
by their claim; inline CSI volumes are not counted (`hoss.model.storage.attach_context`). Two workers filling a
node's last slot at once are kept apart by the ledger's promise of the slots (`workers.volumes`,
``promise_attach.lua``).

VolumeZone: a bound PV's zone and region labels (``topology.kubernetes.io/zone`` ..., values joined by ``__``
for several) must hold the node's value of that label, on nodes that have any such label (``node(s) had no
available volume zone``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hoss.framework.cycle import BoolArray, FilterResult, TakesNoArgs
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.affinity import label_matches, term_matches
from hoss.framework.pod import DelayedClaim, PodView, SelectorRequirement, SelectorTerm, StorageNeeds
from hoss.model.storage import NO_PROVISIONER, ZONE_LABELS

NODE_CONFLICT = "node(s) didn't match PersistentVolume's node affinity"
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
NOT_ENOUGH_SPACE = "node(s) did not have enough free storage"
PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
NO_VOLUME_ZONE = "node(s) had no available volume zone"
DISK_CONFLICT = "node(s) had no available disk"
MAX_VOLUME_COUNT = "node(s) exceed max volume count"
READ_WRITE_ONCE_POD_CONFLICT = ("node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode "
                                "already in-use by another pod")


def terms_match(nodes: NodeTable, terms: tuple[SelectorTerm, ...] | None) -> BoolArray:
    """Nodes matching any of `terms` (a node selector's ORed terms); every node when None."""
    rows = len(nodes)
    if terms is None:
        return np.ones(rows, dtype=np.bool_)
    matched = np.zeros(rows, dtype=np.bool_)
    for term in terms:
        matched |= term_matches(nodes, term)
    return matched


def requirements_hold(nodes: NodeTable, requirements: tuple[SelectorRequirement, ...]) -> BoolArray:
    """Nodes meeting every requirement (a label selector; empty: every node)."""
    held = np.ones(len(nodes), dtype=np.bool_)
    for requirement in requirements:
        held &= label_matches(nodes, requirement)
    return held


@dataclass(frozen=True)
class Plan:
    """Per node, what each claim waiting for its first consumer gets: the index of its PV in
    `DelayedClaim.volumes` (-1: none, it is provisioned there), and the verdict masks."""

    choices: dict[str, NDArray[np.int32]]
    """Claim name -> per node the PV index taken (-1: none)."""
    bound_ok: BoolArray
    binds: BoolArray
    """Every claim finds a PV or may be provisioned on the node."""
    space: BoolArray
    """Every claim provisioned on the node finds room (CSIStorageCapacity)."""
    missing: bool


def plan(storage: StorageNeeds, nodes: NodeTable) -> Plan:
    """kube-scheduler's FindPodVolumes over every node (see the module docstring)."""
    rows = len(nodes)
    bound_ok = np.ones(rows, dtype=np.bool_)
    missing = False
    for volume in storage.bound:
        if volume.missing:
            missing = True
            break  # kube-scheduler's checkBoundClaims stops at the first PV it cannot find
        bound_ok &= terms_match(nodes, volume.affinity)
    binds = np.ones(rows, dtype=np.bool_)
    space = np.ones(rows, dtype=np.bool_)
    choices: dict[str, NDArray[np.int32]] = {}
    if not storage.delayed:
        return Plan(choices=choices, bound_ok=bound_ok, binds=binds, space=space, missing=missing)
    names = np.array(nodes.names, dtype=object)
    elsewhere = np.zeros(rows, dtype=np.bool_)
    for claim in storage.delayed:
        if claim.selected_node:
            elsewhere |= names != claim.selected_node
    taken: dict[str, BoolArray] = {}
    provisioned: list[tuple[DelayedClaim, BoolArray]] = [
        (claim, np.ones(rows, dtype=np.bool_)) for claim in storage.delayed if claim.selected_node]
    for claim in storage.delayed:
        if claim.selected_node:
            continue
        choice = np.full(rows, -1, dtype=np.int32)
        open_rows = np.ones(rows, dtype=np.bool_)
        for index, option in enumerate(claim.volumes):
            free = ~taken.get(option.name, np.zeros(rows, dtype=np.bool_))
            if option.prebound:
                # the claim's own PV, where not taken by an earlier claim: that one or none
                fits = open_rows & free & terms_match(nodes, option.affinity)
                choice[fits] = index
                open_rows &= ~free
                continue
            fits = open_rows & free & terms_match(nodes, option.affinity)
            choice[fits] = index
            open_rows &= ~fits
        for index, option in enumerate(claim.volumes):
            taken[option.name] = taken.get(option.name, np.zeros(rows, dtype=np.bool_)) | (choice == index)
        choices[claim.claim] = choice
        provisioned.append((claim, choice < 0))
    going = np.ones(rows, dtype=np.bool_)
    provisions = np.ones(rows, dtype=np.bool_)
    for claim, needed in provisioned:
        applies = needed & going
        if not applies.any():
            continue
        if not claim.provisioner or claim.provisioner == NO_PROVISIONER:
            provisions &= ~applies
            going &= ~applies
            continue
        outside = applies & ~_topologies_match(nodes, claim.topologies)
        provisions &= ~outside
        going &= ~outside
        if claim.capacities is not None:
            short = applies & ~outside & ~_room(nodes, claim)
            space &= ~short
            going &= ~short
    binds = provisions & ~elsewhere
    space |= elsewhere  # kube-scheduler stops at the selected node's mismatch: no other reason for those nodes
    return Plan(choices=choices, bound_ok=bound_ok, binds=binds, space=space, missing=missing)


def _topologies_match(nodes: NodeTable, terms: tuple[SelectorTerm, ...] | None) -> BoolArray:
    """A class's allowedTopologies: none (or an empty list) allows every node; a term without expressions none."""
    if not terms:
        return np.ones(len(nodes), dtype=np.bool_)
    matched = np.zeros(len(nodes), dtype=np.bool_)
    for term in terms:
        if term.match_expressions:
            matched |= term_matches(nodes, term)
    return matched


def _room(nodes: NodeTable, claim: DelayedClaim) -> BoolArray:
    """Nodes in the topology of a CSIStorageCapacity of the claim's class with room for the claim."""
    room = np.zeros(len(nodes), dtype=np.bool_)
    for requirements, size in claim.capacities or ():
        if size >= claim.size:
            room |= requirements_hold(nodes, requirements)
    return room


class VolumeBinding(TakesNoArgs):
    """PreFilter and filter: the pod's volume claims (see the module docstring)."""

    name = "VolumeBinding"

    def prefilter(self, pod: PodView) -> str | None:
        """kube-scheduler's PreFilter rejection of the pod on every node, or None."""
        return pod.storage.problem or None if pod.storage is not None else None

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        if pod.storage is None:
            return FilterResult.from_reasons(rows, {})
        if pod.storage.problem:  # `prefilter` rejects such a pod first; a caller that skips it still places none
            return FilterResult.from_reasons(rows, {pod.storage.problem: np.ones(rows, dtype=np.bool_)})
        verdict = plan(pod.storage, nodes)
        reasons: dict[str, BoolArray] = {}
        for reason, passed in ((NODE_CONFLICT, verdict.bound_ok), (BIND_CONFLICT, verdict.binds),
                               (NOT_ENOUGH_SPACE, verdict.space)):
            if not passed.all():
                reasons[reason] = ~passed
        if verdict.missing:
            reasons[PV_NOT_EXIST] = np.ones(rows, dtype=np.bool_)
        return FilterResult.from_reasons(rows, reasons)


class VolumeZone(TakesNoArgs):
    """Filter: a bound PV's zone labels must hold the node's zone (see the module docstring)."""

    name = "VolumeZone"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        zoned = [volume for volume in (pod.storage.bound if pod.storage is not None else ()) if volume.zones]
        if not zoned:
            return FilterResult.from_reasons(rows, {})
        labelled = np.zeros(rows, dtype=np.bool_)
        for key in ZONE_LABELS:
            labelled |= label_matches(nodes, SelectorRequirement(key=key, operator="Exists", values=()))
        fits = np.ones(rows, dtype=np.bool_)
        for volume in zoned:
            for key, value in volume.zones.items():
                fits &= label_matches(nodes, SelectorRequirement(key=key, operator="In",
                                                                 values=tuple(value.split("__"))))
        rejected = labelled & ~fits
        return FilterResult.from_reasons(rows, {NO_VOLUME_ZONE: rejected} if rejected.any() else {})


def disk_conflicts(pod: PodView, nodes: NodeTable) -> BoolArray:
    """Nodes where a pod already placed mounts one of the pod's in-tree disks in a conflicting way."""
    conflicted = np.zeros(len(nodes), dtype=np.bool_)
    if not pod.disks:
        return conflicted
    for other in nodes.pods.values():
        if other.disks and other.uid != pod.uid and other.node in nodes and any(
                disk.conflicts(theirs) for disk in pod.disks for theirs in other.disks):
            conflicted[nodes.row(other.node)] = True
    return conflicted


class VolumeRestrictions(TakesNoArgs):
    """Filter: an in-tree disk of the pod mounted on the node already rejects the node; a ReadWriteOncePod claim of
    the pod used by another pod rejects every node (module docstring)."""

    name = "VolumeRestrictions"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        reasons: dict[str, BoolArray] = {}
        conflicted = disk_conflicts(pod, nodes)
        if conflicted.any():
            reasons[DISK_CONFLICT] = conflicted
        once = set(pod.storage.once) if pod.storage is not None else set()
        if once and any(other.uid != pod.uid and other.namespace == pod.namespace and once.intersection(other.claims)
                        for other in nodes.pods.values()):
            reasons[READ_WRITE_ONCE_POD_CONFLICT] = ~conflicted  # kube-scheduler checks the disks first
        return FilterResult.from_reasons(rows, reasons)


def attached_on(pod: PodView, node: str, nodes: NodeTable) -> dict[str, set[str]]:
    """The handles of the attach-limited drivers the pods on `node` (but `pod`) use, by driver."""
    assert pod.storage is not None and pod.storage.attach is not None
    return pod.storage.attach.attached(
        nodes.pods[uid] for uid in nodes.pods_on.get(node, ()) if uid != pod.uid and uid in nodes.pods)


def over_limit(pod: PodView, nodes: NodeTable) -> BoolArray:
    """Nodes where the pod's new volumes would exceed a CSI driver's attach limit (module docstring)."""
    over = np.zeros(len(nodes), dtype=np.bool_)
    attach = pod.storage.attach if pod.storage is not None else None
    if attach is None:
        return over
    limited = {node for driver, _handle in attach.volumes for node in attach.limits.get(driver, {})}
    for node in limited:
        if node in nodes and attach.exceeds(node, attached_on(pod, node, nodes)):
            over[nodes.row(node)] = True
    return over


class NodeVolumeLimits(TakesNoArgs):
    """Filter: a CSI driver's attach limit on the node (module docstring)."""

    name = "NodeVolumeLimits"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        over = over_limit(pod, nodes)
        return FilterResult.from_reasons(len(nodes), {MAX_VOLUME_COUNT: over} if over.any() else {})
