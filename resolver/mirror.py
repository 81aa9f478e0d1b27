"""The resolver's mirror of the apiserver, as plain data: pods (`PodInfo`, `parse_pod`, `PodIndex`), nodes
(`NodeRecord`) and Available Reservations (`reservation_entry`, and `refusal_message` for one the ledger refused
room). Pure, no I/O.

The ledger sync (resolver/sync.py) keeps the mirror from its informers and writes the ledger from it; the webhook
reads the pod indexes to judge a binding without an API call.

Invariant: a `PodIndex` names a pod uid once, and its namespace/name lookup points at that uid while it is indexed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hoss.ledger.arguments import BoundPod, Placement
from hoss.ledger.keys import RESERVATION_PREFIX
from hoss.ledger.results import ReservationRefused
from hoss.model import compact, reservations
from hoss.model.objects import Json
from hoss.model.resources import (
    ResourceVector,
    format_quantity,
    node_allocatable,
    pod_requests,
    status_resources_key,
)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
NodeRecord = tuple[ResourceVector, dict[str, str], str]
"""allocatable, labels, compact description (JSON) of a node, as the ledger keeps it"""


@dataclass(frozen=True)
class PodInfo:
    """What the resolver needs of a pod: identity, node (if bound), scheduler and effective request."""

    uid: str
    namespace: str
    name: str
    node: str | None
    scheduler_name: str
    request: ResourceVector
    terminal: bool
    generation: int | None = None
    ports: str = ""
    """Host ports the pod holds on its node, as the ledger checks them (`hoss.model.compact.pod_meta`)."""
    meta: str = ""
    """namespace, name, labels, host ports, priority and request for the workers' pod index
    (`hoss.model.compact.pod_meta`)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """metadata.labels: a change (no new generation) rewrites the meta, which inter-pod affinity reads."""
    status_key: str = ""
    """`hoss.model.resources.status_resources_key`: a change (an in-place resize the kubelet allocated or actuated,
    no new generation) recomputes the request."""
    terminating: bool = False
    """metadata.deletionTimestamp is set: a change rewrites the meta (PodTopologySpread ignores such pods)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_pod(pod: Json, *, known: PodInfo | None = None) -> PodInfo:
    """The typed view of a raw pod; raises HossError subclasses naming the bad field.

    ``known``, the view of the same pod from an earlier event, lends its request when the pod's spec has not
    changed since (same uid and ``metadata.generation``, which the apiserver bumps on every spec change, an
    in-place resize included): most events of a pod are status updates, and computing a request is the costly
    part of a view.
    """
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    generation = metadata.get("generation")
    status_key = status_resources_key(pod)
    reuse = (
        known is not None
        and generation is not None
        and known.generation == generation
        and known.uid == str(metadata.get("uid", ""))
        and known.status_key == status_key
    )
    request = known.request if reuse and known is not None else pod_requests(pod)
    ports, meta = compact.pod_meta(pod, request=request)
    return PodInfo(
        uid=str(metadata.get("uid", "")),
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        node=spec.get("nodeName") or None,
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        request=request,
        terminal=status.get("phase") in TERMINAL_PHASES,
        generation=generation if isinstance(generation, int) else None,
        ports=ports,
        meta=meta,
        labels=labels if isinstance(labels := metadata.get("labels"), dict) else {},
        status_key=status_key,
        terminating=bool(metadata.get("deletionTimestamp")),
    )


@dataclass
class PodIndex:
    """Live pods by uid and by namespace/name, so the webhook finds a pod's request without an API call."""

    by_uid: dict[str, PodInfo] = field(default_factory=dict)
    uid_by_key: dict[str, str] = field(default_factory=dict)

    def clear(self) -> None:
        self.by_uid.clear()
        self.uid_by_key.clear()

    def put(self, info: PodInfo) -> None:
        self.by_uid[info.uid] = info
        self.uid_by_key[info.key] = info.uid

    def drop(self, uid: str) -> PodInfo | None:
        info = self.by_uid.pop(uid, None)
        if info is not None and self.uid_by_key.get(info.key) == uid:
            del self.uid_by_key[info.key]
        return info

    def find(self, *, uid: str | None, key: str) -> PodInfo | None:
        if uid:
            return self.by_uid.get(uid)
        found = self.uid_by_key.get(key)
        return self.by_uid.get(found) if found else None

    def bound(self) -> list[BoundPod]:
        return [
            BoundPod(uid=p.uid, pod=p.key, node=p.node, request=p.request, ports=p.ports, meta=p.meta)
            for p in self.by_uid.values()
            if p.node and not p.terminal
        ]

    def apply(self, changes: Mapping[str, PodInfo | None]) -> tuple[list[str], list[Placement]]:
        """Apply pod changes (uid -> its latest view; None: deleted or finished) to the index; returns what the
        ledger must do for them: the uids to release, and the placements of pods that got a node or whose entry
        (node, meta, request) changed."""
        releases: list[str] = []
        binds: list[Placement] = []
        for uid, info in changes.items():
            if info is None:
                self.drop(uid)
                releases.append(uid)
                continue
            previous = self.by_uid.get(uid)
            self.put(info)
            if info.node and (previous is None or previous.node != info.node or previous.meta != info.meta
                              or previous.request != info.request):
                binds.append(Placement(uid=uid, pod=info.key, node=info.node, request=info.request,
                                       ports=info.ports, meta=info.meta))
        return releases, binds


def same_entry(known: PodInfo | None, pod: Json) -> bool:
    """Whether an event of `pod` changes nothing the mirror or the ledger keeps of it, as `known` has it: the
    same generation, node, labels, resources status and deletion mark (a status update: most events)."""
    metadata = pod.get("metadata") or {}
    generation = metadata.get("generation")
    return (
        known is not None
        and generation is not None
        and known.generation == generation
        and known.node == ((pod.get("spec") or {}).get("nodeName") or None)
        and known.labels == (metadata.get("labels") or {})
        and known.status_key == status_resources_key(pod)
        and known.terminating == bool(metadata.get("deletionTimestamp"))
    )


def node_record(node: Json) -> tuple[str, NodeRecord]:
    """The node's name, and what the ledger keeps of it: allocatable, labels and the compact description
    workers build their node table from (only a change of these is written to the ledger)."""
    metadata = node.get("metadata") or {}
    spec = compact.encode(compact.compact_node(node)).decode()
    return str(metadata.get("name")), (node_allocatable(node), dict(metadata.get("labels") or {}), spec)


def reservation_entry(obj: Json, *, now_unix: float) -> PodInfo | None:
    """The entry holding a Reservation's room while it is Available and not expired (else None); raises
    HossError naming the bad field of a malformed one."""
    parsed = reservations.parse(obj)
    if not parsed.available or parsed.expires_unix <= now_unix:
        return None
    uid = str((obj.get("metadata") or {}).get("uid") or "")
    return PodInfo(uid=uid, namespace=RESERVATION_PREFIX.rstrip("/"), name=parsed.name, node=parsed.node,
                   scheduler_name=parsed.scheduler_name, request=parsed.request, terminal=False, meta=parsed.meta())


RESERVATION_REFUSED = "NoRoomForReservation"
"""Reason of the Warning event on a Reservation marked Available on a node without room for it."""


def refusal_message(refused: ReservationRefused) -> str:
    """What the Warning event on a Reservation the ledger refused room says (amounts as quantities)."""
    name = refused.pod.removeprefix(RESERVATION_PREFIX)
    wanted = format_quantity(refused.resource, refused.wanted)
    free = format_quantity(refused.resource, max(0, refused.free))
    return (f"hoss: Reservation {name} is marked Available on node {refused.node}, which has no room for it "
            f"({refused.resource}: {wanted} wanted, {free} free); it holds no room there and its owners cannot use "
            f"it (hoss tries again at every ledger audit and whenever the Reservation changes)")
