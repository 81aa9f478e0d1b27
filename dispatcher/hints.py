"""Koordinator Reservation hints on work items: a pending pod's compact form carries the Available Reservations
that own it (`reservations.HINTS`), so its worker prefers their nodes and takes their room. Pure. Not for gangs
yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import orjson

from dispatcher.intake import PendingPod
from hoss.model import compact, reservations
from hoss.model.objects import Json
from hoss.model.reservations import Reservation
from hoss.queue import WorkItem


def owner_view(pod: PendingPod) -> Json:
    """What a Reservation's owner matching (`reservations.owns`) reads of a pending pod."""
    return {"metadata": {"uid": pod.uid, "namespace": pod.namespace, "name": pod.name, "labels": dict(pod.labels),
                         "ownerReferences": list(pod.owner_references)}}


def owns(reservation: Reservation, pod: PendingPod) -> bool:
    """Whether the Reservation's owners include the pending pod."""
    return reservations.owns(reservation, owner_view(pod))


def with_hints(item: WorkItem, pod: PendingPod, available: Iterable[Reservation]) -> WorkItem:
    """The item of `pod`, its compact form carrying the hints of the `available` Reservations that own the pod and
    that it may use (not unschedulable, their taints tolerated); the item itself when none does."""
    view = owner_view(pod)
    owning = [r for r in available if reservations.owns(r, view)]
    if not owning:
        return item
    form = orjson.loads(item.pod)
    tolerations = (form.get("spec") or {}).get("tolerations") or []
    owning = [r for r in owning if reservations.usable_by(r, tolerations if isinstance(tolerations, list) else [])]
    if not owning:
        return item
    form[reservations.HINTS] = reservations.hints(owning)
    # A version of its own: sent again when a Reservation becomes Available, it makes the worker's older copy
    # stale, as a changed pod does.
    return dataclasses.replace(item, pod=compact.encode(form).decode(), digest=compact.digest(form))
