"""What the leader remembers of gangs between rounds, and how a round sends them. Pure: times are passed in.

A gang (dispatcher/gangs.py) goes out whole, as one work item, once min-available of its members are pending or
bound; until then its members wait, with the reason (and, past the PodGroup's scheduleTimeoutSeconds, a timeout).

Members already bound count toward a gang's min-available (scheduler-plugins' Coscheduling). The pending watch
never sees bound pods, so the leader counts them by listing the gang's members by label, only for gangs that
changed (a member appeared or left the pending set: `GangBook.dirty`), every few seconds
(`Dispatcher.refresh_gangs`): one apiserver list, served from its watch cache, per active gang, off the dispatch
path. The same list gives the PodGroup's status (scheduled, running). The alternatives cost more or know less: the
ledger's entries carry no labels, and a counter kept by the workers misses members that another scheduler bound
or that were deleted since.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from dispatcher.gangs import (
    PLUGINS_API,
    PODGROUP_LABEL,
    GangCounts,
    GangKey,
    PodGroupSpec,
    decoded_members,
    gang_of,
    gang_state,
    member_selector,
    short_of_min_resources,
    task_of,
)
from dispatcher.intake import PendingPod
from dispatcher.podgroup_status import FINAL_PHASES, StatusChange, status_change
from hoss.model.objects import Json
from hoss.queue import GangMember, WorkItem

GANG_WAITING_REASON = "GangIncomplete"
GANG_TIMEOUT_REASON = "GangTimeout"
GANG_REFUSED_REASON = "PodGroupRefused"
GANG_QUIET_ROUNDS = 5
"""A gang with no PodGroup object and no pending member is counted until its counts stood still this many rounds
(members start); a gang with a PodGroup is counted, every `RECOUNT_SECONDS`, until its phase is final."""
RECOUNT_SECONDS = 5.0


def gang_key(pod: PendingPod) -> GangKey | None:
    """The gang of a pending pod, if it belongs to one."""
    return gang_of(pod.namespace, pod.labels, pod.annotations, scheduling_group=pod.scheduling_group)


@dataclass
class GangPlan:
    """How a round sends a batch of pods: the pods that go out singly, one item per gang that is ready, and the
    members that wait, each with its reason and message."""

    singles: list[PendingPod]
    items: list[WorkItem] = field(default_factory=list)
    waits: list[tuple[PendingPod, str, str]] = field(default_factory=list)


class GangBook:
    """Per gang: its members' counts, when it last changed, the label selector of its members, how many counts
    in a row stood still, the PodGroup status last written, and since when it waits."""

    def __init__(self) -> None:
        self.counts: dict[GangKey, tuple[float, GangCounts]] = {}
        """Bound and running members by gang, with the time they were counted."""
        self.dirty: dict[GangKey, float] = {}
        """Gangs to count again, with when they last changed."""
        self.selectors: dict[GangKey, str] = {}
        self.quiet: dict[GangKey, int] = {}
        self.podgroup_status: dict[GangKey, Json] = {}
        self.since: dict[GangKey, float] = {}

    def changed(self, pod: PendingPod, *, now: float) -> None:
        """A member of a gang appeared or left the pending set: count the gang's members again."""
        if not (pod.labels or pod.annotations or pod.scheduling_group):
            return
        key = gang_key(pod)
        if key is None:
            return
        self.dirty[key] = now
        self.quiet.pop(key, None)
        self.selectors[key] = member_selector(pod.labels, pod.annotations)

    def due(self, podgroups: Mapping[GangKey, PodGroupSpec], *, now: float) -> list[GangKey]:
        """The gangs to count now: those that changed, and those with a PodGroup not in a final phase whose count
        is `RECOUNT_SECONDS` old (their members start, run and finish without passing through the pending set)."""
        due = set(self.dirty)
        for key, group in podgroups.items():
            phase = str(self.podgroup_status.get(key, group.status).get("phase") or "")
            if phase in FINAL_PHASES:
                continue
            counted = self.counts.get(key)
            if counted is None or now - counted[0] >= RECOUNT_SECONDS:
                due.add(key)
                if key.api == PLUGINS_API:
                    self.selectors.setdefault(key, f"{PODGROUP_LABEL}={key.name}")
        return sorted(due)

    def bound_tasks(self, key: GangKey) -> dict[str, int]:
        counted = self.counts.get(key)
        return dict(counted[1].tasks) if counted is not None else {}

    def bound_members(self, key: GangKey) -> int | None:
        """Members of the gang bound, when counted since the gang last changed (else None: not known yet)."""
        counted = self.counts.get(key)
        if counted is None or counted[0] < self.dirty.get(key, 0.0):
            return None
        return counted[1].bound

    def counted(self, key: GangKey, counts: GangCounts, *, at: float) -> bool:
        """Record the gang's counts as of ``at``; True when they changed (or are the first)."""
        previous = self.counts.get(key)
        self.counts[key] = (at, counts)
        return previous is None or previous[1] != counts

    def status_due(self, key: GangKey, group: PodGroupSpec, counts: GangCounts, *, now: str) -> StatusChange | None:
        """The PodGroup's status for these counts (dispatcher/podgroup_status.py), or None when written already."""
        previous = {**group.status, **self.podgroup_status.get(key, {})}
        return status_change(key, group, counts, previous, now=now)

    def status_written(self, key: GangKey, status: Json) -> None:
        self.podgroup_status[key] = {**self.podgroup_status.get(key, {}), **status}

    def settle(self, key: GangKey, *, changed: bool, pending: bool, tracked: bool = False) -> None:
        """After a count: it is no longer dirty; forget a gang with no pending member and no PodGroup to keep
        (``tracked``) whose counts stood still for a few rounds."""
        quiet = 0 if changed else self.quiet.get(key, 0) + 1
        self.quiet[key] = quiet
        if tracked:
            return
        if not pending and quiet >= GANG_QUIET_ROUNDS:
            self.forget(key)

    def forget(self, key: GangKey) -> None:
        """Drop what we keep about a gang that settled (a new member counts it again, within a refresh)."""
        for table in (self.dirty, self.quiet, self.counts, self.selectors, self.podgroup_status):
            table.pop(key, None)

    def prune(self, pending: Collection[GangKey], *, now: float, older_than: float) -> None:
        """Forget the gangs that changed ``older_than`` ago or more and have no pending member."""
        for key, since in list(self.dirty.items()):
            if key not in pending and now - since >= older_than:
                self.forget(key)

    def plan(
        self,
        pods: Sequence[PendingPod],
        *,
        pending: Mapping[str, PendingPod],
        dispatched: Mapping[str, str],
        podgroups: Mapping[GangKey, PodGroupSpec],
        attempts: Mapping[str, int],
        now: float,
    ) -> GangPlan:
        """Pods outside gangs, and one item per gang that has min-available members pending; the members of a
        gang that is not complete wait, with the reason on each of them."""
        plan = GangPlan(singles=[pod for pod in pods if gang_key(pod) is None])
        keys = sorted({key for pod in pods if (key := gang_key(pod)) is not None})
        for key in keys:
            members = sorted(
                (p for p in pending.values()
                 if gang_key(p) == key and p.uid not in dispatched and not p.gated),  # gated: not yet
                key=lambda p: p.name,
            )
            group = podgroups.get(key)
            if group is not None and not group.gang and not group.refusal:
                plan.singles += members  # a Kubernetes PodGroup with the basic policy: one by one
                continue
            bound = self.bound_members(key)
            state = gang_state(key, [m.labels for m in members], podgroups=podgroups, bound=bound or 0,
                               member_tasks=[task_of(m.annotations) for m in members],
                               bound_tasks=self.bound_tasks(key))
            if bound is not None and state.started:
                # The gang has started: extra and replacement members go out one by one, on the gang's policy.
                self.since.pop(key, None)
                plan.singles += members
                continue
            if not state.ready:
                if bound is None:
                    self.dirty.setdefault(key, now)  # count its bound members; that wakes the rounds
                since = self.since.setdefault(key, now)
                reason = GANG_REFUSED_REASON if state.refusal else GANG_WAITING_REASON
                message = state.waiting_message()
                if group is not None and group.timeout_seconds is not None and not state.refusal:
                    waited = now - since
                    if waited >= group.timeout_seconds:
                        reason = GANG_TIMEOUT_REASON
                        message = (f"gang {key} timed out: waited {waited:.0f}s (scheduleTimeoutSeconds "
                                   f"{group.timeout_seconds:.0f}); {message}")
                plan.waits += [(member, reason, message) for member in members]
                continue
            chosen, later = _minimum_first(members, group, bound_tasks=self.bound_tasks(key),
                                           needed=state.still_needed)
            forms = decoded_members([m.compact for m in chosen]) if not bound else None
            short = short_of_min_resources(group, forms) if forms is not None else ""
            if short:
                self.since.setdefault(key, now)
                plan.waits += [(member, GANG_REFUSED_REASON, f"gang {key}: {short}") for member in members]
                continue
            self.since.pop(key, None)
            plan.waits += [(member, GANG_WAITING_REASON,
                            f"gang {key}: the members its minTaskMember needs are placed first; this one follows "
                            f"once they are bound") for member in later]
            first = chosen[0]
            plan.items.append(WorkItem(
                uid=first.uid, namespace=first.namespace, name=first.name, policy=first.policy, gang=str(key),
                members=tuple(GangMember(uid=m.uid, namespace=m.namespace, name=m.name, pod=m.compact,
                                         digest=m.digest) for m in chosen),
                min_available=state.still_needed if not later else len(chosen), attempt=attempts.get(first.uid, 0),
                queued_unix=min(m.queued_unix for m in chosen),
                domain_key=group.domain_key if group is not None else "",
            ))
        return plan


def _minimum_first(members: Sequence[PendingPod], group: PodGroupSpec | None, *, bound_tasks: Mapping[str, int],
                   needed: int) -> tuple[list[PendingPod], list[PendingPod]]:
    """The members one gang item carries, and those that wait for it. Without Volcano's minTaskMember: all of them
    (the worker places min-available all-or-nothing and the rest as they fit). With it: each task's missing
    minimum, topped up to min-available, so that the all-or-nothing placement covers every task's minimum."""
    if group is None or not group.task_minimums:
        return list(members), []
    chosen: list[PendingPod] = []
    for task, need in group.task_minimums:
        missing = need - bound_tasks.get(task, 0)
        chosen += [m for m in members if task_of(m.annotations) == task][:max(0, missing)]
    rest = [m for m in members if m not in chosen]
    top_up = max(0, needed - len(chosen))
    chosen += rest[:top_up]
    return chosen, rest[top_up:]
