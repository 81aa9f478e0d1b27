"""A worker's part in Koordinator Reservations (resolver/reservations.py): placing one, and owner pods using one.

- A work item whose pod carries `resolver.reservations.ANNOTATION` is a Reservation to place: it is decided like a
  pod, its room is reserved in the ledger under 'Reservation/<name>', and instead of a binding the worker writes
  the Reservation's status (phase Available, nodeName) and then keeps the room (`Ledger.keep_reservation`).
- A pod whose compact form lists `resolver.reservations.HINTS` is owned by those Available Reservations: the
  worker decides it with their room given back on their nodes, puts such a node first (Koordinator prefers
  reservations), and names the Reservation in its ledger call, which hands the room over atomically; after the
  binding the Reservation is marked Succeeded with the pod as its owner.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from resolver import reservations
from resolver.events import pod_event
from resolver.kube import Json, KubeError, section
from resolver.rest import KubeREST

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Hint:
    uid: str
    name: str
    node: str
    request: Mapping[str, int]


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
        if (isinstance(entry, list) and len(entry) == 4 and all(isinstance(x, str) for x in entry[:3])
                and isinstance(entry[3], dict)):
            found.append(Hint(uid=entry[0], name=entry[1], node=entry[2],
                              request={str(k): int(v) for k, v in entry[3].items() if isinstance(v, int)}))
    return found


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


def reservation_event(name: str, uid: str, *, reason: str, message: str, component: str, warning: bool) -> Json:
    """A core/v1 Event about a (cluster-scoped) Reservation, recorded in namespace default."""
    event = pod_event(namespace="default", name=name, uid=uid, reason=reason, message=message,
                      component=component, warning=warning)
    group, version, _plural = reservations.API
    event["involvedObject"] = {"apiVersion": f"{group}/{version}", "kind": "Reservation", "name": name, "uid": uid}
    return event
