"""The work a worker holds and has not placed yet: the ready queue, decided in order, and the retries, each due at
the end of its backoff (sooner when the cluster gains room).

Invariants: a work item is in at most one of the two; an item being decided or bound is in neither. The worker holds
at most one item per pod (``held``): when the dispatcher queues a changed pod's new version behind the old one, the
newer version (the later stream entry) takes the place of the older one held, which goes to ``superseded`` to be
acknowledged as stale. As kube-scheduler's queue updates a queued pod in place (PriorityQueue.Update: in the active
or backoff queue where it stands; from the unschedulable pods to the backoff queue while it still backs off), the
newer version keeps the older's place: ready, or waiting until the same due time; and the backoff and the attempts
are the pod's (by uid), so an update neither resets nor doubles its retries. An older version that was being decided
and comes back to be tried again gives the newer one its place: the pod waits as that attempt's outcome says, in its
newest version (kube-scheduler requeues a pod rejected in flight as its informer has it now).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.idle import nap
from workers.intake import Work

SOON_SECONDS = 0.2
"""When a pod that lost a race (a conflict, a ledger not ready) is tried again: no backoff, the truth is moments
away."""
ROOM_FREED_SECONDS = 0.05
"""How soon waiting pods are tried again once the cluster gained room (or the policies changed)."""
CONFLICT_ROUNDS = 3
"""Batches in a row a pod may lose to conflicts before it backs off like an unschedulable pod."""


def stream_order(message_id: str) -> tuple[int, ...]:
    """A stream entry id ('<milliseconds>-<sequence>') as numbers: a later entry of a stream compares greater."""
    return tuple(int(part) for part in message_id.split("-"))


def backoff_delay(previous: float, *, initial: float, maximum: float) -> float:
    """The next backoff after `previous` (0 for a first failure): doubled, within [initial, maximum]."""
    return min(max(previous * 2, initial), maximum)


@dataclass(order=True)
class _Retry:
    due: float
    work: Work = field(compare=False)


def _keep(_work: Work) -> None:
    """No acknowledgement for a superseded item (a backlog of its own, in tests)."""


class Backlog:
    """The ready queue and the retries of one worker; ``jitter`` spreads the retries' due times (±20 %);
    ``superseded`` takes each item a newer version of its pod replaced (see the module docstring)."""

    def __init__(self, *, backoff_initial: float, backoff_max: float, jitter: random.Random,
                 superseded: Callable[[Work], None] = _keep) -> None:
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.jitter = jitter
        self.superseded = superseded
        self.ready: collections.deque[Work] = collections.deque()
        self.retries: list[_Retry] = []
        self.held: dict[str, Work] = {}
        """work item uid -> the one item held for it, ready or waiting for its retry"""
        self.backoff: dict[str, float] = {}
        """work item uid -> its last backoff, until it is placed"""
        self.conflict_rounds: dict[str, int] = {}
        """pod uid -> batches in a row it lost to conflicts"""
        self._ready_event = asyncio.Event()
        self._retry_added = asyncio.Event()

    @property
    def depth(self) -> int:
        """Work items waiting, ready or for their retry."""
        return len(self.ready) + len(self.retries)

    def __bool__(self) -> bool:
        return bool(self.ready or self.retries)

    def push(self, work: Work) -> None:
        """Add an item to the ready queue: one read from the stream, or one to decide again at once. With another
        version of its pod held, the newer one is kept (see the module docstring)."""
        kept = self._one_per_pod(work)
        if kept is not None:
            self._append(kept)

    def _append(self, work: Work) -> None:
        self.ready.append(work)
        self.held[work.item.uid] = work
        self._ready_event.set()

    def take(self, most: int) -> list[Work]:
        """Up to `most` ready items, in order."""
        taken = [self.ready.popleft() for _ in range(min(len(self.ready), most))]
        for work in taken:
            if self.held.get(work.item.uid) is work:
                del self.held[work.item.uid]
        return taken

    def holds(self, uid: str) -> bool:
        """Whether an item of pod (or gang) `uid` is ready or waiting for its retry."""
        return uid in self.held

    def _one_per_pod(self, work: Work) -> Work | None:
        """`work` is added while another version of its pod may be held. The older of the two is superseded. A
        newer `work` (read from the stream) takes the held one's place: None, it is placed. An older `work` (a
        version that was being decided comes back) gives its place to the held one: that one, taken from where it
        was, is returned for the caller to put where `work` was going."""
        held = self.held.get(work.item.uid)
        if held is None or held is work:
            return work
        if stream_order(work.message_id) > stream_order(held.message_id):
            self._replace(held, work)
            self.superseded(held)
            return None
        self._remove(held)
        self.superseded(work)
        return held

    def _replace(self, old: Work, new: Work) -> None:
        """Put `new` where `old` is (ready, or waiting for the same due time)."""
        self.held[new.item.uid] = new
        for index, queued in enumerate(self.ready):
            if queued is old:
                self.ready[index] = new
                return
        for retry in self.retries:
            if retry.work is old:
                retry.work = new
                return

    def _remove(self, old: Work) -> None:
        """Take `old` from where it is (ready, or waiting for its retry)."""
        del self.held[old.item.uid]
        for index, queued in enumerate(self.ready):
            if queued is old:
                del self.ready[index]
                return
        self.retries = [retry for retry in self.retries if retry.work is not old]
        heapq.heapify(self.retries)

    async def wait_ready(self) -> None:
        """Until an item is pushed (or the safety timeout passed, or `wake` was called)."""
        self._ready_event.clear()
        await nap(self._ready_event)

    def retry(self, work: Work, *, soon: bool = False) -> None:
        """Try the item again after its backoff, doubled each time; `soon`: shortly, without backing off."""
        uid = work.item.uid
        if soon:
            delay = SOON_SECONDS
        else:
            delay = self.backoff[uid] = backoff_delay(self.backoff.get(uid, 0.0), initial=self.backoff_initial,
                                                      maximum=self.backoff_max)
        delay *= 0.8 + 0.4 * self.jitter.random()
        kept = self._one_per_pod(work)
        if kept is None:
            return
        heapq.heappush(self.retries, _Retry(time.monotonic() + delay, kept))
        self.held[uid] = kept
        self._retry_added.set()

    def placed(self, uid: str) -> None:
        """The item is placed: its next failure starts a fresh backoff."""
        self.backoff.pop(uid, None)

    def lost_conflict(self, uid: str) -> bool:
        """Count a conflict for pod `uid`; True while it may go straight back to the ready queue, False (its rounds
        forgotten) once it should back off."""
        rounds = self.conflict_rounds.get(uid, 0) + 1
        if rounds < CONFLICT_ROUNDS:
            self.conflict_rounds[uid] = rounds
            return True
        self.conflict_rounds.pop(uid, None)
        return False

    def forget_conflicts(self, uid: str) -> None:
        self.conflict_rounds.pop(uid, None)

    def retry_waiting_soon(self) -> None:
        """Something that may let waiting pods fit changed (the cluster gained room, the policies were reloaded):
        retry them now rather than at the end of their backoff."""
        now = time.monotonic()
        self.retries = [_Retry(min(r.due, now + ROOM_FREED_SECONDS), r.work) for r in self.retries]
        heapq.heapify(self.retries)
        self._retry_added.set()

    def clear(self) -> int:
        """Drop every item held; how many there were."""
        dropped = self.depth
        self.ready.clear()
        self.retries.clear()
        self.held.clear()
        return dropped

    def wake(self) -> None:
        """End the waits of `wait_ready` and `move_due` now (on stopping)."""
        self._ready_event.set()
        self._retry_added.set()

    async def move_due(self, stopping: asyncio.Event) -> None:
        """Until `stopping`: move retries that are due to the ready queue; sleep until the next is due (or a retry
        is added)."""
        while not stopping.is_set():
            now = time.monotonic()
            while self.retries and self.retries[0].due <= now:
                self._append(heapq.heappop(self.retries).work)
            self._retry_added.clear()
            await nap(self._retry_added, at_most=self.retries[0].due - now if self.retries else None)
