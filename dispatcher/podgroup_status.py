"""The status hoss writes on a gang's PodGroup, as the scheduler (and controller) of each API writes it. Pure: the
counts and the time come in, the status patch and the event to record go out.

- scheduler-plugins (scheduling.x-k8s.io/v1alpha1), as its PodGroup controller keeps it today: phase Pending while
  fewer than minMember members exist, else Scheduling (``scheduleStartTime`` set then), Running once minMember are
  running or succeeded, Finished once minMember succeeded, Failed once one failed and minMember are running,
  succeeded or failed; ``running``, ``succeeded``, ``failed``; ``occupiedBy``: the owners of its members
  (namespace/name, comma-separated). Finished and Failed are final.
- Kubernetes (scheduling.k8s.io/v1alpha2), as kube-scheduler 1.36 writes it: the condition ``PodGroupScheduled``,
  True (reason Scheduled) once minCount members are bound, never taken back to False; False (reason Unschedulable)
  with the message of a member that could not be placed, while none of that holds.
- Volcano (scheduling.volcano.sh/v1beta1), as its scheduler writes it: phase Inqueue once the group is accepted
  (Volcano's enqueue; a refused group stays Pending), which is what Volcano's job controller waits for before it
  makes the job's pods; Running once minMember are bound, running or succeeded (Volcano counts allocated members);
  Completed once minMember succeeded; ``running``, ``succeeded``, ``failed``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass

from dispatcher.gangs import VOLCANO_API, WORKLOAD_API, GangCounts, GangKey, PodGroupSpec
from hoss.model.objects import Json

FINAL_PHASES = frozenset({"Finished", "Failed", "Completed"})


def wall_time_text(unix: float) -> str:
    """RFC 3339 in whole seconds, as Kubernetes writes a Time."""
    return datetime.datetime.fromtimestamp(int(unix), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class StatusChange:
    """A status to merge-patch onto the PodGroup, and the event (reason, message) that says what changed."""

    status: Json
    reason: str
    message: str
    final: bool = False
    """The group reached a final phase: it is no longer counted."""


def plugins_phase(min_member: int, counts: GangCounts, previous: str) -> str:
    """scheduler-plugins' phase for these counts, coming from ``previous``."""
    if previous in FINAL_PHASES:
        return previous
    members = counts.pending + counts.bound + counts.succeeded + counts.failed
    if counts.succeeded >= min_member:
        return "Finished"
    if counts.failed and counts.failed + counts.running + counts.succeeded >= min_member:
        return "Failed"
    if counts.running + counts.succeeded >= min_member:
        return "Running"
    # scheduler-plugins' controller: back to Pending whenever fewer than minMember members exist
    return "Scheduling" if members >= min_member else "Pending"


def _plugins(group: PodGroupSpec, counts: GangCounts, previous: Mapping[str, object], now: str) -> Json:
    phase = plugins_phase(group.min_member, counts, str(previous.get("phase") or ""))
    status: Json = {"phase": phase, "running": counts.running, "succeeded": counts.succeeded,
                    "failed": counts.failed, "occupiedBy": counts.owners}
    start = previous.get("scheduleStartTime")
    if start:
        status["scheduleStartTime"] = start
    elif phase != "Pending":
        status["scheduleStartTime"] = now
    return status


def _volcano(group: PodGroupSpec, counts: GangCounts, previous: Mapping[str, object]) -> Json:
    phase = str(previous.get("phase") or "")
    if phase not in FINAL_PHASES:
        if counts.succeeded >= group.min_member:
            phase = "Completed"
        elif counts.bound + counts.succeeded >= group.min_member:
            phase = "Running"
        else:
            # Volcano's enqueue: hoss has no Volcano queues but the unlimited default one, so an accepted group is
            # admitted at once; Volcano's job controller makes a job's pods only once its group left Pending.
            phase = "Pending" if group.refusal else "Inqueue"
    return {"phase": phase, "running": counts.running, "succeeded": counts.succeeded, "failed": counts.failed}


def _workload(group: PodGroupSpec, counts: GangCounts, previous: Mapping[str, object], now: str) -> Json | None:
    conditions = previous.get("conditions")
    old = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "PodGroupScheduled"), None) \
        if isinstance(conditions, list) else None
    if old is not None and old.get("status") == "True":
        return None  # kube-scheduler never takes a Scheduled group back to False
    if counts.bound + counts.succeeded + counts.failed >= group.min_member:  # each of them was placed
        condition: Json = {"type": "PodGroupScheduled", "status": "True", "reason": "Scheduled", "message": ""}
    elif group.refusal:
        condition = {"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable",
                     "message": group.refusal}
    elif counts.unschedulable:
        condition = {"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable",
                     "message": counts.unschedulable}
    else:
        return None
    condition["observedGeneration"] = group.generation
    if old is not None and all(old.get(k) == v for k, v in condition.items()):
        return None
    condition["lastTransitionTime"] = now if old is None or old.get("status") != condition["status"] \
        else old.get("lastTransitionTime") or now
    return {"conditions": [condition]}


def status_change(key: GangKey, group: PodGroupSpec, counts: GangCounts, previous: Mapping[str, object], *,
                  now: str) -> StatusChange | None:
    """The status the PodGroup of ``key`` should have for ``counts``, when it differs from ``previous`` (its
    status as last seen or written); None when nothing is to be written."""
    if key.api == WORKLOAD_API:
        status = _workload(group, counts, previous, now)
        if status is None:
            return None
        condition = status["conditions"][0]
        scheduled = condition["status"] == "True"
        return StatusChange(status=status, reason="Scheduled" if scheduled else "Unschedulable",
                            message=f"PodGroup {key}: {condition['message'] or 'minCount members are bound'}")
    status = _volcano(group, counts, previous) if key.api == VOLCANO_API else _plugins(group, counts, previous, now)
    if all(previous.get(k) == v for k, v in status.items() if k != "occupiedBy" or v):
        return None
    phase = str(status["phase"])
    before = str(previous.get("phase") or "")
    reason = phase if phase != before else "Counted"
    message = (f"PodGroup {key}: phase {phase} ({status['running']} running, {status['succeeded']} succeeded, "
               f"{status['failed']} failed of minMember {group.min_member})"
               + (f"; refused: {group.refusal}" if group.refusal else ""))
    if not status.get("occupiedBy"):
        status.pop("occupiedBy", None)
    return StatusChange(status=status, reason=reason, message=message, final=phase in FINAL_PHASES)
