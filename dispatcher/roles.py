"""Switching roles: a replica runs the leader's rounds while it holds the Lease and the follower's refresh
otherwise, and switches at once when that changes; the role it leaves has ended before the other starts."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.core import Dispatcher
from dispatcher.leader import LeaderElector


async def cancel_and_wait(*tasks: asyncio.Task[Any], retry_seconds: float = 0.1) -> None:
    """Cancel `tasks` and wait until each has ended, cancelling again while one runs on.

    Cancelling once is not enough: redis-py's asyncio client can swallow a cancellation that arrives while it
    sets up a connection, and the task then carries on (e.g. a deposed leader's round).
    """
    running = {task for task in tasks if not task.done()}
    while running:
        for task in running:
            task.cancel()
        _ended, running = await asyncio.wait(running, timeout=retry_seconds)
    await asyncio.gather(*tasks, return_exceptions=True)  # collect outcomes so none is reported as never retrieved


async def run_roles(dispatcher: Dispatcher, elector: LeaderElector) -> None:
    """Run `Dispatcher.lead` while this replica leads and `Dispatcher.follow` otherwise, switching at once."""
    while True:
        leading = elector.is_leader
        role = asyncio.create_task(dispatcher.lead() if leading else dispatcher.follow(),
                                   name="lead" if leading else "follow")
        change = asyncio.create_task((elector.following if leading else elector.leading).wait())
        try:
            done, _pending = await asyncio.wait({role, change}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(role, change)
        if role in done:
            role.result()  # a role only ends by crashing: let the service see it
