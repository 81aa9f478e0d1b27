"""The worker's node table: every node as rows of numpy arrays, so plugins filter and score all nodes at once.

One row per node. Row order is arbitrary and changes when a node is removed (the last row moves into the hole),
so a row number is only meaningful until the next mutation; plugins get the table, compute over whole columns,
and hand back arrays indexed by row.

Columns:
- resources: `alloc` and `used` are int64 matrices (rows x `resources`), base units as in
  `hoss.model.resources` (milli-CPU, bytes, counts). The resource axis only grows; a resource a node does not
  report is 0 there, so a GPU pod never fits a CPU node. `used` is what the ledger holds on the node (bound +
  assumed), fed by the worker; it is kept across node updates and reset when a node is removed.
- labels: per label key an int32 code per row (-1 = label absent) and the key's value list, so a selector is a
  table lookup over codes instead of a Python loop over nodes.
- taints: each distinct taint (key, value, effect) is a column of `taint_positions`; a cell holds the taint's
  position in the node's own ``spec.taints`` (-1 = absent), so "the first untolerated taint" is an argmin.
- `unschedulable` (spec.unschedulable) and `ready` (the Ready condition) as bool arrays.

Invariants: `names[i]` and `index` are inverse; storage rows at and beyond `len(table)` are blank (zero usage,
no labels, no taints), so appending a row needs no clearing. Arrays handed out are read-only views; the table
changes only through its methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from hoss.errors import HossError, NodeSpecError
from hoss.framework import payload
from hoss.framework.errors import UnknownNodeError
from hoss.framework.podterms import LabelSelector, PodAffinityTerm, WeightedPodTerm, parse_terms, parse_weighted_terms
from hoss.model.resources import ResourceVector, node_allocatable

TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})
ANY_HOST_IP = "0.0.0.0"
"""kube-scheduler's DefaultBindAllHostIP: an empty hostIP means every address of the node."""

_MIN_CAPACITY = 64
_ABSENT = -1


@dataclass(frozen=True)
class Taint:
    """A node taint; its identity is (key, value, effect), as kube-scheduler compares them."""

    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        # kube-scheduler's spelling in "node(s) had untolerated taint {key: value}".
        return f"{{{self.key}: {self.value}}}"


@dataclass(frozen=True, order=True)
class HostPort:
    """A host port a container asks for, sanitised as kube-scheduler does (protocol TCP, hostIP 0.0.0.0 when empty)."""

    protocol: str
    ip: str
    port: int

    def conflicts(self, other: HostPort) -> bool:
        """kube-scheduler's ``HostPortInfo.CheckConflict``: same protocol and port, same IP or either is 0.0.0.0."""
        if self.protocol != other.protocol or self.port != other.port:
            return False
        return self.ip == other.ip or ANY_HOST_IP in (self.ip, other.ip)

    def __str__(self) -> str:
        return f"{self.protocol}/{self.ip}/{self.port}"


    @classmethod
    def parse(cls, text: str) -> HostPort | None:
        """'TCP/0.0.0.0/80' (as `hoss.model.compact.host_ports` writes it) -> HostPort; None when malformed."""
        protocol, _, rest = text.partition("/")
        ip, _, port = rest.rpartition("/")
        return cls(protocol, ip, int(port)) if protocol and ip and port.isdigit() else None


@dataclass(frozen=True)
class PlacedPod:
    """A pod that holds a ledger entry on a node (assumed or bound), as the workers' pod index keeps it."""

    uid: str
    node: str
    namespace: str
    labels: dict[str, str]
    ports: tuple[HostPort, ...]
    anti: tuple[PodAffinityTerm, ...] = ()
    """Its required pod anti-affinity terms, which keep matching pods out of its topology domains."""
    name: str = ""
    """metadata.name ('' when its meta predates it): preemption evicts the pod by name."""
    priority: int = 0
    """spec.priority: only pods of lower priority than a preempting pod may be its victims."""
    request: ResourceVector = field(default_factory=dict)
    """Its effective request ({} when its meta predates it): the room its eviction frees."""
    created: str = ""
    """metadata.creationTimestamp (RFC 3339, compares as text); preemption's stand-in for the start time."""
    affinity: tuple[PodAffinityTerm, ...] = ()
    """Its required pod affinity terms (InterPodAffinity's score counts them, as hardPodAffinityWeight 1)."""
    preferred: tuple[WeightedPodTerm, ...] = ()
    """Its preferred pod affinity terms (scored for incoming pods they match)."""
    preferred_anti: tuple[WeightedPodTerm, ...] = ()
    """Its preferred pod anti-affinity terms (scored, negatively, for incoming pods they match)."""
    terminating: bool = False
    """metadata.deletionTimestamp is set: PodTopologySpread does not count it (kube-scheduler's
    countPodsMatchSelector); it still counts for InterPodAffinity, NodePorts and resources, as there."""

    @property
    def scores_others(self) -> bool:
        """Whether its terms weigh in InterPodAffinity's score of pods placed after it."""
        return bool(self.affinity or self.preferred or self.preferred_anti)


def stream_position(text: str) -> tuple[int, int]:
    """A Redis stream id ('1700000000000-3') as a comparable pair."""
    millis, _, sequence = text.partition("-")
    return int(millis), int(sequence or 0)


def parse_placed(uid: str, node: str, meta: str) -> PlacedPod:
    """A pod index entry from the ledger's meta (`hoss.model.compact.pod_meta`); lenient: a pod without meta (written
    by an older resolver) or with an unreadable one has no labels and no ports."""
    try:
        value = orjson.loads(meta) if meta else {}
    except orjson.JSONDecodeError:
        value = {}
    if not isinstance(value, dict):
        value = {}
    labels = value.get("labels")
    ports = value.get("ports")
    parsed = (HostPort.parse(p) for p in ports if isinstance(p, str)) if isinstance(ports, list) else ()
    namespace = str(value.get("namespace") or "default")
    anti: tuple[PodAffinityTerm, ...] = ()
    affinity: tuple[PodAffinityTerm, ...] = ()
    preferred: tuple[WeightedPodTerm, ...] = ()
    preferred_anti: tuple[WeightedPodTerm, ...] = ()
    # Most pods carry no inter-pod terms: their meta has none of these keys, and nothing is parsed for them.
    if "anti" in value:
        try:
            anti = parse_terms(value["anti"], field="anti", owner_namespace=namespace, lenient=True)
        except HossError:
            anti = ()  # unreadable terms of a pod already placed: nothing to hold against others
    if "aff" in value or "paff" in value or "panti" in value:
        try:
            affinity = parse_terms(value.get("aff"), field="aff", owner_namespace=namespace, lenient=True)
            preferred = parse_weighted_terms(value.get("paff"), field="paff", owner_namespace=namespace,
                                             lenient=True)
            preferred_anti = parse_weighted_terms(value.get("panti"), field="panti", owner_namespace=namespace,
                                                  lenient=True)
        except HossError:
            affinity, preferred, preferred_anti = (), (), ()  # unreadable: they weigh in no score
    priority = value.get("priority")
    request = value.get("request")
    return PlacedPod(
        uid=uid,
        node=node,
        namespace=namespace,
        anti=anti,
        affinity=affinity,
        preferred=preferred,
        preferred_anti=preferred_anti,
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        ports=tuple(p for p in parsed if p is not None),
        name=str(value.get("name") or ""),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        request={str(k): v for k, v in request.items() if isinstance(v, int) and not isinstance(v, bool)}
        if isinstance(request, dict) else {},
        created=str(value.get("created") or ""),
        terminating=value.get("terminating") is True,
    )


@dataclass(frozen=True)
class NodeView:
    """What the scheduler needs of one node, parsed once from the raw node."""

    name: str
    allocatable: ResourceVector
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    ready: bool


def parse_node(node: Mapping[str, Any]) -> NodeView:
    """The typed view of a raw node; raises `NodeSpecError` naming the bad field."""
    error = NodeSpecError
    metadata = payload.mapping(node.get("metadata"), field="metadata", error=error, required=True)
    spec = payload.mapping(node.get("spec"), field="spec", error=error)
    status = payload.mapping(node.get("status"), field="status", error=error)
    taints = []
    for position, raw in enumerate(payload.items(spec.get("taints"), field="spec.taints", error=error)):
        field = f"spec.taints[{position}]"
        taint = payload.mapping(raw, field=field, error=error, required=True)
        effect = payload.string(taint.get("effect"), field=f"{field}.effect", error=error, required=True)
        if effect not in TAINT_EFFECTS:
            raise NodeSpecError(field=f"{field}.effect", reason=f"unknown effect {effect!r}")
        taints.append(
            Taint(
                key=payload.string(taint.get("key"), field=f"{field}.key", error=error, required=True),
                value=payload.string(taint.get("value"), field=f"{field}.value", error=error),
                effect=effect,
            )
        )
    ready = False
    for position, raw in enumerate(payload.items(status.get("conditions"), field="status.conditions", error=error)):
        condition = payload.mapping(raw, field=f"status.conditions[{position}]", error=error, required=True)
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    return NodeView(
        name=payload.string(metadata.get("name"), field="metadata.name", error=error, required=True),
        allocatable=node_allocatable(node),
        labels=payload.string_map(metadata.get("labels"), field="metadata.labels", error=error),
        taints=tuple(taints),
        unschedulable=payload.boolean(spec.get("unschedulable"), field="spec.unschedulable", error=error),
        ready=ready,
    )


class NodeTable:
    """All nodes as numpy rows; see the module docstring for the columns and invariants."""

    def __init__(self) -> None:
        self.names: list[str] = []
        """Node name per row."""
        self.index: dict[str, int] = {}
        """Node name -> row."""
        self.resources: list[str] = []
        """Resource name per column of `alloc` and `used`; only grows."""
        self.labels: list[dict[str, str]] = []
        """Labels per row."""
        self.taints: list[tuple[Taint, ...]] = []
        """Taints per row, in the node's order."""
        self.taint_kinds: list[Taint] = []
        """Taint per column of `taint_positions`; only grows."""
        self._resource_index: dict[str, int] = {}
        self._taint_index: dict[Taint, int] = {}
        self._capacity = _MIN_CAPACITY
        self._alloc = np.zeros((self._capacity, 0), dtype=np.int64)
        self._used = np.zeros((self._capacity, 0), dtype=np.int64)
        self._unschedulable = np.zeros(self._capacity, dtype=np.bool_)
        self._ready = np.zeros(self._capacity, dtype=np.bool_)
        self._taint_positions = np.full((self._capacity, 0), _ABSENT, dtype=np.int32)
        self._label_codes: dict[str, NDArray[np.int32]] = {}
        self._label_values: dict[str, list[str]] = {}
        self._label_value_codes: dict[str, dict[str, int]] = {}
        self._local: dict[str, dict[str, int]] = {}
        """Per node, what this worker counts there that the ledger totals it last applied do not hold yet
        (`hold_locally`, `expect`); `set_totals` keeps it on top of the ledger's totals."""
        self._expected: list[tuple[tuple[int, int], str, ResourceVector]] = []
        """(change-stream id, node, request) of reservations counted locally until the feed applies that entry."""
        self.pods: dict[str, PlacedPod] = {}
        """The pod index: every pod holding a ledger entry, by uid (fed by `hoss.framework.feed`)."""
        self.pods_on: dict[str, set[str]] = {}
        """Node name -> uids of the pods on it (nodes not in the table included: the index follows the ledger)."""
        self._port_holders: dict[tuple[str, int], dict[tuple[str, str], int]] = {}
        """(protocol, port) -> (node, ip) -> how many pods hold it."""
        self._by_label: dict[str, dict[str, set[str]]] = {}
        """label key -> value -> uids of the indexed pods with that label (narrows selector matching)."""
        self.anti_holders: dict[str, PlacedPod] = {}
        """The indexed pods that have required anti-affinity terms, by uid."""
        self._priorities: dict[int, int] = {}
        """spec.priority -> how many indexed pods have it (`lowest_priority`)."""
        self.score_holders: dict[str, PlacedPod] = {}
        """The indexed pods whose terms weigh in InterPodAffinity's score of others (`PlacedPod.scores_others`)."""

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.index

    # Read-only views over the live rows.

    @property
    def alloc(self) -> NDArray[np.int64]:
        """Allocatable per row and resource column."""
        return self._live(self._alloc)

    @property
    def used(self) -> NDArray[np.int64]:
        """Ledger usage (bound + assumed) per row and resource column."""
        return self._live(self._used)

    @property
    def unschedulable(self) -> NDArray[np.bool_]:
        """spec.unschedulable per row (cordoned nodes)."""
        return self._live(self._unschedulable)

    @property
    def ready(self) -> NDArray[np.bool_]:
        """The Ready condition per row (informational: kube-scheduler filters not-ready nodes by their taint)."""
        return self._live(self._ready)

    @property
    def taint_positions(self) -> NDArray[np.int32]:
        """Per row and `taint_kinds` column: the taint's position in the node's taint list, -1 when absent."""
        return self._live(self._taint_positions)

    def free(self) -> NDArray[np.int64]:
        """alloc - used per row and resource column; negative where a node is overcommitted."""
        return self.alloc - self.used

    def column_of(self, resource: str) -> int | None:
        """The resource's column, or None when no node reports or uses it."""
        return self._resource_index.get(resource)

    def alloc_column(self, resource: str) -> NDArray[np.int64]:
        """Allocatable of one resource per row (0 where the node does not report it)."""
        column = self._resource_index.get(resource)
        return np.zeros(len(self), dtype=np.int64) if column is None else self.alloc[:, column]

    def used_column(self, resource: str) -> NDArray[np.int64]:
        """Usage of one resource per row."""
        column = self._resource_index.get(resource)
        return np.zeros(len(self), dtype=np.int64) if column is None else self.used[:, column]

    def free_column(self, resource: str) -> NDArray[np.int64]:
        """Free amount of one resource per row; negative where the node is overcommitted."""
        return self.alloc_column(resource) - self.used_column(resource)

    def used_of(self, name: str) -> ResourceVector:
        """One node's usage as a resource vector (resources at 0 left out); raises `UnknownNodeError`."""
        row = self._used[self.row(name)]
        return {resource: int(row[column]) for resource, column in self._resource_index.items() if row[column]}

    def label_codes(self, key: str) -> NDArray[np.int32]:
        """Per row the code of the node's value for label `key` (an index into `label_values(key)`), -1 if absent."""
        codes = self._label_codes.get(key)
        return np.full(len(self), _ABSENT, dtype=np.int32) if codes is None else self._live(codes)

    def label_code(self, key: str, value: str) -> int | None:
        """The code of `value` for label `key`, or None when no node has had that value."""
        return self._label_value_codes.get(key, {}).get(value)

    def label_values(self, key: str) -> Sequence[str]:
        """The values label `key` has or had on some node, indexed by code; may hold values no node has now."""
        return self._label_values.get(key, [])

    def row(self, name: str) -> int:
        """The node's current row; raises `UnknownNodeError`."""
        try:
            return self.index[name]
        except KeyError:
            raise UnknownNodeError(name) from None

    # Mutations.

    def upsert_node(self, node: Mapping[str, Any]) -> NodeView:
        """Add or replace a node from its raw JSON (usage is kept on replace); raises `NodeSpecError`."""
        view = parse_node(node)
        self.upsert(view)
        return view

    def upsert(self, node: NodeView) -> None:
        """Add or replace a parsed node; its usage is kept on replace and starts at 0 for a new node."""
        row = self.index.get(node.name)
        if row is None:
            row = len(self.names)
            self._reserve_rows(row + 1)
            self.names.append(node.name)
            self.labels.append({})
            self.taints.append(())
            self.index[node.name] = row
        else:
            self._clear_labels(row)
            self._taint_positions[row] = _ABSENT
        self._alloc[row] = 0
        for resource, amount in node.allocatable.items():
            column = self._resource_column(resource)  # may replace the arrays: look it up before indexing them
            self._alloc[row, column] = amount
        self.labels[row] = dict(node.labels)
        for key, value in node.labels.items():
            codes = self._label_column(key)
            codes[row] = self._label_code(key, value)
        self.taints[row] = node.taints
        for position, taint in reversed(list(enumerate(node.taints))):
            # Reversed, so a taint listed twice keeps its first position.
            column = self._taint_column(taint)
            self._taint_positions[row, column] = position
        self._unschedulable[row] = node.unschedulable
        self._ready[row] = node.ready

    def remove_node(self, name: str) -> bool:
        """Drop a node; the last row moves into its place. False when the node was not in the table."""
        for uid in list(self.pods_on.get(name, ())):
            self.remove_pod(uid)  # the ledger dropped the node's entries with it
        row = self.index.pop(name, None)
        if row is None:
            return False
        self._local.pop(name, None)
        last = len(self.names) - 1
        self._clear_labels(row)
        if row != last:
            moved = self.names[last]
            self.names[row] = moved
            self.index[moved] = row
            self.labels[row] = self.labels[last]
            self.taints[row] = self.taints[last]
            for key in self.labels[last]:
                codes = self._label_codes[key]
                codes[row] = codes[last]
                codes[last] = _ABSENT
            for array in (self._alloc, self._used, self._unschedulable, self._ready, self._taint_positions):
                array[row] = array[last]
        self._alloc[last] = 0
        self._used[last] = 0
        self._unschedulable[last] = False
        self._ready[last] = False
        self._taint_positions[last] = _ABSENT
        self.names.pop()
        self.labels.pop()
        self.taints.pop()
        return True

    def set_totals(self, name: str, totals: Mapping[str, int]) -> None:
        """The ledger's bound + assumed totals for the node (a change-stream entry, a load or a read): the node's
        usage becomes them plus what this worker counts there that they do not hold yet (`hold_locally`,
        `expect`). Entries carry totals, so the last one applied is the ledger's truth at that moment."""
        self.set_used(name, totals)
        local = self._local.get(name)
        if local:
            self.add_used(name, local)

    def hold_locally(self, name: str, amount: Mapping[str, int]) -> None:
        """Count `amount` on the node until `drop_locally` takes it off, whatever totals arrive in between (a
        decision's tentative placement while its reservation call is under way)."""
        local = self._local.setdefault(name, {})
        for resource, units in amount.items():
            local[resource] = local.get(resource, 0) + units
        self.add_used(name, amount)

    def drop_locally(self, name: str, amount: Mapping[str, int]) -> None:
        """Take off what `hold_locally` (or a settled `expect`) counted; nothing when the node left the table
        since (its local count went with it)."""
        local = self._local.get(name)
        if local is None:
            return
        for resource, units in amount.items():
            left = local.get(resource, 0) - units
            if left:
                local[resource] = left
            else:
                local.pop(resource, None)
        if not local:
            del self._local[name]
        self.add_used(name, {resource: -units for resource, units in amount.items()})

    def expect(self, name: str, amount: Mapping[str, int], change: str, applied: str) -> None:
        """The ledger reserved `amount` on the node in the call that wrote change-stream entry `change`; `applied`
        is the last entry the feed applied. Entry applied already: its totals count the reservation, nothing to
        do. Else count it locally until `settle` sees that entry applied (a call's reply and the feed's read of
        its entry arrive on different connections, in either order). Without an entry id (none written), count
        it until the next totals for the node replace it."""
        if not change:
            self.add_used(name, amount)
            return
        position = stream_position(change)
        if position <= stream_position(applied):
            return
        self.hold_locally(name, amount)
        self._expected.append((position, name, dict(amount)))

    def settle(self, applied: str) -> None:
        """The feed applied every entry up to `applied`: reservations expected in those entries are in the
        totals now, so stop counting them locally."""
        if not self._expected:
            return
        position = stream_position(applied)
        keep = []
        for expected in self._expected:
            if expected[0] <= position:
                self.drop_locally(expected[1], expected[2])
            else:
                keep.append(expected)
        self._expected = keep

    def set_used(self, name: str, used: Mapping[str, int]) -> None:
        """Replace the node's usage as it stands in this table (a what-if put back); resources not named are 0.
        The ledger's totals go through `set_totals`."""
        row = self.row(name)
        self._used[row] = 0
        for resource, amount in used.items():
            column = self._resource_column(resource)
            self._used[row, column] = amount

    def add_used(self, name: str, amount: Mapping[str, int]) -> None:
        """Add a pod's request to the node's usage (the worker reserved it)."""
        row = self.row(name)
        for resource, units in amount.items():
            column = self._resource_column(resource)
            self._used[row, column] += units

    def sub_used(self, name: str, amount: Mapping[str, int]) -> None:
        """Take a pod's request off the node's usage (the reservation was released)."""
        self.add_used(name, {resource: -units for resource, units in amount.items()})

    # The pod index.

    def place_pod(self, pod: PlacedPod) -> None:
        """Record that `pod` holds an entry on its node (replacing where it was before)."""
        self.remove_pod(pod.uid)
        self.pods[pod.uid] = pod
        self.pods_on.setdefault(pod.node, set()).add(pod.uid)
        self._priorities[pod.priority] = self._priorities.get(pod.priority, 0) + 1
        for key, value in pod.labels.items():
            self._by_label.setdefault(key, {}).setdefault(value, set()).add(pod.uid)
        if pod.anti:
            self.anti_holders[pod.uid] = pod
        if pod.scores_others:
            self.score_holders[pod.uid] = pod
        for port in pod.ports:
            holders = self._port_holders.setdefault((port.protocol, port.port), {})
            holders[(pod.node, port.ip)] = holders.get((pod.node, port.ip), 0) + 1

    def remove_pod(self, uid: str) -> PlacedPod | None:
        """Forget a pod's entry; returns it, or None when the index did not hold it."""
        pod = self.pods.pop(uid, None)
        if pod is None:
            return None
        self.anti_holders.pop(uid, None)
        self.score_holders.pop(uid, None)
        if self._priorities.get(pod.priority, 0) > 1:
            self._priorities[pod.priority] -= 1
        else:
            self._priorities.pop(pod.priority, None)
        for key, value in pod.labels.items():
            values = self._by_label.get(key, {})
            labelled = values.get(value)
            if labelled is not None:
                labelled.discard(uid)
                if not labelled:
                    del values[value]
                    if not values:
                        self._by_label.pop(key, None)
        on_node = self.pods_on.get(pod.node)
        if on_node is not None:
            on_node.discard(uid)
            if not on_node:
                del self.pods_on[pod.node]
        for port in pod.ports:
            holders = self._port_holders.get((port.protocol, port.port), {})
            left = holders.get((pod.node, port.ip), 0) - 1
            if left > 0:
                holders[(pod.node, port.ip)] = left
            else:
                holders.pop((pod.node, port.ip), None)
                if not holders:
                    self._port_holders.pop((port.protocol, port.port), None)
        return pod

    def clear_pods(self) -> None:
        """Empty the pod index (before loading it again)."""
        self.pods.clear()
        self.pods_on.clear()
        self._port_holders.clear()
        self._by_label.clear()
        self.anti_holders.clear()
        self.score_holders.clear()
        self._priorities.clear()

    def lowest_priority(self) -> int | None:
        """The lowest spec.priority of the indexed pods (None without pods): whether any pod could be a victim
        of a preemptor, in a few steps (the distinct priorities of a cluster are few)."""
        return min(self._priorities) if self._priorities else None

    def pods_matching(self, selector: LabelSelector) -> list[PlacedPod]:
        """The indexed pods whose labels satisfy `selector` (narrowed by its first In or Exists requirement)."""
        candidates: set[str] | None = None
        for requirement in selector.requirements:
            if requirement.operator == "In":
                values = self._by_label.get(requirement.key, {})
                candidates = set().union(*(values.get(v, set()) for v in requirement.values))
                break
            if requirement.operator == "Exists":
                candidates = set().union(*self._by_label.get(requirement.key, {}).values())
                break
        if candidates is not None and len(selector.requirements) == 1:
            return [self.pods[uid] for uid in candidates]  # the lookup was the whole selector
        pods = self.pods.values() if candidates is None else (self.pods[uid] for uid in candidates)
        return [pod for pod in pods if selector.matches(pod.labels)]

    def port_taken(self, port: HostPort) -> NDArray[np.bool_]:
        """Rows of the nodes where a pod holds a host port that conflicts with `port` (kube-scheduler's rule)."""
        taken = np.zeros(len(self), dtype=np.bool_)
        for (node, ip), count in self._port_holders.get((port.protocol, port.port), {}).items():
            row = self.index.get(node)
            if count > 0 and row is not None and (ip == port.ip or ANY_HOST_IP in (ip, port.ip)):
                taken[row] = True
        return taken

    # Storage.

    def _live(self, array: NDArray[Any]) -> NDArray[Any]:
        view = array[: len(self.names)]
        view.flags.writeable = False
        return view

    def _reserve_rows(self, rows: int) -> None:
        if rows <= self._capacity:
            return
        capacity = max(rows, 2 * self._capacity)
        self._alloc = _grown_rows(self._alloc, capacity, 0)
        self._used = _grown_rows(self._used, capacity, 0)
        self._unschedulable = _grown_rows(self._unschedulable, capacity, False)
        self._ready = _grown_rows(self._ready, capacity, False)
        self._taint_positions = _grown_rows(self._taint_positions, capacity, _ABSENT)
        for key, codes in self._label_codes.items():
            self._label_codes[key] = _grown_rows(codes, capacity, _ABSENT)
        self._capacity = capacity

    def _resource_column(self, resource: str) -> int:
        column = self._resource_index.get(resource)
        if column is None:
            column = len(self.resources)
            self.resources.append(resource)
            self._resource_index[resource] = column
            self._alloc = _with_column(self._alloc, 0)
            self._used = _with_column(self._used, 0)
        return column

    def _taint_column(self, taint: Taint) -> int:
        column = self._taint_index.get(taint)
        if column is None:
            column = len(self.taint_kinds)
            self.taint_kinds.append(taint)
            self._taint_index[taint] = column
            self._taint_positions = _with_column(self._taint_positions, _ABSENT)
        return column

    def _label_column(self, key: str) -> NDArray[np.int32]:
        codes = self._label_codes.get(key)
        if codes is None:
            codes = np.full(self._capacity, _ABSENT, dtype=np.int32)
            self._label_codes[key] = codes
            self._label_values[key] = []
            self._label_value_codes[key] = {}
        return codes

    def _label_code(self, key: str, value: str) -> int:
        value_codes = self._label_value_codes[key]
        code = value_codes.get(value)
        if code is None:
            values = self._label_values[key]
            if len(values) > 2 * len(self.names) + _MIN_CAPACITY:
                # Values of deleted nodes (e.g. unique hostnames) would pile up; recoding is O(rows), and it
                # happens only after as many new values, so it is O(1) per value over time.
                self._recode_label(key)
                values = self._label_values[key]
            code = len(values)
            values.append(value)
            value_codes[value] = code
        return code

    def _recode_label(self, key: str) -> None:
        codes = self._label_codes[key]
        values: list[str] = []
        value_codes: dict[str, int] = {}
        for row, labels in enumerate(self.labels):
            value = labels.get(key)
            if value is None or codes[row] == _ABSENT:
                # The row being upserted has its new labels set but not yet coded: leave it to the caller.
                continue
            code = value_codes.setdefault(value, len(values))
            if code == len(values):
                values.append(value)
            codes[row] = code
        self._label_values[key] = values
        self._label_value_codes[key] = value_codes

    def _clear_labels(self, row: int) -> None:
        for key in self.labels[row]:
            self._label_codes[key][row] = _ABSENT


def _grown_rows(array: NDArray[Any], rows: int, fill: object) -> NDArray[Any]:
    grown = np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)
    grown[: array.shape[0]] = array
    return grown


def _with_column(array: NDArray[Any], fill: object) -> NDArray[Any]:
    return np.concatenate([array, np.full((array.shape[0], 1), fill, dtype=array.dtype)], axis=1)
