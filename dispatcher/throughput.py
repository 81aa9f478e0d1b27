"""The dispatcher's throughput counters: pods dispatched and bound, the bound rate over a sliding minute and its
recent history, as /status shows them (``throughput``)."""

from __future__ import annotations

import collections
import time

from dispatcher.status import HISTORY_INTERVAL_SECONDS, ThroughputSample, ThroughputStatus

RATE_WINDOW_SECONDS = 60.0
HISTORY_SECONDS = 600.0
"""How far back ``throughput.history`` reaches."""


class BoundRate:
    """Counts dispatched and bound pods, the bound rate over a sliding minute, and its recent history.

    Times are monotonic (the dispatcher's clock); `view` converts the history to unix time. The history is a ring
    of per-interval counts (intervals aligned on the clock, only those with binds stored), so it costs nothing
    between binds and needs no sampling task.
    """

    def __init__(
        self,
        *,
        window_seconds: float = RATE_WINDOW_SECONDS,
        history_seconds: float = HISTORY_SECONDS,
        interval_seconds: float = HISTORY_INTERVAL_SECONDS,
    ) -> None:
        self.window_seconds = window_seconds
        self.interval_seconds = interval_seconds
        self.dispatched_total = 0
        self.bound_total = 0
        self._bound_at: collections.deque[float] = collections.deque()
        self._intervals = max(1, round(history_seconds / interval_seconds))
        # [interval index, pods bound in it], oldest first; one more than shown, for the interval still running.
        self._counts: collections.deque[list[int]] = collections.deque(maxlen=self._intervals + 1)
        self._first_interval: int | None = None

    def dispatched(self, count: int = 1) -> None:
        self.dispatched_total += count

    def bound(self, now: float) -> None:
        self.bound_total += 1
        self._bound_at.append(now)
        self._prune(now)
        index = self._interval(now)
        if self._counts and self._counts[-1][0] == index:
            self._counts[-1][1] += 1
        else:
            self._counts.append([index, 1])

    def per_second(self, now: float) -> float:
        self._prune(now)
        return len(self._bound_at) / self.window_seconds

    def history(self, now: float, *, now_unix: float) -> list[ThroughputSample]:
        """Bound per second in every finished interval of the history window since the first call or bind."""
        current = self._interval(now)
        started = current if self._first_interval is None else self._first_interval
        first = max(current - self._intervals, started)
        counts = {index: count for index, count in self._counts}
        return [
            ThroughputSample(
                at=round(now_unix - (now - (index + 1) * self.interval_seconds), 3),
                bound_per_second=round(counts.get(index, 0) / self.interval_seconds, 3),
            )
            for index in range(first, current)
        ]

    def view(self, now: float, *, now_unix: float | None = None) -> ThroughputStatus:
        """The counters and rates at monotonic time `now` (``now_unix``, the wall clock then, defaults to it)."""
        return ThroughputStatus(
            bound_per_second_1m=round(self.per_second(now), 3),
            dispatched_total=self.dispatched_total,
            bound_total=self.bound_total,
            history_interval_seconds=self.interval_seconds,
            history=self.history(now, now_unix=time.time() if now_unix is None else now_unix),
        )

    def _interval(self, now: float) -> int:
        index = int(now // self.interval_seconds)
        if self._first_interval is None or index < self._first_interval:
            self._first_interval = index
        return index

    def _prune(self, now: float) -> None:
        while self._bound_at and self._bound_at[0] <= now - self.window_seconds:
            self._bound_at.popleft()
