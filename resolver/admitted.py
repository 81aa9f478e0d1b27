"""What a GET of a pod proves about an admitted ledger entry (the webhook allowed a binding or a pod created on a
node, and the write's outcome is not known yet). Pure: the sync's verify loop (resolver/sync.py) does the GET."""

from __future__ import annotations

from typing import Literal

from hoss.ledger.results import AdmittedEntry
from hoss.model.objects import Json


def admitted_verdict(
    entry: AdmittedEntry, pod: Json | None, *, now_ms: int, write_timeout_ms: int
) -> Literal["keep", "pod gone", "bound elsewhere", "pod being deleted", "write failed"]:
    """What a GET of the pod (None: 404) proves about an admitted entry. Pure.

    The entry stays ("keep") unless the admitted write can no longer happen: the pod is bound to another node
    (a pod is bound once), the pod with that uid is gone or being deleted (for a binding: the apiserver binds
    neither), or the pod is still
    unbound (or, for a creation, not there) once the write is surely over: its binder saw the apiserver's
    answer, or `write_timeout_ms` passed since the admission. A pod bound to the entry's node keeps it: the sync
    turns it into a bound entry when its watch delivers the pod.
    """
    metadata = (pod or {}).get("metadata") or {}
    same = pod is not None and metadata.get("uid") == entry.uid
    if same:
        node = ((pod or {}).get("spec") or {}).get("nodeName") or ""
        if node == entry.node:
            return "keep"
        if node:
            return "bound elsewhere"
        if metadata.get("deletionTimestamp") and entry.via == "binding":
            return "pod being deleted"  # the apiserver refuses to bind a pod that is being deleted
    elif entry.via != "create":
        return "pod gone"
    over = entry.answered or now_ms - entry.admitted_ms >= write_timeout_ms
    return "write failed" if over else "keep"
