"""The worker's heartbeat: it tells the dispatcher the worker is alive, how fast it decides and whether it has
bindings to post, and brings back its share of the bindings budget (`workers.bindlimit`).

A beat goes every ``heartbeat_interval_seconds``, and at once after the worker's first batch, so the dispatcher
learns this worker's rate within a batch instead of a beat (until then it counts every pod sent as waiting, and
a burst at start-up would spill onto other workers for nothing). A beat that finds the worker's key gone, or a gap
longer than the key's TTL, makes the worker suspect it was declared dead (`overdue`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from hoss.errors import LedgerUnavailable
from hoss.queue import WorkerInfo, WorkQueue
from workers import bindlimit
from workers.bindlimit import BindLimit
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)


def next_rate(rate: float, *, pods: int, seconds: float) -> float:
    """The decide rate after `pods` more were decided in `seconds` of deciding: the new sample averaged with
    `rate` (the sample alone when there was none); `rate` unchanged when nothing was decided."""
    if seconds <= 0 or pods <= 0:
        return rate
    sample = pods / seconds
    return sample if not rate else 0.5 * (rate + sample)


class Pace:
    """How much this worker decided, and how fast."""

    def __init__(self) -> None:
        self.progress = 0
        """Batches decided: the heartbeat carries it so the dispatcher sees a worker whose scheduling is stuck
        (reading alone is no progress: a reader whose decisions hang would otherwise look well)."""
        self.decided = 0
        """Pods taken from the ready queue and decided (placed, found unschedulable or malformed)."""
        self.deciding_seconds = 0.0
        """Wall time spent deciding them (in ``Worker.schedule``, reserve round trips included)."""
        self.rate = 0.0
        """Pods decided per second of deciding over the last beats that decided any: how fast this worker works
        off its ready queue (heartbeat; the dispatcher's routing uses it, dispatcher/routing.py)."""
        self._mark = (0.0, 0)

    def batch(self, pods: int) -> None:
        """A batch of `pods` is taken to be decided."""
        self.progress += 1
        self.decided += pods

    def spent(self, seconds: float) -> None:
        self.deciding_seconds += seconds

    def update(self) -> None:
        """Fold what was decided since the last update into the rate."""
        (busy, decided), self._mark = self._mark, (self.deciding_seconds, self.decided)
        self.rate = next_rate(self.rate, pods=self.decided - decided, seconds=self.deciding_seconds - busy)


class Heartbeat:
    """Sends the beats of one worker; `info` says what they carry."""

    def __init__(self, queue: WorkQueue, settings: WorkerSettings, *, binds: BindLimit, pace: Pace,
                 info: Callable[[], WorkerInfo]) -> None:
        self.queue = queue
        self.settings = settings
        self.binds = binds
        self.pace = pace
        self.info = info
        self._last_beat = time.monotonic()
        self.last_beat_unix = 0.0
        """When a beat last reached Redis (Unix time; 0 before the first), for /metrics."""
        self._suspect = False
        """A beat found our heartbeat gone: we may have been declared dead."""
        self._now = asyncio.Event()

    def soon(self) -> None:
        """Beat now rather than at the end of the interval (also ends the wait on stopping)."""
        self._now.set()

    def overdue(self) -> bool:
        """Whether the worker may have been declared dead: a beat found its key gone, or no beat went for longer
        than the key lives (the process was paused or starved)."""
        return self._suspect or time.monotonic() - self._last_beat > self.settings.heartbeat_ttl_seconds

    def checked(self) -> None:
        """The worker's queue was found present (or found gone and handled): no longer suspect."""
        self._suspect = False
        self._last_beat = time.monotonic()

    async def once(self) -> None:
        """One beat now, outside the loop (on registering: the dispatcher routes work here again at once)."""
        await self.queue.heartbeat(self.info(), ttl_seconds=self.settings.heartbeat_ttl_seconds)

    async def beat(self, stopping: asyncio.Event) -> None:
        """Until `stopping`: beat every interval, and when asked to beat `soon`."""
        outage = False
        while not stopping.is_set():
            self.pace.update()
            try:
                if not await self.queue.heartbeat(self.info(), ttl_seconds=self.settings.heartbeat_ttl_seconds,
                                                  binding=self.binds.demand > 0):
                    self._suspect = True
                self.binds.resize(bindlimit.share(self.settings.binds_in_flight_budget,
                                                  self.queue.binding_workers, self.settings.max_binds_in_flight))
                self._last_beat = time.monotonic()
                self.last_beat_unix = time.time()
            except LedgerUnavailable as error:
                if not outage:
                    log.warning("cannot send heartbeat (retrying every beat until Redis answers): %s", error)
                outage = True
            else:
                outage = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.heartbeat_interval_seconds):
                    await self._now.wait()  # set early by the first batch, and by stopping
            self._now.clear()
