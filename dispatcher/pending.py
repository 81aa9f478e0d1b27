"""The dispatcher's book of pending pods: which pods are pending, which worker holds each (the dispatched map),
which need sending (new, ungated, or acknowledged while still pending), which changed since they were sent, and
which left the pending set while a worker held them. Pure: no I/O, times are passed in; dispatcher/core.py writes
Redis from it.

Invariants:
- A pod in `dispatched` is not sent again until it leaves it: reclaimed from a dead worker, forgotten because the
  map names no live worker or the pod has not been pending for a while, or acknowledged by its worker while still
  pending (then it waits `handback_delay` first).
- `attempts` counts how often a pod was taken back or handed back; its work items carry the count.
- A dispatched pod is sent again, behind its old version, only when its digest changed (`hoss.model.compact`): a
  write to its status alone makes no new version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping

from dispatcher.intake import PendingPod, dispatch_order, with_devices, with_namespaces, with_storage
from dispatcher.loads import Assignments
from hoss.model.resourceclaims import DeviceCatalog
from hoss.model.storage import StorageCatalog
from hoss.queue import BOUND_PREFIX

HANDBACK_BACKOFF_MAX_SECONDS = 300.0
PLACED_PATIENCE = 10
"""A pod its worker bound but our watch still shows pending is sent again after this many informer lags."""


def handback_delay(handbacks: int, *, lag_seconds: float) -> float:
    """How long a pod its worker acknowledged while it still looks pending waits before it is sent again."""
    if handbacks <= 0:
        return 0.0
    return float(min(lag_seconds * 2 ** (handbacks - 1), HANDBACK_BACKOFF_MAX_SECONDS))


class PendingBook:
    """The pending pods and what was done with each; see the module docstring."""

    def __init__(self) -> None:
        self.pods: dict[str, PendingPod] = {}
        """The pending pods by uid."""
        self.dispatched = Assignments()
        """pod uid -> worker id, this replica's copy of the Redis map."""
        self.fresh: dict[str, None] = {}
        """uids that became pending (or sendable) since the last dispatch, in arrival order."""
        self.changed: dict[str, None] = {}
        """Dispatched uids whose compact form changed since it was sent."""
        self.gone: set[str] = set()
        """Dispatched uids whose pods left the pending set, to forget in Redis."""
        self.absent_since: dict[str, float] = {}
        """Dispatched uids not seen pending, since when."""
        self.placed_since: dict[str, float] = {}
        """uids bound by a worker but still pending here, since when."""
        self.handed_back: dict[str, tuple[float, int]] = {}
        """uid -> (when, how many times) acknowledged by its worker while still pending."""
        self.attempts: dict[str, int] = {}

    # -- the pending set ------------------------------------------------------------------------------------

    def observe(self, pod: PendingPod) -> tuple[bool, bool]:
        """Apply a pending pod's current state. Returns whether the pod is new to the pending set, and whether a
        dispatch is due (it needs a worker now, or its worker must get its new version)."""
        uid = pod.uid
        known = self.pods.get(uid)
        if known is None:
            self.pods[uid] = pod
            self.absent_since.pop(uid, None)
            if uid in self.dispatched:
                return True, False
            self.fresh[uid] = None
            return True, True
        # The pod is queued from when it was first seen without gates (kube-scheduler's end-to-end duration starts
        # when a pod enters its active queue, past its gates).
        ungated = known.gated and not pod.gated
        updated = dataclasses.replace(pod, seen_at=known.seen_at,
                                      queued_unix=pod.queued_unix if ungated else known.queued_unix)
        if updated == known:
            return False, False
        self.pods[uid] = updated  # labels, annotations or the PodScheduled condition changed
        due = False
        if known.gated and not updated.gated and uid not in self.dispatched:
            self.fresh[uid] = None  # its last scheduling gate was removed: dispatch it now
            due = True
        if updated.digest != known.digest and uid in self.dispatched:
            # The worker holds an older version: send the new one behind it. A change the digest does not see (a
            # status write, as the worker's own PodScheduled=False; `hoss.model.compact`) sends nothing: the form
            # kept here carries the new resourceVersion to later sends, and the worker's binding finds it itself.
            self.changed[uid] = None
            due = True
        elif updated.digest != known.digest and not updated.gated and uid in self.handed_back:
            # Handed back as unschedulable, and changed since (a label, the claims its ResourceClaimTemplates
            # made): tried again now rather than after its back-off, as kube-scheduler moves an updated pod out
            # of its unschedulable queue.
            self.handed_back.pop(uid, None)
            self.fresh[uid] = None
            due = True
        return False, due

    def drop(self, uid: str) -> tuple[PendingPod | None, bool]:
        """The pod left the pending set (bound, deleted or finished). Returns it (None when it was not pending),
        and whether a worker had it (dispatched, or acknowledged while still pending): then, unless deleted, it
        left bound."""
        left = self.pods.pop(uid, None)
        self.fresh.pop(uid, None)
        self.changed.pop(uid, None)
        self.attempts.pop(uid, None)
        handed_back = self.handed_back.pop(uid, None)
        was_dispatched = self.dispatched.pop(uid, None) is not None
        if was_dispatched:
            self.gone.add(uid)
        return left, was_dispatched or handed_back is not None

    def relabel(self, name: str | None, namespaces: Mapping[str, Mapping[str, str]]) -> bool:
        """Namespace labels changed (of `name`, or of any): recompute the compact forms that read them (pods of
        that namespace, pods with namespaceSelectors); those dispatched are to be resent, the others dispatched
        now, as their inter-pod terms may now hold elsewhere. True when any changed."""
        return self._recompute(
            lambda pod: name is None or pod.namespace == name or '"selected"' in pod.compact,
            lambda pod: with_namespaces(pod, namespaces))

    def storage_changed(self, storage: StorageCatalog, *, touches: Callable[[PendingPod], bool] | None = None) -> bool:
        """Storage objects changed: recompute what the claims of the pods with volumes need (of those `touches`
        says the change may concern; all without it); those dispatched are to be resent, the others dispatched
        now (a claim bound, a PV freed may let them go). True when any changed."""
        return self._recompute(
            lambda pod: '"volumes"' in pod.compact and (touches is None or touches(pod)),
            lambda pod: with_storage(pod, storage))

    def devices_changed(self, devices: DeviceCatalog) -> bool:
        """ResourceClaims, ResourceSlices or DeviceClasses changed: recompute what the ResourceClaims of the pods
        with any need, and of those asking an extended resource a DeviceClass serves (or served); those dispatched
        are to be resent, the others dispatched now (a claim made or freed, a device published may let them go).
        True when any changed."""
        quoted = [f'"{name}"' for name in devices.extended_names()]

        def concerned(pod: PendingPod) -> bool:
            return '"resourceClaims"' in pod.compact or '"extended"' in pod.compact \
                or any(name in pod.compact for name in quoted)

        return self._recompute(concerned, lambda pod: with_devices(pod, devices))

    def _recompute(self, concerned: Callable[[PendingPod], bool],
                   recompute: Callable[[PendingPod], PendingPod]) -> bool:
        """Recompute the `concerned` pending pods' forms; a changed one is resent when dispatched, else dispatched
        now (unless gated). True when any changed."""
        due = False
        for uid, pod in list(self.pods.items()):
            if not concerned(pod):
                continue
            updated = recompute(pod)
            if updated is pod:
                continue
            self.pods[uid] = updated
            if uid in self.dispatched:
                self.changed[uid] = None
            elif not updated.gated:
                self.handed_back.pop(uid, None)
                self.fresh[uid] = None
            due = True
        return due

    def look_again(self, uids: Iterable[str]) -> bool:
        """Send these pending pods in the next burst, if none holds them (e.g. a dependency changed). True when
        any is to be sent."""
        due = False
        for uid in uids:
            if uid in self.pods and uid not in self.dispatched:
                self.fresh[uid] = None
                due = True
        return due

    def resend(self, uids: Iterable[str]) -> bool:
        """Send the new version of these dispatched pods behind the old one. True when any is to be sent."""
        due = False
        for uid in uids:
            if uid in self.dispatched:
                self.changed[uid] = None
                due = True
        return due

    # -- what to send ---------------------------------------------------------------------------------------

    def undispatched(self, dispatched: Mapping[str, str] | None = None) -> int:
        """Pending pods no worker holds (``dispatched``: Redis's map, else this book's copy)."""
        assigned = self.dispatched if dispatched is None else dispatched
        return sum(1 for uid in self.pods if uid not in assigned)

    def needs_worker(self, uid: str, *, now: float, lag_seconds: float) -> bool:
        if uid not in self.pods or uid in self.dispatched or self.pods[uid].gated:
            return False
        handed_back = self.handed_back.get(uid)
        if handed_back is None:
            return True
        when, count = handed_back
        return now - when >= handback_delay(count, lag_seconds=lag_seconds)

    def to_send(self, *, fresh_only: bool, now: float, lag_seconds: float) -> list[PendingPod]:
        """The pending pods that need a worker (only those new since the last call, with ``fresh_only``), in
        dispatch order."""
        candidates = list(self.fresh) if fresh_only else list(self.pods)
        self.fresh.clear()
        pods = [self.pods[uid] for uid in candidates if self.needs_worker(uid, now=now, lag_seconds=lag_seconds)]
        return sorted(pods, key=dispatch_order)

    def take_changed(self) -> list[str]:
        """The dispatched uids whose new version is to be sent, in the order they changed; the list starts over."""
        changed, self.changed = self.changed, {}
        return list(changed)

    def reclaimed(self, uids: Iterable[str]) -> None:
        """Taken back from a dead worker: nobody holds them, and each counts one more attempt."""
        for uid in uids:
            self.dispatched.pop(uid, None)
            self.attempts[uid] = self.attempts.get(uid, 0) + 1

    # -- the dispatched map against Redis's -----------------------------------------------------------------

    def forget_gone(self, uids: Collection[str]) -> None:
        """Redis forgot these uids whose pods left the pending set."""
        self.gone.difference_update(uids)
        for uid in uids:
            self.dispatched.pop(uid, None)

    def acknowledged(self, current: Mapping[str, str], *, now: float) -> None:
        """Count the uids this book had dispatched that Redis's map (``current``) no longer holds while they are
        still pending: their worker acknowledged them, bound just now (our watch lags) or handed back."""
        for uid in self.dispatched:
            if uid not in current and uid in self.pods:
                _when, count = self.handed_back.get(uid, (now, 0))
                self.handed_back[uid] = (now, count + 1)
                self.attempts[uid] = self.attempts.get(uid, 0) + 1

    def stale_entries(
        self, current: Mapping[str, str], *, live: Collection[str], now: float, lag_seconds: float
    ) -> tuple[list[str], int]:
        """The entries of Redis's map (``current``) the leader forgets: those naming no live worker, and those
        whose pod has not been pending for ``lag_seconds`` (the second number counts these)."""
        # Pods a worker bound stay in the map until our watch sees them bound (it may lag under load): never
        # sent again meanwhile. One still pending long after that is forgotten, and so sent again (the ledger
        # then answers that it is bound, if it is).
        placed = {uid for uid, owner in current.items() if owner.startswith(BOUND_PREFIX)}
        self.placed_since = {uid: self.placed_since.get(uid, now) for uid in placed if uid in self.pods}
        overdue = [uid for uid, since in self.placed_since.items() if now - since >= PLACED_PATIENCE * lag_seconds]
        forget = [uid for uid, owner in current.items() if owner not in live and uid not in placed] + overdue
        absent = [uid for uid in current if uid not in self.pods and (current[uid] in live or uid in placed)]
        self.absent_since = {uid: self.absent_since.get(uid, now) for uid in absent}
        stale = [uid for uid, since in self.absent_since.items() if now - since >= lag_seconds]
        return forget + stale, len(stale)

    def forgotten(self, uids: Iterable[str], current: dict[str, str]) -> None:
        """Redis forgot these entries: drop them from ``current`` (Redis's map as read) and from the absences."""
        for uid in uids:
            current.pop(uid, None)
            self.absent_since.pop(uid, None)
