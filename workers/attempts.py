"""Scheduling attempts as kube-scheduler counts them, for a worker's metrics.

An attempt of a work item begins when the worker takes it from its ready queue to decide it (kube-scheduler pops
the pod from its active queue) and ends once: *scheduled* when its binding succeeded (or a Reservation's room was
kept), *unschedulable* when it fits nowhere (after any preemption it started), *error* when it goes back for
another reason (a lost ledger race, a refused binding, the ledger unavailable, a plugin that raised). A pod that
turned out gone or stale ends no attempt: kube-scheduler skips a deleted pod too. A gang's attempt counts once per
member it tried to place, as kube-scheduler tries each pod.

The end-to-end duration (scheduler_pod_scheduling_sli_duration_seconds) runs from the ``queued_unix`` its work item
carries (when the dispatcher first saw the pod pending without scheduling gates) to the successful binding; its
``attempts`` label counts this worker's attempts at the item.

Invariant: an item is tracked from its first attempt until it is acknowledged (`forget`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from workers.intake import Work
from workers.metrics import SCHEDULED, UNSCHEDULABLE, SchedulerMetrics


def pods_of(work: Work) -> int:
    """How many pods the item holds (a gang's members, else one)."""
    return len(work.item.members) or 1


class Attempts:
    """Per work item: when its current attempt began, how many it had, and how the last one ended."""

    def __init__(self, metrics: SchedulerMetrics, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.began: dict[str, float] = {}
        """item uid -> when its attempt under way began (``clock``)"""
        self.count: dict[str, int] = {}
        """item uid -> attempts begun"""
        self.last: dict[str, str] = {}
        """item uid -> how its last finished attempt ended"""

    def begin(self, batch: Iterable[Work]) -> None:
        """The batch is taken to be decided: an attempt of each item begins."""
        now = self.clock()
        for work in batch:
            uid = work.item.uid
            self.began[uid] = now
            self.count[uid] = self.count.get(uid, 0) + 1

    def end(self, work: Work, result: str, profile: str) -> None:
        """The item's attempt under way ended with `result` (nothing when none is under way)."""
        uid = work.item.uid
        began = self.began.pop(uid, None)
        if began is None:
            return
        self.last[uid] = result
        self.metrics.attempt(result, profile, self.clock() - began, pods=pods_of(work))
        if result == SCHEDULED:
            attempts = self.count.get(uid, 1)
            self.metrics.pod_attempts.observe(attempts)
            queued = work.item.queued_unix
            if queued > 0:  # 0: sent by a dispatcher that does not say when the pod was queued
                # Two machines' clocks: a skew never makes a negative duration.
                self.metrics.scheduled(attempts, max(self.wall() - queued, 0.0), pods=pods_of(work))

    def forget(self, uid: str) -> None:
        """The item is acknowledged: nothing more of it is tracked."""
        self.began.pop(uid, None)
        self.count.pop(uid, None)
        self.last.pop(uid, None)

    def queues(self, ready: Iterable[Work], waiting: Iterable[Work]) -> Mapping[str, int]:
        """Pods per kube-scheduler queue: `ready` ones are active; `waiting` ones (for a retry) are unschedulable
        when their last attempt found no node, else in backoff. The backlog holds one item per pod (a newer version
        takes the older's place, `workers.backlog`), so each item counts its pods."""
        counts = {"active": sum(pods_of(work) for work in ready), "backoff": 0, UNSCHEDULABLE: 0}
        for work in waiting:
            queue = UNSCHEDULABLE if self.last.get(work.item.uid) == UNSCHEDULABLE else "backoff"
            counts[queue] += pods_of(work)
        return counts
