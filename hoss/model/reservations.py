"""Koordinator Reservations (scheduling.koordinator.sh/v1alpha1), read the way Koordinator defines them. Pure.

A Reservation holds room for pods that do not exist yet: ``spec.template`` is the shape of the room (a pod
template: requests, scheduler name, placement rules), ``spec.owners`` says which pods may use it (any of: an
``object`` reference, a ``controller`` reference, a ``labelSelector``), ``spec.ttl`` (a Go duration, default 24h
after creation) or ``spec.expires`` (a timestamp, wins) ends it, and ``spec.allocateOnce`` (default true) makes it
end once one owner pod used it; with ``allocateOnce: false`` it stays Available and serves every owner pod that
fits in what is left. Status: ``phase`` Pending (not placed yet), Available (placed: ``nodeName``,
``allocatable``; with allocateOnce false also ``currentOwners`` and ``allocated``, their requests' sum), Succeeded
(used by its owner: ``currentOwners``) or Failed (expired).

Every field of the spec, with Koordinator's meaning, is honoured or the Reservation is refused naming it (the
dispatcher writes a ``Scheduled=False`` condition, reason ``Refused``, and an event): ``template.spec.nodeName``
puts the room on that node and no other; ``ttl`` ``0`` (or ``0s``) never expires; ``allocatePolicy`` ``Aligned``
(or empty, which Koordinator reads as Aligned: an allocateOnce owner takes the Reservation's room first and the
rest from the node) and ``Restricted`` (an owner uses the Reservation only when every reserved resource it asks
for fits in the room left, and does not go to a node whose Restricted Reservations all have too little left for
it, not even on its free room, as Koordinator's filter decides); ``unschedulable: true`` keeps new owners off it
(those that hold a share keep it);
``taints`` with effect NoSchedule or NoExecute keep owners that do not tolerate them off it (PreferNoSchedule is
refused: hoss would not weigh it); ``preAllocation: true`` is refused (hoss never overcommits a node to hold
room); any other field is refused.

Who does what: the dispatcher sends a Pending Reservation to a worker as a pod (`as_pod`), the worker places it
like a pod and holds its room in the ledger (`hoss.ledger.client.Ledger.hold_reservation`) before it writes status
Available; the sync keeps the room of every Available Reservation in the ledger; a pending pod that an Available
Reservation `owns` carries it to the worker, which prefers its node and takes its room (a share of it) in one
ledger call; with allocateOnce false the leader dispatcher writes currentOwners and allocated from the ledger's
shares (`shared_status`).
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from hoss.errors import PodSpecError, QuantityError
from hoss.model.objects import Json, section
from hoss.model.resources import ResourceVector, format_quantity, parse_quantity, pod_requests, to_base_units

API = ("scheduling.koordinator.sh", "v1alpha1", "reservations")
"""group, version, plural"""
ANNOTATION = "hoss.io/reservation"
"""Set by the dispatcher on the pod it makes of a Reservation (`as_pod`): the Reservation's name."""
SHARED_ANNOTATION = "hoss.io/reservation-allocate-once"
"""Set to "false" beside `ANNOTATION` for a Reservation with allocateOnce false (the placing worker's meta says so)."""
HINTS = "reservations"
"""Key of the compact pod form (`hoss.model.compact`) in which the dispatcher lists the Available Reservations that
own a pending pod: [[uid, name, node, {resource: room left}, allocateOnce], ...]."""
DEFAULT_TTL_SECONDS = 24 * 3600.0
"""Koordinator's default: a Reservation without ttl or expires lives a day."""
PRIORITY = 2**31 - 1
"""The priority a Reservation's ledger entry carries in its meta: no preempting pod takes it as a victim."""
PHASES = ("Pending", "Available", "Succeeded", "Failed")
SPEC_FIELDS = frozenset({"template", "owners", "ttl", "expires", "preAllocation", "allocateOnce", "allocatePolicy",
                         "unschedulable", "taints"})
ALLOCATE_POLICIES = ("", "Aligned", "Restricted")
OWNER_TAINT_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects an owner pod must tolerate to use a Reservation (Koordinator filters on these)."""

_DURATION = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ReservationError(PodSpecError):
    """A Reservation hoss cannot honour; `field` is the JSON path inside the Reservation."""


@dataclass(frozen=True)
class RefusedReservation:
    """A Reservation hoss refuses, and why: said on it (status condition and event) once per generation."""

    name: str
    generation: int
    field: str
    reason: str

    @classmethod
    def of(cls, obj: Mapping[str, Any], error: ReservationError) -> RefusedReservation:
        metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        assert isinstance(metadata, dict)
        generation = metadata.get("generation")
        return cls(name=str(metadata.get("name") or ""), generation=generation if isinstance(generation, int) else 0,
                   field=error.field, reason=error.reason)


def parse_duration(text: str, *, field: str) -> float:
    """A Go duration ("30m", "1h30m", "90s", and "0", which Go reads without a unit) in seconds."""
    if text == "0":
        return 0.0
    if not isinstance(text, str) or not text or _DURATION.sub("", text) != "":
        raise ReservationError(field=field, reason=f"invalid duration {text!r} (expected e.g. 30m, 1h30m, 90s)")
    return sum(float(amount) * _UNITS[unit] for amount, unit in _DURATION.findall(text))


def _timestamp(value: object, *, field: str) -> float:
    if not isinstance(value, str):
        raise ReservationError(field=field, reason=f"expected an RFC 3339 timestamp, got {value!r}")
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ReservationError(field=field, reason=f"expected an RFC 3339 timestamp, got {value!r}") from None


@dataclass(frozen=True)
class Owner:
    """One entry of spec.owners: whichever parts are given must all match."""

    object: Mapping[str, str] = field(default_factory=dict)
    controller: Mapping[str, str] = field(default_factory=dict)
    selector: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Reservation:
    uid: str
    name: str
    template: Json
    """The pod template (metadata, spec)."""
    owners: tuple[Owner, ...]
    expires_unix: float
    allocate_once: bool
    phase: str
    node: str
    request: ResourceVector
    scheduler_name: str
    resource_version: str = ""
    current_owners: tuple[Mapping[str, str], ...] = ()
    """status.currentOwners (namespace, name, uid)"""
    allocated: ResourceVector = field(default_factory=dict)
    """status.allocated in base units (what the current owners hold)"""
    restricted: bool = False
    """allocatePolicy Restricted: an owner uses it only when what it asks of the reserved resources fits."""
    unschedulable: bool = False
    """No new owner may use it."""
    taints: tuple[tuple[str, str, str], ...] = ()
    """(key, value, effect) an owner must tolerate (effects NoSchedule and NoExecute)."""
    generation: int = 0

    @property
    def room_left(self) -> ResourceVector:
        """What the owners have not taken yet, as the status says (all of it for allocateOnce). With allocateOnce
        false the pod count is no part of it: every owner is a pod of its own on the node."""
        if self.allocate_once:
            return self.request
        return {r: max(0, amount - self.allocated.get(r, 0)) for r, amount in self.request.items() if r != "pods"}

    @property
    def available(self) -> bool:
        return self.phase == "Available" and bool(self.node)

    @property
    def pending(self) -> bool:
        return self.phase in ("", "Pending") and not self.node

    def meta(self) -> str:
        """The meta its ledger entry carries (`hoss.model.compact.pod_meta`'s shape): never a preemption victim."""
        namespace = (self.template.get("metadata") or {}).get("namespace") or "default"
        meta: dict[str, object] = {"namespace": namespace, "priority": PRIORITY, "reservation": self.name}
        if not self.allocate_once:
            meta["allocateOnce"] = False
        owners = [o["uid"] for o in self.current_owners if o.get("uid")]
        if owners:
            meta["owners"] = owners  # the ledger gives their shares back to them after a rebuild
        return orjson.dumps(meta).decode()


def parse(obj: Mapping[str, Any]) -> Reservation:
    """The typed view of a raw Reservation; raises ReservationError naming the field hoss cannot read."""
    metadata = section(obj, "metadata")
    spec = section(obj, "spec")
    status = section(obj, "status")
    uid, name = str(metadata.get("uid") or ""), str(metadata.get("name") or "")
    if not uid or not name:
        raise ReservationError(field="metadata", reason="uid and name are required")
    template = spec.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise ReservationError(field="spec.template", reason="expected a pod template with a spec")
    raw_owners = spec.get("owners")
    if not isinstance(raw_owners, list) or not raw_owners:
        raise ReservationError(field="spec.owners", reason="expected at least one owner")
    owners = []
    for index, raw in enumerate(raw_owners):
        where = f"spec.owners[{index}]"
        if not isinstance(raw, dict) or not ({"object", "controller", "labelSelector"} & raw.keys()):
            raise ReservationError(field=where, reason="expected object, controller or labelSelector")
        selector = raw.get("labelSelector")
        if selector is not None and not isinstance(selector, dict):
            raise ReservationError(field=f"{where}.labelSelector", reason="expected a label selector")
        owners.append(Owner(object=_strings(raw.get("object"), field=f"{where}.object"),
                            controller=_strings(raw.get("controller"), field=f"{where}.controller"),
                            selector=selector))
    unknown = sorted(set(spec) - SPEC_FIELDS)
    if unknown:
        raise ReservationError(field=f"spec.{unknown[0]}",
                               reason=f"hoss does not know this field ({spec[unknown[0]]!r}); refused rather than "
                                      f"ignored")
    if spec.get("expires") is not None:
        expires = _timestamp(spec["expires"], field="spec.expires")
    else:
        created = _timestamp(metadata.get("creationTimestamp"), field="metadata.creationTimestamp")
        ttl = spec.get("ttl")
        seconds = DEFAULT_TTL_SECONDS if ttl is None else parse_duration(ttl, field="spec.ttl")
        expires = math.inf if seconds == 0 else created + seconds  # Koordinator: ttl 0 disables expiration
    allocate_once = spec.get("allocateOnce", True)
    if not isinstance(allocate_once, bool):
        raise ReservationError(field="spec.allocateOnce", reason=f"expected true or false, got {allocate_once!r}")
    policy = spec.get("allocatePolicy", "")
    if policy not in ALLOCATE_POLICIES:
        raise ReservationError(field="spec.allocatePolicy",
                               reason=f"expected Aligned or Restricted, got {policy!r}")
    if spec.get("preAllocation") not in (None, False):
        raise ReservationError(field="spec.preAllocation",
                               reason=f"{spec['preAllocation']!r}: hoss never overcommits a node to hold room; "
                                      f"only false is honoured")
    unschedulable = spec.get("unschedulable", False)
    if not isinstance(unschedulable, bool):
        raise ReservationError(field="spec.unschedulable", reason=f"expected true or false, got {unschedulable!r}")
    taints = _taints(spec.get("taints"))
    pod = {"metadata": template.get("metadata") or {}, "spec": template["spec"]}
    raw_owners_now = status.get("currentOwners")
    current = tuple({k: str(v) for k, v in o.items() if k in ("namespace", "name", "uid") and isinstance(v, str)}
                    for o in (raw_owners_now if isinstance(raw_owners_now, list) else []) if isinstance(o, dict))
    return Reservation(
        uid=uid, name=name, template=pod, owners=tuple(owners), expires_unix=expires, allocate_once=allocate_once,
        phase=str(status.get("phase") or ""), node=str(status.get("nodeName") or ""),
        request=pod_requests(pod), scheduler_name=str(template["spec"].get("schedulerName") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        current_owners=current, allocated=_allocated(status.get("allocated")), restricted=policy == "Restricted",
        unschedulable=unschedulable, taints=taints,
        generation=generation if isinstance(generation := metadata.get("generation"), int) else 0,
    )


def _taints(value: object) -> tuple[tuple[str, str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ReservationError(field="spec.taints", reason=f"expected a list of taints, got {value!r}")
    taints = []
    for index, taint in enumerate(value):
        where = f"spec.taints[{index}]"
        if not isinstance(taint, dict) or not isinstance(taint.get("key"), str) or not taint.get("key"):
            raise ReservationError(field=where, reason=f"expected a taint with a key, got {taint!r}")
        effect = taint.get("effect")
        if effect not in OWNER_TAINT_EFFECTS:
            raise ReservationError(field=f"{where}.effect",
                                   reason=f"{effect!r}: hoss keeps owners off a Reservation for NoSchedule and "
                                          f"NoExecute taints only")
        taints.append((taint["key"], str(taint.get("value") or ""), effect))
    return tuple(taints)


def tolerated(reservation: Reservation, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a pod with these (raw) tolerations tolerates every taint of the Reservation (Kubernetes'
    ToleratesTaint, for the taints' NoSchedule and NoExecute effects)."""
    def tolerates(toleration: Mapping[str, Any], key: str, value: str, effect: str) -> bool:
        if toleration.get("effect") and toleration.get("effect") != effect:
            return False
        if toleration.get("key") and toleration.get("key") != key:
            return False
        return toleration.get("operator") == "Exists" or str(toleration.get("value") or "") == value

    return all(any(tolerates(t, *taint) for t in tolerations if isinstance(t, dict)) for taint in reservation.taints)


def usable_by(reservation: Reservation, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a new owner (with these tolerations) may use the Available Reservation: not unschedulable, and its
    taints tolerated."""
    return reservation.available and not reservation.unschedulable and tolerated(reservation, tolerations)


def _allocated(value: object) -> ResourceVector:
    """status.allocated in base units; what cannot be read counts as nothing allocated (hoss wrote it)."""
    if not isinstance(value, dict):
        return {}
    amounts = {}
    for resource, quantity in value.items():
        try:
            amounts[str(resource)] = to_base_units(str(resource), parse_quantity(quantity, field="status.allocated"))
        except QuantityError:
            continue
    return amounts


def _strings(value: object, *, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReservationError(field=field, reason="expected an object reference")
    return {str(k): str(v) for k, v in value.items() if isinstance(v, str | int)}


def as_pod(reservation: Reservation, *, scheduler_name: str) -> Json:
    """The pod the dispatcher places for a Pending Reservation: its template, under the Reservation's uid and
    name, marked with `ANNOTATION` (so the worker holds room instead of binding)."""
    template_metadata = reservation.template.get("metadata") or {}
    metadata: Json = {
        "uid": reservation.uid,
        "name": reservation.name,
        "namespace": template_metadata.get("namespace") or "default",
        "labels": dict(template_metadata.get("labels") or {}),
        "annotations": {**(template_metadata.get("annotations") or {}), ANNOTATION: reservation.name},
    }
    if not reservation.allocate_once:
        metadata["annotations"][SHARED_ANNOTATION] = "false"
    spec = {**reservation.template["spec"], "schedulerName": scheduler_name}
    node = spec.pop("nodeName", None)
    if node:
        # Koordinator: with template.spec.nodeName the room goes on that node and no other. A pod with nodeName
        # is no pod to schedule, so the node becomes a required node affinity on metadata.name, ANDed into every
        # term the template has (terms are ORed).
        spec["affinity"] = _pinned_affinity(spec.get("affinity"), str(node))
    return {"metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}


def _pinned_affinity(affinity: object, node: str) -> Json:
    field_term = {"key": "metadata.name", "operator": "In", "values": [node]}
    affinity = dict(affinity) if isinstance(affinity, dict) else {}
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict)] or [{}]
    required["nodeSelectorTerms"] = [{**t, "matchFields": [*(t.get("matchFields") or []), field_term]} for t in terms]
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    return affinity


def owns(reservation: Reservation, pod: Mapping[str, Any]) -> bool:
    """Koordinator's owner matching: the pod matches any one of spec.owners (every part of that entry)."""
    metadata = section(pod, "metadata")
    return any(_owner_matches(owner, metadata) for owner in reservation.owners)


def _owner_matches(owner: Owner, metadata: Mapping[str, Any]) -> bool:
    if owner.object:
        for key in ("uid", "name", "namespace"):
            if owner.object.get(key) and owner.object[key] != str(metadata.get(key) or ""):
                return False
    if owner.controller:
        references = metadata.get("ownerReferences")
        controllers = [r for r in (references if isinstance(references, list) else [])
                       if isinstance(r, dict) and r.get("controller")]
        namespace = owner.controller.get("namespace")
        if namespace and namespace != metadata.get("namespace"):
            return False
        if not any(all(not owner.controller.get(key) or owner.controller[key] == str(ref.get(key) or "")
                       for key in ("uid", "name", "kind", "apiVersion")) for ref in controllers):
            return False
    if owner.selector is not None:
        labels = metadata.get("labels") if isinstance(metadata.get("labels"), dict) else {}
        assert isinstance(labels, dict)
        if not selector_matches(owner.selector, labels):
            return False
    return True


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against labels (an unreadable selector matches nothing)."""
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, dict) or any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return False
    for expression in expressions:
        if not isinstance(expression, dict):
            return False
        key, operator, values = str(expression.get("key")), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return bool(match_labels) or bool(expressions)


def hints(reservations: Sequence[Reservation]) -> list[list[object]]:
    """The `HINTS` entries of the Available Reservations that own a pod: uid, name, node, room left,
    allocateOnce, and whether its allocatePolicy is Restricted."""
    return [[r.uid, r.name, r.node, dict(r.room_left), r.allocate_once, r.restricted]
            for r in reservations if r.available]


def _condition(kind: str, status: str, reason: str, message: str) -> Json:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": kind, "status": status, "reason": reason, "message": message[:1024],
            "lastProbeTime": now, "lastTransitionTime": now}


def quantities(amounts: Mapping[str, int]) -> dict[str, str]:
    """Base units as Kubernetes quantities (a status ResourceList; the pod count is no part of it, as in
    Koordinator: a Reservation's allocatable is what its template requests)."""
    return {resource: format_quantity(resource, amount) for resource, amount in amounts.items()
            if resource != "pods"}


def available_status(node: str, request: Mapping[str, int] | None = None) -> Json:
    """Merge patch of status: placed on `node`, holding `request` (status.allocatable)."""
    allocatable = {"allocatable": quantities(request)} if request else {}
    return {"status": {"phase": "Available", "nodeName": node, **allocatable, "conditions": [
        _condition("Scheduled", "True", "Scheduled", f"Reservation placed on {node}"),
        _condition("Ready", "True", "Available", f"room held on {node}")]}}


def unschedulable_status(message: str) -> Json:
    return {"status": {"phase": "Pending", "conditions": [_condition("Scheduled", "False", "Unschedulable", message)]}}


def succeeded_status(node: str, owner: Mapping[str, str]) -> Json:
    """Used by its owner pod (allocateOnce)."""
    return {"status": {"phase": "Succeeded", "nodeName": node, "currentOwners": [dict(owner)], "conditions": [
        _condition("Ready", "False", "Succeeded", f"used by pod {owner.get('namespace')}/{owner.get('name')}")]}}


def shared_status(reservation: Reservation, owners: Sequence[Mapping[str, str]],
                  allocated: Mapping[str, int]) -> Json:
    """Merge patch of an allocateOnce false Reservation's status: its current owners and what they hold (every
    reserved resource named, 0 included, so a merge patch never leaves an old amount behind)."""
    amounts = {resource: allocated.get(resource, 0) for resource in reservation.request}
    return {"status": {"currentOwners": [dict(o) for o in owners], "allocated": quantities(amounts)}}


def refused_status(field: str, message: str) -> Json:
    """Merge patch of a Reservation hoss refuses: still Pending, its Scheduled condition (reason Refused) naming
    the field."""
    return {"status": {"phase": "Pending", "conditions": [
        _condition("Scheduled", "False", "Refused", f"{field}: {message}")]}}


def no_worker_status(message: str) -> Json:
    """Merge patch of a Pending Reservation's status: no live worker serves its policy."""
    return {"status": {"phase": "Pending", "conditions": [
        _condition("Scheduled", "False", "NoWorkerForPolicy", message)]}}


def failed_status(reason: str, message: str) -> Json:
    return {"status": {"phase": "Failed", "conditions": [_condition("Ready", "False", reason, message)]}}


def status_path(name: str) -> str:
    group, version, plural = API
    return f"/apis/{group}/{version}/{plural}/{name}/status"
