"""Acknowledging work items to the dispatcher, gathered into batches (one round trip per burst).

An item's acknowledgement names the pod uids the dispatcher may stop tracking; ``+uid`` says the pod is bound (the
dispatcher waits for its watch to agree before forgetting it). Acknowledgements Redis could not take are kept and
sent again.
"""

from __future__ import annotations

import asyncio
import logging

from hoss.errors import LedgerUnavailable
from hoss.queue import WorkItem, WorkQueue
from workers.idle import nap

log = logging.getLogger(__name__)

GATHER_SECONDS = 0.01
"""How long a first acknowledgement waits for the rest of its burst."""
OUTAGE_PAUSE_SECONDS = 0.5


def acked_uids(item: WorkItem, *, forget: bool, bound: bool) -> list[str]:
    """What the acknowledgement of `item` tells the dispatcher: its pods' uids when it may `forget` them (none
    otherwise: they stay dispatched), each marked ``+`` when `bound`."""
    uids = ([m.uid for m in item.members] or [item.uid]) if forget else []
    return [f"+{uid}" for uid in uids] if bound else uids


class Acks:
    """The acknowledgements of one worker not sent yet, and the loop that sends them."""

    def __init__(self, queue: WorkQueue, worker_id: str) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.pending: list[tuple[str, list[str]]] = []
        self._added = asyncio.Event()

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add(self, message_id: str, uids: list[str]) -> None:
        """Acknowledge the message soon, naming `uids`."""
        self.pending.append((message_id, uids))
        self._added.set()

    def wake(self) -> None:
        """End the loop's wait now (on stopping)."""
        self._added.set()

    async def flush(self) -> bool:
        """Send the acknowledgements gathered so far; False when Redis could not take them (they are kept)."""
        done, self.pending = self.pending, []
        try:
            await self.queue.ack_many(self.worker_id, done)
        except LedgerUnavailable as error:
            log.warning("cannot acknowledge %d items (they stay queued and are retried): %s", len(done), error)
            self.pending[:0] = done
            return False
        return True

    async def send(self, stopping: asyncio.Event) -> None:
        """Until `stopping`: send what gathers, a burst at a time."""
        while not stopping.is_set():
            if not self.pending:
                await nap(self._added)
                self._added.clear()
                if not self.pending:
                    continue
            await asyncio.sleep(GATHER_SECONDS)
            if not await self.flush():
                await asyncio.sleep(OUTAGE_PAUSE_SECONDS)  # Redis unreachable: try again shortly
