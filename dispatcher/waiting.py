"""Pods the dispatcher holds back, and why: no live worker serves their policy, their gang is not complete, or
their ``hoss.io/depends-on`` dependencies do not allow them yet. Pure.

`Waitlist` keeps, per pod uid, the reason and message of the pod's notice and when it was last given, so a notice
(dispatcher/notices.py) repeats at most once per interval, and at once when the reason changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dispatcher.intake import PendingPod
from dispatcher.status import WaitingPod
from hoss.model import reservations

NO_WORKER_REASON = "NoWorkerForPolicy"


def no_worker_message(policy: str, *, what: str = "pod") -> str:
    return f"no live hoss worker serves policy {policy!r}; the {what} waits until one does"


def waits_for(pod: PendingPod) -> str:
    """What waits: a pod, or the Reservation a pending 'pod' stands for (`reservations.as_pod`)."""
    return "Reservation" if reservations.ANNOTATION in pod.annotations else "pod"


@dataclass
class Waiting:
    """A pending pod that no live worker serves."""

    pod: str
    policy: str
    since_unix: float
    notified_at: float | None = None
    """Monotonic time of the last notice."""
    reason: str = NO_WORKER_REASON
    message: str = ""
    """What the notice says; empty means the no-worker message for ``policy``."""


class Waitlist(dict[str, Waiting]):
    """The waiting pods by uid."""

    def hold(self, pod: PendingPod, *, reason: str, message: str, now_unix: float) -> bool:
        """Record that `pod` waits, for `reason`; True when it did not wait before. A changed reason or message is
        told at once."""
        waiting = self.get(pod.uid)
        if waiting is None:
            self[pod.uid] = Waiting(pod=pod.key, policy=pod.policy, since_unix=now_unix, reason=reason,
                                    message=message)
            return True
        if (waiting.reason, waiting.message) != (reason, message):
            waiting.notified_at = None  # the reason changed: say so at once
        waiting.policy, waiting.reason, waiting.message = pod.policy, reason, message
        return False

    def due(self, pending: Mapping[str, PendingPod], *, now: float, interval: float) -> list[PendingPod]:
        """The pending pods whose notice is due (never given, or given ``interval`` ago or more), marked as told
        at monotonic time ``now``."""
        due = [
            (pending[uid], waiting)
            for uid, waiting in self.items()
            if uid in pending
            and (waiting.notified_at is None or now - waiting.notified_at >= interval)
        ]
        for _pod, waiting in due:
            waiting.notified_at = now
        return [pod for pod, _waiting in due]

    def notice(self, pod: PendingPod) -> tuple[str, str]:
        """The reason and message to tell the owner of `pod`."""
        note = self.get(pod.uid)
        reason = note.reason if note else NO_WORKER_REASON
        message = note.message if note and note.message else no_worker_message(pod.policy, what=waits_for(pod))
        return reason, message

    def reasons(self) -> dict[str, tuple[str, str]]:
        """(reason, message) by uid, as /status's pending pods show them."""
        return {uid: (w.reason, w.message or no_worker_message(w.policy)) for uid, w in self.items()}

    def rows(self) -> list[WaitingPod]:
        """The waiting pods, oldest first, as /status's queues show them."""
        return sorted(
            (WaitingPod(pod=w.pod, policy=w.policy, since=round(w.since_unix, 3)) for w in self.values()),
            key=lambda row: (row.since, row.pod),
        )
