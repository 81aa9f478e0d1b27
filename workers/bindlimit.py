"""How many bindings a worker posts at once: a share of one budget for all workers, resized as workers come and go.

Every binding the apiserver accepts is judged by the resolver's webhook, and the apiserver reaches the webhook over
HTTP/1.1 with at most 25 idle keep-alive connections per webhook host (client-go's transport). When more bindings
are in flight than that, the apiserver opens a new TLS connection for each extra one and closes it afterwards: a
full handshake on both sides for every such pod. Measured on the local plane with 2 workers and 1,500 pods: 64
bindings in flight per worker made the apiserver open 610 connections (0.41 per pod) and the resolver spend 1.70 ms
of CPU per pod; 16 per worker made 2 connections and 1.26 ms per pod.

So the workers share one budget (``binds_in_flight_budget``): each takes budget / the workers that have bindings to
post (waiting or in flight, itself counted even when it has none), at least ``MIN_SHARE`` and at most
``max_binds_in_flight``; that number comes with each heartbeat ({hoss}:binding, hoss/queue.py), so the share
follows demand within a beat. Splitting it by every registered worker instead starved the one worker the dispatcher
keeps busy (dispatcher/routing.py) at a quarter of the budget when four were registered. Bindings travel in 4 lanes
of their own webhook entries (hoss/model/admission.py), 25 idle connections each, so the default budget is 100: one
busy worker takes all 100, two take 50 each, eight 12 each, and the total never opens connections beyond the lanes'
(for a beat after another worker starts binding, the two may hold more). Before the lanes, one worker with 3,000
pods on 50 nodes measured: budget 24 gave 115.5 pods/s, p50 latency 10.7 s, 25 connections and 1.24 ms of resolver
CPU per pod; no budget (64 in flight) gave 120.3 pods/s, p50 5.1 s, 859 connections and 1.74 ms per pod. With the
lanes, 64 in flight made 0.02 new connections per pod and the resolver 1.24 ms per pod (uvloop since: about 1.06
ms). One worker's share was capped at 64 until 2026-11-23; with 100 its p50 latency fell from 5.2 and 3.7 s to 3.4
and 3.2 s in two pairs of 3,000-pod runs (throughput within the runs' noise).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from types import TracebackType

MIN_SHARE = 2


def share(budget: int, workers: int, cap: int) -> int:
    """One worker's limit: ``budget`` split over ``workers`` (0 budget: no sharing, ``cap`` alone)."""
    if budget <= 0:
        return cap
    return max(MIN_SHARE, min(cap, budget // max(1, workers)))


class BindLimit:
    """An async context manager like a semaphore whose limit may change while callers wait (first come, first
    served; a lowered limit lets the bindings in flight finish and admits no new one until below it)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def demand(self) -> int:
        """Bindings in flight and waiting for a slot."""
        return self.active + len(self._waiters)

    def resize(self, limit: int) -> None:
        self.limit = limit
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.active < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self.active += 1  # the slot is handed over with the wake-up

    async def __aenter__(self) -> None:
        if self.active < self.limit and not self._waiters:
            self.active += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot, then cancelled before using it: give it back
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self._release()

    def _release(self) -> None:
        self.active -= 1
        self._wake()
