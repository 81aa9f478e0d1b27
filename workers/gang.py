"""Gang placement: nodes for every member of a pod group at once, packed onto few leaf switches. Pure, no I/O.

`place_gang` decides for the whole gang on a scratch copy of the node table's usage: each member placed there
consumes its request, so the next member sees the room that is left, exactly as the ledger will after the
worker's one all-or-nothing ``reserve_gang`` call. The real `NodeTable`'s usage is never modified; its pod
index holds the planned members only while the plan is made.

With a topology key (a node label naming the node's leaf switch), members that talk to each other should share
as few leaf switches as possible, and the leaves chosen should be the tightest fit so that large free leaves stay
free for the next large gang:
1. Per node, the room for gang members: how many copies of the largest member request (per resource) fit in
   its free resources, on nodes that pass the profile's filters for every kind of member. Per leaf, the sum.
   Using the largest request makes the room a lower bound, so a plan that holds the gang really does: placing a
   member smaller than that request takes at most one unit of room away.
2. One leaf that holds the whole gang, with the least room left over. Else the fewest leaves: the largest
   leaves first, the last one the tightest that covers what is still missing. Else (the leaves cannot hold the
   whole gang) the same for ``min_available`` members.
3. Members are placed one by one, in the order given, each on the best node of the planned leaves under the
   profile's scores (e.g. bin-packing within the leaf); a member that does not fit there may go to any node.
   Each member placed joins the pod index for the next member's decision (inter-pod affinity, anti-affinity,
   topology spread count it, as kube-scheduler would count an earlier pod), and leaves it when the plan is
   made; the worker's one ``reserve_gang`` call then checks that no inter-pod domain the plan read changed
   since (the ledger's race rule, as for single pods).

As many members as fit are placed; fewer than ``min_available`` makes the gang `Unschedulable`, with the
kube-scheduler reasons of the first member that did not fit.

With a domain key (a Kubernetes PodGroup's ``schedulingConstraints.topology``), the gang is placed within one
domain of that node label or not at all, as kube-scheduler's TopologyPlacement: nodes without the label are out;
the domain of members bound already, if any, is the only one; else the domains are tried in turn, those whose
room holds the whole gang first (the tightest first), then those that hold min-available (the largest first), and
the first where min-available members fit wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hoss.framework.cycle import BoolArray, Placement, Profile, Unschedulable, choose, evaluate, run_filters
from hoss.framework.node import NodeView
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.devices import allocation_at
from hoss.framework.pod import PodView, placed_view
from hoss.framework.podindex import HostPort, PlacedPod
from hoss.model.devices import devices_of

DEFAULT_TOPOLOGY_KEY = "topology.hoss.io/leaf"

GROUP_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io/name")
"""Pod labels that name a pod's group (scheduler-plugins' PodGroup, the lightweight label)."""
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
"""Volcano's annotation naming a pod's group."""

IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class GangPlacement:
    """Nodes for the members that fit (at least ``min_available`` of them)."""

    assignments: dict[str, str]
    """Member pod uid -> node."""
    leaves: list[str]
    """The leaf switches the assigned nodes hang off, sorted; empty without a topology key."""


GangDecision = GangPlacement | Unschedulable


def place_gang(
    profile: Profile,
    members: Sequence[PodView],
    nodes: NodeTable,
    *,
    rng: np.random.Generator,
    min_available: int,
    topology_key: str | None = DEFAULT_TOPOLOGY_KEY,
    gang: str | None = None,
    domain_key: str = "",
    domain: str | None = None,
) -> GangDecision:
    """Place as many of `members` as fit, on as few leaf switches as possible; see the module docstring.

    `gang` names the gang in messages (default: ``namespace/group`` from the first member's group label).
    `domain_key`: the gang goes within one domain of this node label (`domain`: the one its bound members are in).
    """
    if not members:
        raise ValueError("a gang needs at least one member")
    if min_available < 1:
        raise ValueError(f"min_available must be at least 1, got {min_available}")
    name = gang if gang is not None else gang_name(members[0])
    total = len(members)
    if total < min_available:
        return Unschedulable(
            message=f"gang {name}: only {total} members exist, fewer than min-available {min_available}",
            reasons={},
        )
    if domain_key:
        return _place_in_one_domain(profile, members, nodes, rng=rng, min_available=min_available,
                                    domain_key=domain_key, domain=domain, name=name, topology_key=topology_key)
    scratch = ScratchUsage(nodes)
    allowed = None
    if topology_key is not None:
        allowed = _planned_nodes(profile, members, scratch, topology_key=topology_key, rng=rng, want=total)
        if allowed is None and min_available < total:
            allowed = _planned_nodes(profile, members, scratch, topology_key=topology_key, rng=rng, want=min_available)
    assignments, first_miss = _assign(profile, members, nodes, scratch, allowed, strict=False, rng=rng)
    if len(assignments) < min_available:
        detail = f": {first_miss.message}" if first_miss is not None else ""
        return Unschedulable(
            message=f"gang {name}: only {len(assignments)} of {total} members fit (min-available {min_available})"
            f"{detail}",
            reasons=dict(first_miss.reasons) if first_miss is not None else {},
        )
    leaves = sorted({label for node in assignments.values() if (label := _label(nodes, node, topology_key))})
    return GangPlacement(assignments=assignments, leaves=leaves)


def gang_name(member: PodView) -> str:
    """``namespace/group`` from the member's pod-group label or Volcano annotation, else the pod's own key."""
    for label in GROUP_LABELS:
        if member.labels.get(label):
            return f"{member.namespace}/{member.labels[label]}"
    if member.annotations.get(GROUP_ANNOTATION):
        return f"{member.namespace}/{member.annotations[GROUP_ANNOTATION]}"
    return member.key


def choose_leaves(room: IntArray, want: int, *, rng: np.random.Generator) -> list[int]:
    """Positions of the fewest leaves whose `room` sums to at least `want`, tightest first; [] when none can.

    One leaf if any holds `want` (the one with the least room left over); else the largest leaves and, last, the
    smallest leaf that still covers the rest. Equal rooms are ordered by `rng`, so workers do not all pick the
    same leaf.
    """
    if want <= 0 or room.size == 0:
        return []
    jitter = rng.random(room.size)
    fitting = np.flatnonzero(room >= want)
    if fitting.size:
        tightest = fitting[np.lexsort((jitter[fitting], room[fitting]))[0]]
        return [int(tightest)]
    largest_first = np.lexsort((jitter, -room))
    covered = np.cumsum(room[largest_first])
    if covered[-1] < want:
        return []
    count = int(np.searchsorted(covered, want)) + 1
    taken = [int(position) for position in largest_first[: count - 1]]
    missing = want - int(room[taken].sum())
    rest = largest_first[count - 1 :]
    covering = rest[room[rest] >= missing]
    last = covering[np.lexsort((jitter[covering], room[covering]))[0]]
    return [*taken, int(last)]


def member_room(profile: Profile, members: Sequence[PodView], nodes: NodeTable) -> IntArray:
    """Per node, how many copies of the gang's largest member request fit, where every kind of member passes."""
    passes = np.ones(len(nodes), dtype=np.bool_)
    seen: set[str] = set()
    largest: dict[str, int] = {}
    for member in members:
        for resource, amount in member.request.items():
            largest[resource] = max(largest.get(resource, 0), amount)
        shape = _shape(member)
        if shape not in seen:
            seen.add(shape)
            feasible, _ = run_filters(profile.filters, member, nodes)
            passes &= feasible
    room = np.full(len(nodes), np.iinfo(np.int64).max, dtype=np.int64)
    dra = frozenset().union(*(member.dra_resources for member in members))
    for resource, amount in largest.items():
        if amount > 0:
            fits = np.maximum(nodes.free_column(resource), 0) // amount
            # a node without an extended resource a DeviceClass serves leaves it to DRA: its devices are
            # DynamicResources' filter's to count
            room = np.minimum(room, np.where(nodes.alloc_column(resource) > 0, fits, room) if resource in dra
                              else fits)
    if not any(amount > 0 for amount in largest.values()):
        room[:] = len(members)  # a gang that requests nothing fits anywhere
    return np.where(passes, room, 0)


class ScratchUsage(NodeTable):
    """A node table that shares every column of `base` except usage, which it copies.

    Placing on it (`add_used`) changes only the copy, so a gang decision never touches the real table. The node
    set itself is read-only here: adding, replacing or removing nodes raises `TypeError`.
    """

    def __init__(self, base: NodeTable) -> None:  # intentionally no super().__init__(): the columns are shared
        # Sharing the base's arrays and lists is safe: nothing here writes them (see the overrides below).
        self.__dict__.update(base.__dict__)
        self._scratch_used = np.array(base.used, dtype=np.int64)
        self._scratch_ports: list[tuple[str, HostPort]] = []

    def take_devices(self, member: PodView, name: str) -> None:
        """Count the DRA devices `member`'s claims are allocated on node `name` as taken in this copy, so a later
        member's claims are allocated others (the worker's PreBind allocates in the same order)."""
        if member.devices is None or not (member.devices.to_allocate or member.devices.extended) \
                or name not in self.index:
            return
        allocation = allocation_at(member.devices, self, self.index[name], taken=self.devices_taken)
        if allocation is not None:
            self.devices_taken = self.devices_taken | devices_of(allocation)

    def claim_ports(self, name: str, ports: Sequence[HostPort]) -> None:
        """Count `ports` as held on node `name` in this copy (the base's pod index is not touched)."""
        self._scratch_ports.extend((name, port) for port in ports)

    def port_taken(self, port: HostPort) -> NDArray[np.bool_]:
        taken = super().port_taken(port)
        for name, held in self._scratch_ports:
            row = self.index.get(name)
            if row is not None and held.conflicts(port):
                taken[row] = True
        return taken

    @property
    def used(self) -> NDArray[np.int64]:
        view = self._scratch_used.view()
        view.flags.writeable = False
        return view

    def used_of(self, name: str) -> dict[str, int]:
        row = self._scratch_used[self.row(name)]
        return {resource: int(row[column]) for column, resource in enumerate(self.resources) if row[column]}

    def add_used(self, name: str, amount: Mapping[str, int]) -> None:
        row = self.row(name)
        for resource, units in amount.items():
            column = self.column_of(resource)
            if column is not None:
                self._scratch_used[row, column] += units
            elif units:
                # No node has the resource, so no pod needing it was placed: a caller bug, not a new column.
                raise ValueError(f"no node reports resource {resource!r}; cannot place {units} of it on {name}")

    def sub_used(self, name: str, amount: Mapping[str, int]) -> None:
        self.add_used(name, {resource: -units for resource, units in amount.items()})

    def set_used(self, name: str, used: Mapping[str, int]) -> None:
        row = self.row(name)
        self._scratch_used[row] = 0
        self.add_used(name, used)

    def upsert(self, node: NodeView) -> None:
        raise TypeError("a scratch node table cannot add or replace nodes")

    def remove_node(self, name: str) -> bool:
        raise TypeError("a scratch node table cannot remove nodes")


def _assign(profile: Profile, members: Sequence[PodView], nodes: NodeTable, scratch: ScratchUsage,
            allowed: BoolArray | None, *, strict: bool, rng: np.random.Generator,
            ) -> tuple[dict[str, str], Unschedulable | None]:
    """Members placed one by one on `scratch` (see the module docstring, step 3): within `allowed` first, anywhere
    else too unless `strict`. The member uid -> node, and the first member that did not fit."""
    assignments: dict[str, str] = {}
    first_miss: Unschedulable | None = None
    # Members with inter-pod terms or spread constraints (or that other pods' terms may read) are planned on the
    # pod index too: each placed member joins it for the next one's decision, and leaves it afterwards.
    indexed = any(member.reads_pod_index for member in members) or bool(nodes.anti_holders)
    displaced: dict[str, PlacedPod | None] = {}
    try:
        for member in members:
            evaluation = evaluate(profile, member, scratch)
            decision = choose(evaluation.restricted(allowed), scratch, rng=rng, top=1) \
                if allowed is not None else None
            if not isinstance(decision, Placement) and not strict:
                decision = choose(evaluation, scratch, rng=rng, top=1)
            if isinstance(decision, Placement):
                node = decision.candidates[0]
                scratch.add_used(node, scratch.request_on(node, member))
                scratch.claim_ports(node, member.host_ports)  # two members never share a host port on a node
                scratch.take_devices(member, node)  # nor a DRA device
                assignments[member.uid] = node
                if indexed:
                    displaced.setdefault(member.uid, nodes.pods.get(member.uid))
                    nodes.place_pod(placed_view(member, node))
            elif first_miss is None and decision is not None:
                first_miss = decision
    finally:
        for uid, previous in displaced.items():
            nodes.remove_pod(uid)
            if previous is not None:
                nodes.place_pod(previous)
    return assignments, first_miss


def _place_in_one_domain(profile: Profile, members: Sequence[PodView], nodes: NodeTable, *,
                         rng: np.random.Generator, min_available: int, domain_key: str, domain: str | None,
                         name: str, topology_key: str | None) -> GangDecision:
    """The gang within one domain of `domain_key` (see the module docstring), or Unschedulable."""
    codes = nodes.label_codes(domain_key)
    values = list(nodes.label_values(domain_key))
    total = len(members)
    if domain is not None:
        order = [values.index(domain)] if domain in values else []
    else:
        labelled = codes >= 0
        room = member_room(profile, members, nodes)
        per_domain = np.bincount(codes[labelled], weights=room[labelled], minlength=len(values)).astype(np.int64)
        whole = sorted((int(per_domain[c]), c) for c in range(len(values)) if per_domain[c] >= total)
        enough = sorted((-int(per_domain[c]), c) for c in range(len(values))
                         if min_available <= per_domain[c] < total)
        order = [c for _room, c in whole] + [c for _room, c in enough]
        # the room is a lower bound (the largest member's request): a domain below it may still hold the gang
        order += [c for c in range(len(values)) if c not in order and per_domain[c] > 0]
    best: tuple[dict[str, str], Unschedulable | None] = ({}, None)
    for code in order:
        allowed: BoolArray = codes == code
        assignments, first_miss = _assign(profile, members, nodes, ScratchUsage(nodes), allowed, strict=True,
                                          rng=rng)
        if len(assignments) >= min_available:
            leaves = sorted({label for node in assignments.values() if (label := _label(nodes, node, topology_key))})
            return GangPlacement(assignments=assignments, leaves=leaves)
        if len(assignments) >= len(best[0]):
            best = (assignments, first_miss)
    where = f"its members' {domain_key} domain {domain!r}" if domain is not None else f"any one {domain_key} domain"
    detail = f": {best[1].message}" if best[1] is not None else ""
    return Unschedulable(
        message=f"gang {name}: min-available {min_available} of {total} members do not fit within {where} "
                f"(spec.schedulingConstraints.topology){detail}",
        reasons=dict(best[1].reasons) if best[1] is not None else {},
    )


def _planned_nodes(
    profile: Profile,
    members: Sequence[PodView],
    nodes: NodeTable,
    *,
    topology_key: str,
    rng: np.random.Generator,
    want: int,
) -> BoolArray | None:
    """The nodes of the leaves chosen for `want` members, or None when no set of leaves can hold them."""
    codes = nodes.label_codes(topology_key)
    labelled = codes >= 0
    if not labelled.any():
        return None
    room = member_room(profile, members, nodes)
    leaf_room = np.bincount(codes[labelled], weights=room[labelled], minlength=len(nodes.label_values(topology_key)))
    chosen = choose_leaves(leaf_room.astype(np.int64), want, rng=rng)
    if not chosen:
        return None
    allowed: BoolArray = np.isin(codes, chosen)
    return allowed


def _shape(member: PodView) -> str:
    """What the filters read of a member; members with the same shape pass the same nodes."""
    return repr(
        (
            sorted(member.request.items()),
            member.namespace,
            member.pool,
            sorted(member.node_selector.items()),
            member.required_affinity,
            member.tolerations,
        )
    )


def _label(nodes: NodeTable, node: str, key: str | None) -> str | None:
    return nodes.labels[nodes.row(node)].get(key) if key is not None else None
