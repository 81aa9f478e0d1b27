"""A worker's part in Koordinator Reservations (hoss/model/reservations.py): placing one, and owner pods using one.

- A work item whose pod carries `hoss.model.reservations.ANNOTATION` is a Reservation to place: it is decided like a
  pod, its room is reserved in the ledger under 'Reservation/<name>', and instead of a binding the worker writes
  the Reservation's status (phase Available, nodeName) and then keeps the room (`Ledger.keep_reservation`).
- A pod whose compact form lists `hoss.model.reservations.HINTS` is owned by those Available Reservations: the
  worker decides it with their room left given back on their nodes (for allocateOnce false only when the pod fits
  in it), puts such a node first (Koordinator prefers reservations), and names the Reservation in its ledger call,
  which hands a share of the room over atomically (and back when the pod's entry goes, e.g. its binding failed);
  after the binding an allocateOnce Reservation is marked Succeeded with the pod as its owner (the owners of one
  with allocateOnce false are written by the leader dispatcher from the ledger).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.framework.pod import PodView
from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from hoss.model import reservations
from hoss.model.objects import Json, section

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Hint:
    uid: str
    name: str
    node: str
    request: Mapping[str, int]
    """the room left, as the Reservation's status says"""
    once: bool = True
    """allocateOnce"""
    restricted: bool = False
    """allocatePolicy Restricted"""

    def serves(self, request: Mapping[str, int]) -> bool:
        """Whether a pod asking `request` may take room from it: allocateOnce with allocatePolicy Aligned always
        (what it lacks comes from the node's free room), otherwise (allocateOnce false, or Restricted) only when
        every reserved resource it asks for fits in the room left."""
        return (self.once and not self.restricted) or all(amount <= self.request[r] for r, amount in request.items()
                                if r in self.request and amount > 0 and r != "pods")


def shared_reservation(raw: Json) -> bool:
    """Whether this work item's Reservation has allocateOnce false."""
    annotations = section(raw, "metadata").get("annotations")
    return isinstance(annotations, dict) and annotations.get(reservations.SHARED_ANNOTATION) == "false"


def reservation_name(raw: Json) -> str:
    """The Reservation this work item's pod stands for ('' for an ordinary pod)."""
    metadata = section(raw, "metadata")
    annotations = metadata.get("annotations")
    name = annotations.get(reservations.ANNOTATION) if isinstance(annotations, dict) else None
    return name if isinstance(name, str) else ""


def hints_of(raw: Json) -> list[Hint]:
    """The Available Reservations the dispatcher found owning the pod (unreadable entries are skipped)."""
    found = []
    for entry in raw.get(reservations.HINTS) or []:
        if (isinstance(entry, list) and len(entry) in (4, 5, 6) and all(isinstance(x, str) for x in entry[:3])
                and isinstance(entry[3], dict)):
            found.append(Hint(uid=entry[0], name=entry[1], node=entry[2],
                              request={str(k): int(v) for k, v in entry[3].items() if isinstance(v, int)},
                              once=entry[4] is not False if len(entry) >= 5 else True,
                              restricted=len(entry) == 6 and entry[5] is True))
    return found


def taken_once(raw: Json, node: str) -> str:
    """The allocateOnce Reservation on `node` among those owning the pod ('' when none): the pod took its room
    there, and once bound it is the Reservation's owner."""
    hint = next((h for h in hints_of(raw) if h.node == node), None)
    return hint.name if hint is not None and hint.once else ""


def preferred_first(candidates: list[str], feasible_hint_nodes: list[str]) -> list[str]:
    """The candidates with a feasible Reservation node first (Koordinator prefers reservations to free room)."""
    if not feasible_hint_nodes:
        return candidates
    return [feasible_hint_nodes[0], *(c for c in candidates if c != feasible_hint_nodes[0])]


async def write_status(rest: KubeREST | None, name: str, patch: Json) -> bool:
    """Merge-patch the Reservation's status; False (logged) when the apiserver refused it or was unreachable."""
    if rest is None:
        return False
    try:
        await rest.request("PATCH", reservations.status_path(name), body=patch, content_type=MERGE_PATCH)
    except KubeError as error:
        log.warning("cannot write the status of Reservation %s: %s", name, error)
        return False
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        log.warning("cannot write the status of Reservation %s: %s", name, error)
        return False
    return True


async def keep_room(rest: KubeREST | None, ledger: Ledger, *, name: str, pod: PodView, node: str, meta: str) -> bool:
    """The Reservation's room is reserved on `node`: write its status Available there, then keep the room (the sync
    does the same when it sees the status, so a worker that dies in between loses nothing). False when the status
    could not be written: the room is the caller's to release."""
    if not await write_status(rest, name, reservations.available_status(node, pod.request)):
        return False
    try:
        await ledger.keep_reservation(uid=pod.uid, name=name, node=node, request=pod.request, meta=meta)
    except (LedgerUnavailable, LedgerNotReadyError) as error:
        log.warning("Reservation %s: its room on %s is kept by the sync once it sees it (%s)", name, node, error)
    return True
