"""The work a worker holds and has not placed yet: the ready queue, decided in order, and the retries, each due at
the end of its backoff (sooner when the cluster gains room).

Invariant: a work item is in at most one of the two; an item being decided or bound is in neither.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import random
import time
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


def backoff_delay(previous: float, *, initial: float, maximum: float) -> float:
    """The next backoff after `previous` (0 for a first failure): doubled, within [initial, maximum]."""
    return min(max(previous * 2, initial), maximum)


@dataclass(order=True)
class _Retry:
    due: float
    work: Work = field(compare=False)


class Backlog:
    """The ready queue and the retries of one worker; ``jitter`` spreads the retries' due times (±20 %)."""

    def __init__(self, *, backoff_initial: float, backoff_max: float, jitter: random.Random) -> None:
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.jitter = jitter
        self.ready: collections.deque[Work] = collections.deque()
        self.retries: list[_Retry] = []
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
        self.ready.append(work)
        self._ready_event.set()

    def take(self, most: int) -> list[Work]:
        """Up to `most` ready items, in order."""
        return [self.ready.popleft() for _ in range(min(len(self.ready), most))]

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
        heapq.heappush(self.retries, _Retry(time.monotonic() + delay, work))
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
                self.push(heapq.heappop(self.retries).work)
            self._retry_added.clear()
            await nap(self._retry_added, at_most=self.retries[0].due - now if self.retries else None)
