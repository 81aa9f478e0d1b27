"""The pod index: every pod that holds a ledger entry on a node (assumed or bound), as the workers keep it. Pure.

`parse_placed` reads a pod's entry from the ledger's meta (`hoss.model.compact.pod_meta`). `PodIndex` keeps the
pods by uid and by node, with the lookups the plugins need without a pass over every pod: the pods with a label
value, the holders of required anti-affinity and of scoring terms, who holds a host port where, and the lowest
priority present. The node table (`hoss.framework.nodes.NodeTable`) carries the index, fed by
`hoss.framework.feed`.

Invariant: a pod uid is indexed on at most one node; every lookup table names exactly the indexed pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from hoss.errors import HossError
from hoss.framework.podterms import LabelSelector, PodAffinityTerm, WeightedPodTerm, parse_terms, parse_weighted_terms
from hoss.model.resources import ResourceVector

ANY_HOST_IP = "0.0.0.0"
"""kube-scheduler's DefaultBindAllHostIP: an empty hostIP means every address of the node."""


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
class Disk:
    """An in-tree disk a pod mounts (`hoss.model.compact.disk_volumes`), as VolumeRestrictions compares them."""

    kind: str
    """The volume source: gcePersistentDisk, awsElasticBlockStore, rbd or iscsi."""
    id: str
    """pdName, volumeID, ``<pool>/<image>`` or iqn."""
    read_only: bool
    monitors: frozenset[str] = frozenset()
    """rbd's Ceph monitors (two rbd disks are one only when they share a monitor)."""

    def conflicts(self, other: Disk) -> bool:
        """kube-scheduler's isVolumeConflict: the same disk, mounted read-write by either (an EBS volume in any
        mode; an rbd image only when the monitors overlap)."""
        if self.kind != other.kind or self.id != other.id:
            return False
        if self.kind == "awsElasticBlockStore":
            return True
        if self.kind == "rbd" and not self.monitors & other.monitors:
            return False
        return not (self.read_only and other.read_only)


def parse_disks(raw: object) -> tuple[Disk, ...]:
    """`Disk`s from their JSON form (`hoss.model.compact.disk_volumes`); lenient: malformed entries are skipped."""
    disks = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict) and isinstance(item.get("kind"), str) and isinstance(item.get("id"), str):
            monitors = item.get("monitors")
            disks.append(Disk(kind=item["kind"], id=item["id"], read_only=item.get("ro") is True,
                              monitors=frozenset(str(m) for m in monitors) if isinstance(monitors, list)
                              else frozenset()))
    return tuple(disks)


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
    claims: tuple[str, ...] = ()
    """The names of the volume claims it uses, in its namespace (VolumeRestrictions' ReadWriteOncePod check,
    NodeVolumeLimits' count of the volumes on its node)."""
    disks: tuple[Disk, ...] = ()
    """The in-tree disks it mounts (VolumeRestrictions: one such disk is not used twice on a node)."""
    gang: str = ""
    """The gang it belongs to (`hoss.model.gangs.GangKey.ident`, '' for none): preemption evicts a gang whole."""

    @property
    def scores_others(self) -> bool:
        """Whether its terms weigh in InterPodAffinity's score of pods placed after it."""
        return bool(self.affinity or self.preferred or self.preferred_anti)


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
        claims=tuple(str(c) for c in claims) if isinstance(claims := value.get("claims"), list) else (),
        disks=parse_disks(value.get("disks")),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        request={str(k): v for k, v in request.items() if isinstance(v, int) and not isinstance(v, bool)}
        if isinstance(request, dict) else {},
        created=str(value.get("created") or ""),
        terminating=value.get("terminating") is True,
        gang=str(value.get("gang") or ""),
    )


class PodIndex:
    """The indexed pods and their lookup tables; see the module docstring."""

    def __init__(self) -> None:
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

    def nodes_holding(self, port: HostPort) -> list[str]:
        """The nodes where an indexed pod holds a host port that conflicts with `port` (kube-scheduler's rule)."""
        return [node for (node, ip), count in self._port_holders.get((port.protocol, port.port), {}).items()
                if count > 0 and (ip == port.ip or ANY_HOST_IP in (ip, port.ip))]
