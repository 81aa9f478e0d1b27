"""What the ledger's operations are given, and its pure encoding into the Lua scripts' arguments.

Placements, batch pods, move holds and elastic quotas are plain data; the functions below turn them into the flat
argument lists the scripts in ``hoss/ledger/lua`` read front to back, checking amounts on the way (a script trusts
its arguments: a negative or fractional amount would corrupt a used total).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import orjson

from hoss.model.resources import MAX_UNITS, ResourceVector

Via = Literal["binding", "create", "resize"]
"""What the webhook admitted: a binding, the creation of a pod with spec.nodeName, or an in-place resize."""

MOVE_PRIORITY: Final = 2**31
"""Priority of the rescheduler's holds: above every pod's (system-node-critical is 2,000,001,000), so no other
pod and no foreign binding takes held room."""


@dataclass(frozen=True)
class Placement:
    """A pod with its request on a node."""

    uid: str
    pod: str
    """namespace/name, for messages and logs"""
    node: str
    request: Mapping[str, int]
    ports: str = ""
    """Host ports the pod holds on the node (`hoss.model.compact.pod_meta`), checked by reserve."""
    meta: str = ""
    """The pod's compact description for the workers' pod index (`hoss.model.compact.pod_meta`)."""


GangMember = Placement
BoundPod = Placement


@dataclass(frozen=True)
class BatchPod:
    """One pod of a batch reservation: its candidates, best first, and the digest of the version decided on."""

    uid: str
    pod: str
    digest: str
    candidates: Sequence[str]
    request: Mapping[str, int]
    ports: str = ""
    """Host ports (`hoss.model.compact.pod_meta`): the reservation is refused on a node where one is taken."""
    meta: str = ""
    """The pod's compact description for the workers' pod index (`hoss.model.compact.pod_meta`)."""
    inter_pod_keys: str = ""
    """The topology keys of the pod's required inter-pod terms and DoNotSchedule spread constraints ('k1,k2'),
    whose domains are checked."""
    position: str = ""
    """The change-stream id the decision saw: refused on a node whose inter-pod domains changed since ('' = not
    checked); see 'Inter-pod domains' in hoss/ledger/lua/common.lua."""
    tentative: bool = False
    """The worker counted this pod as placed when it decided the later pods of the batch: if it is refused, a
    later pod with inter_pod_keys is refused too (its decision may have relied on it)."""
    reservation: str = ""
    """uid of a Reservation the pod may consume: on that Reservation's node its room is given to the pod in the
    same call (`Reserved.consumed`); see 'Reservations' in hoss/ledger/lua/reserve_batch.lua."""


@dataclass(frozen=True)
class AttachSlots:
    """One CSI driver's attach slots a pod takes on its node (``promise_attach``): the node's `limit`, the handles
    the worker counts attached there (`attached`, the pods on the node but this one) and the pod's own `handles`."""

    driver: str
    limit: int
    attached: tuple[str, ...]
    handles: tuple[str, ...]


@dataclass(frozen=True)
class MoveHold:
    """Room the rescheduler holds before it evicts: for the pending pod (`key` its uid, `owner` ''), or for the
    replacement of a moved pod (`key` 'move/<uid>', `owner` its controller's uid). `freeing`: what the plan's
    evictions free on `node` (the hold may count it)."""

    key: str
    node: str
    request: ResourceVector
    owner: str = ""
    freeing: ResourceVector = field(default_factory=dict)


@dataclass(frozen=True)
class ElasticQuota:
    """A namespace's elastic quota as the ledger enforces it (base units; a resource missing from `max` is not
    limited, one missing from `min` is guaranteed 0)."""

    namespace: str
    min: ResourceVector
    max: ResourceVector


NodeRow = tuple[str, Mapping[str, int], Mapping[str, str]] | tuple[str, Mapping[str, int], Mapping[str, str], str]
"""A node for `rebuild`: name, allocatable, labels and, optionally, its compact description (JSON)."""


def ttl_ms(ttl_seconds: float) -> int:
    if not ttl_seconds > 0:
        raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
    return max(1, round(ttl_seconds * 1000))


def vector_args(vector: Mapping[str, int]) -> list[str | int]:
    """count, then resource/amount pairs in the vector's order (the order conflicts are looked for in)."""
    args: list[str | int] = [len(vector)]
    for resource, amount in vector.items():
        if not resource:
            raise ValueError("resource names must not be empty")
        if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= MAX_UNITS:
            raise ValueError(f"{resource}: amount must be an integer in [0, {MAX_UNITS}], got {amount!r}")
        args.extend([resource, str(amount)])
    return args


def label_args(labels: Mapping[str, str]) -> list[str | int]:
    """count, then label/value pairs."""
    args: list[str | int] = [len(labels)]
    for name, value in labels.items():
        args.extend([name, value])
    return args


def placement_args(placement: Placement) -> list[str | int]:
    return [placement.uid, placement.pod, placement.node, *vector_args(placement.request), placement.ports,
            placement.meta]


def placements_args(placements: Iterable[Placement]) -> list[str | int]:
    """Every placement's arguments, one after another."""
    return [arg for placement in placements for arg in placement_args(placement)]


def batch_payload(pods: Sequence[BatchPod]) -> str:
    """reserve_batch.lua's pods, as one JSON argument (a batch is too long for the scripts' argument limits)."""
    return orjson.dumps([
        [item.uid, item.pod, item.digest, list(item.candidates), vector_args(item.request)[1:], item.ports,
         item.meta, item.inter_pod_keys, item.position, 1 if item.tentative else 0, item.reservation]
        for item in pods
    ]).decode()


def move_holds_payload(holds: Sequence[MoveHold]) -> str:
    """hold_moves.lua's holds, as one JSON argument."""
    return orjson.dumps([[h.key, h.node, h.owner, [x for r, a in h.request.items() for x in (r, str(a))],
                          {r: str(a) for r, a in h.freeing.items()}] for h in holds]).decode()


def rebuild_args(epoch: str, nodes: Sequence[NodeRow], bound: Sequence[Placement]) -> list[str | int]:
    """rebuild.lua's arguments: the epoch, then the nodes (allocatable, labels, description), then the bound pods."""
    args: list[str | int] = [epoch, len(nodes)]
    for name, allocatable, labels, *spec in nodes:
        args.extend([name, *vector_args(allocatable), *label_args(labels), spec[0] if spec else ""])
    args.append(len(bound))
    args.extend(placements_args(bound))
    return args


def quota_args(quotas: Iterable[ElasticQuota], *, deleted: Iterable[str], replace: bool) -> list[str | int]:
    """set_quotas.lua's arguments: whether `quotas` replace every quota, then each namespace's quota (a deleted
    namespace's with no amounts)."""
    items: list[str | int] = []
    count = 0
    for quota in quotas:
        items.extend([quota.namespace, 1, *vector_args(quota.min), *vector_args(quota.max)])
        count += 1
    for namespace in deleted:
        items.extend([namespace, 0, 0, 0])
        count += 1
    return [1 if replace else 0, count, *items]
