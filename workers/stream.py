"""Reading this worker's stream of work items into its backlog.

The worker registers first: it creates its consumer group (if missing), takes back what was delivered to it and
never acknowledged, and beats. When its stream or group vanishes (the dispatcher declared it dead and moved its
work to other workers, or Redis restarted or was flushed), it drops the work it holds, so that no pod is decided by
two workers, and registers again; bindings in flight finish (the ledger and the binding's uid keep them single).
"""

from __future__ import annotations

import asyncio
import logging

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from hoss.errors import LedgerUnavailable
from hoss.queue import QueueLost, WorkQueue
from workers.backlog import Backlog
from workers.heartbeat import Heartbeat
from workers.intake import parse_work
from workers.metrics import Tally
from workers.settings import WorkerSettings

log = logging.getLogger(__name__)

READ_BLOCK_MS = 500
PENDING_MOST = 100_000
"""Most unacknowledged items taken back on registering."""


class WorkStream:
    """One worker's reader of its stream (see the module docstring)."""

    def __init__(self, queue: WorkQueue, settings: WorkerSettings, *, backlog: Backlog, heartbeat: Heartbeat,
                 tally: Tally) -> None:
        self.queue = queue
        self.settings = settings
        self.backlog = backlog
        self.heartbeat = heartbeat
        self.tally = tally
        self.requeues = 0
        """Times this worker found its queue gone (declared dead, or Redis lost its data) and registered again."""

    async def read(self, stopping: asyncio.Event) -> None:
        """Register, then until `stopping`: read items into the backlog."""
        await self.register()
        outage: str | None = None
        while not stopping.is_set():
            try:
                batch = await self.queue.read(self.settings.id, count=self.settings.read_batch,
                                              block_ms=READ_BLOCK_MS)
            except LedgerUnavailable as error:
                if outage is None:
                    log.warning("cannot read work (retrying every second until Redis answers): %s", error)
                outage = str(error)
                await asyncio.sleep(1)
                continue
            except QueueLost as error:
                self.lost(str(error))
                await self.register()
                continue
            if outage is not None:
                log.info("reading work again after: %s", outage)
                outage = None
            for message_id, item in batch:
                self.backlog.push(parse_work(message_id, item))
            self.tally.queue.set(self.backlog.depth)

    async def register(self) -> None:
        """Create this worker's consumer group (if missing), take back what was delivered to it and never
        acknowledged, and beat at once so the dispatcher routes work here again. Retried (bounded) while Redis is
        unavailable; the supervisor restarts the loop if that fails too."""
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(30), wait=wait_exponential(multiplier=0.2, max=2.0),
            retry=retry_if_exception_type((LedgerUnavailable, QueueLost)), reraise=True,
            before_sleep=lambda state: log.warning(
                "cannot register this worker's queue (attempt %d): %s", state.attempt_number,
                state.outcome.exception() if state.outcome is not None else "?") if state.attempt_number == 1
                else None,
        ):
            with attempt:
                await self.queue.ensure_group(self.settings.id)
                # Items delivered to this id before a restart and never acknowledged come first.
                pending = await self.queue.read(self.settings.id, count=PENDING_MOST, block_ms=0, pending=True)
                for message_id, item in pending:
                    self.backlog.push(parse_work(message_id, item))
                await self.heartbeat.once()

    async def lost_while_away(self) -> bool:
        """After a gap longer than the heartbeat TTL (the process was paused or starved) or a beat that found its
        key gone, check that our queue still exists before deciding what we hold: if the dispatcher declared us
        dead, other workers have that work now (cheap: one XINFO after a gap, nothing otherwise)."""
        if not self.heartbeat.overdue():
            return False
        try:
            present = await self.queue.has_group(self.settings.id)
        except LedgerUnavailable:
            return False  # Redis is away: the intake loop sees what happened when it answers
        self.heartbeat.checked()
        if present:
            return False
        self.lost("found missing after a pause")
        return True

    def lost(self, reason: str) -> None:
        """Our stream or group vanished: drop the work we hold (the dispatcher sends it again elsewhere)."""
        dropped = self.backlog.clear()
        self.requeues += 1
        log.warning("this worker's queue is gone (%s): dropped %d items the dispatcher sends again elsewhere; "
                    "registering again", reason, dropped)
