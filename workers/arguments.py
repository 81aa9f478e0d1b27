"""What a worker asks the ledger for a pod it decided (`hoss.ledger.arguments`), built from its work item. Pure.

A Reservation to place holds room under 'Reservation/<name>' with a meta of its own; a pod owned by Reservations
names the one on its best candidate that has one, whose room it then takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

from hoss.framework.cycle import Placement
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView
from hoss.ledger.arguments import BatchPod
from hoss.ledger.arguments import GangMember as GangPlacementMember
from hoss.ledger.keys import reservation_key
from hoss.model import compact, reservations
from hoss.model.objects import Json
from hoss.model.resources import ResourceVector
from workers.intake import Work
from workers.reservations import hints_of, reservation_name, shared_reservation


def ledger_meta(raw: Json, request: ResourceVector | None = None) -> dict[str, str]:
    """The ledger's ``ports`` and ``meta`` of a pod (`hoss.model.compact.pod_meta`; `request` is its effective request,
    which preemption reads) as keyword arguments."""
    ports, meta = compact.pod_meta(raw, request=request)
    return {"ports": ports, "meta": meta}


def inter_pod_keys(pod: PodView) -> str:
    """The topology keys of the pod's required inter-pod terms and DoNotSchedule spread constraints, as
    reserve_batch takes them ('k1,k2')."""
    return ",".join(sorted(pod.domain_keys))


def decided_meta(work: Work, pod: PodView) -> dict[str, str]:
    """`ledger_meta` of the item's pod; a Reservation's meta names it, its namespace and priority instead."""
    meta = ledger_meta(work.raw, pod.request)
    name = reservation_name(work.raw)
    if name:
        fields: dict[str, object] = {"namespace": pod.namespace, "priority": reservations.PRIORITY,
                                     "reservation": name}
        if shared_reservation(work.raw):
            fields["allocateOnce"] = False
        meta["meta"] = orjson.dumps(fields).decode()
    return meta


def batch_pod(work: Work, pod: PodView, decision: Placement, position: str, *, nodes: NodeTable) -> BatchPod:
    """The ledger's view of one decided pod, for ``reserve_batch`` (`position`: the change stream the decision
    saw). A pod asking an extended resource a DeviceClass serves keeps only the candidates that count its request
    as the first does (`NodeTable.request_on`): the ledger holds one request for all of them."""
    name = reservation_name(work.raw)
    # A Reservation that does not serve the pod (Restricted, or allocateOnce false, and too little left) is not
    # named: the pod is placed as any pod, from the node's free room.
    by_node = {h.node: h.uid for h in hints_of(work.raw) if h.serves(pod.request)}
    consume = next((by_node[c] for c in decision.candidates if c in by_node), "")
    request, candidates = pod.request, decision.candidates
    if pod.dra_resources and decision.candidates[0] in nodes:
        request = nodes.request_on(decision.candidates[0], pod)
        candidates = [c for c in decision.candidates if c in nodes and nodes.request_on(c, pod) == request]
    return BatchPod(uid=pod.uid, pod=reservation_key(name) if name else pod.key, digest=work.item.digest,
                    candidates=candidates, request=request, **decided_meta(work, pod),
                    inter_pod_keys=inter_pod_keys(pod), position=position,
                    tentative=bool(pod.host_ports or pod.reads_pod_index), reservation=consume)


def gang_members(work: Work, chosen: Sequence[PodView], assignments: Mapping[str, str], *,
                 nodes: NodeTable) -> list[GangPlacementMember]:
    """The ledger's view of the gang members `chosen`, each on its node in `assignments` with its request as that
    node counts it (`NodeTable.request_on`), for ``reserve_gang``."""
    raws = {view.uid: raw for view, raw in work.members}
    return [GangPlacementMember(uid=v.uid, pod=v.key, node=assignments[v.uid],
                                request=nodes.request_on(assignments[v.uid], v) if assignments[v.uid] in nodes
                                else v.request, **ledger_meta(raws[v.uid], v.request)) for v in chosen]
