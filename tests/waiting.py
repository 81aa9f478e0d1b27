"""The one way a test waits for something to happen: `until`, bounded, failing with what it waited for.

A test never sleeps and then looks: it waits for the condition itself (or, to show that nothing happened, for a
signal that the thing which could have happened had its chance: a counter of rounds, a witness that did happen).
The timeout is a bound on a wait for something that must happen, never a measure of how fast it does.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

import pytest

Seen = tuple[bool, str]
"""Whether the condition holds, and what the check saw (said when the wait times out)."""

Check = Callable[[], bool | Seen | Awaitable[bool] | Awaitable[Seen]]

FIRST_INTERVAL_SECONDS = 0.005
LONGEST_INTERVAL_SECONDS = 0.5
"""The check is asked again at growing intervals: at once for in-process conditions, gently for a control plane."""


async def until(check: Check, *, timeout: float, what: str, interval: float | None = None) -> str:
    """Return once ``check()`` holds; after ``timeout`` seconds fail the test naming ``what``.

    ``check`` is a function or a coroutine function returning a bool, or ``(holds, seen)`` where ``seen`` says
    what it saw: the failure quotes the last one, and it is returned once the condition holds. ``interval``: ask
    every that many seconds instead (to catch a passing state).
    """
    seen = ""
    steady = interval is not None
    interval = FIRST_INTERVAL_SECONDS if interval is None else interval
    bound = asyncio.timeout(timeout)
    try:
        async with bound:
            while True:
                holds, seen = await _ask(check)
                if holds:
                    return seen
                await asyncio.sleep(interval)
                if not steady:
                    interval = min(interval * 1.5, LONGEST_INTERVAL_SECONDS)
    except TimeoutError:
        if not bound.expired():
            raise  # the check's own timeout, not ours
    last = f"; last seen: {seen}" if seen else ""
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}{last}", pytrace=False)


async def _ask(check: Check) -> Seen:
    answer: object = check()
    if inspect.isawaitable(answer):
        answer = await answer
    if isinstance(answer, tuple):
        holds, seen = answer
        return bool(holds), str(seen)
    return bool(answer), ""
