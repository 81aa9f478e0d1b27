"""How the worker's loops wait for their event (work, a retry coming due, acknowledgements to send).

Every wait ends when its event is set, and stopping sets them all; the timeout is only a safety net, so an idle
worker wakes up rarely (a timer a second per loop costs it more than anything else while idle).
"""

from __future__ import annotations

import asyncio
import contextlib

IDLE_WAKE_SECONDS = 5.0
"""Longest a loop of the worker sleeps waiting for its event."""
SHORTEST_NAP_SECONDS = 0.005


async def nap(event: asyncio.Event, *, at_most: float | None = None) -> None:
    """Wait until `event` is set, for at most `at_most` seconds (never beyond ``IDLE_WAKE_SECONDS``)."""
    seconds = IDLE_WAKE_SECONDS if at_most is None else max(min(at_most, IDLE_WAKE_SECONDS), SHORTEST_NAP_SECONDS)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
