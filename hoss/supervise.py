"""Supervision of long-running loops: a loop that raises is restarted with a bounded, logged backoff (tenacity);
one that keeps failing is declared dead, and the process is told to exit non-zero.

Every service's loops (the worker's intake, schedule, retry, ack, heartbeat and feed; the dispatcher's roles and
informers) run under one `Supervisor`. ``health()`` names each loop that is failing (waiting to restart) or
dead, for ``/healthz`` and the worker's heartbeat; ``fatal`` is set when a loop is dead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

log = logging.getLogger(__name__)

RESTARTS = 8
"""Failures within HEALTHY_AFTER_SECONDS after which a loop is dead (its process exits non-zero)."""
HEALTHY_AFTER_SECONDS = 60.0
"""Failures older than this no longer count against a loop."""


class LoopEnded(Exception):
    """A supervised loop returned although it should run until cancelled."""


class Supervisor:
    """Runs named loops; restarts a failed one, logging the attempt and the reason once per failure."""

    def __init__(self, *, restarts: int = RESTARTS, first_wait: float = 0.5, max_wait: float = 8.0) -> None:
        self.restarts = restarts
        self.first_wait = first_wait
        self.max_wait = max_wait
        self.failing: dict[str, str] = {}
        """Loop name -> the reason of its last failure, while it waits to restart."""
        self.dead: dict[str, str] = {}
        """Loop name -> the reason it gave up with."""
        self.fatal = asyncio.Event()
        """Set when a loop is dead: the process should stop and exit non-zero."""

    def health(self) -> dict[str, str]:
        """Each loop that is not running as it should, with why (empty when all are well)."""
        return {**{name: f"failing: {why}" for name, why in self.failing.items()},
                **{name: f"dead: {why}" for name, why in self.dead.items()}}

    async def run(self, name: str, loop: Callable[[], Awaitable[None]], *, until: asyncio.Event | None = None) \
            -> None:
        """Run ``loop()`` until it returns while ``until`` is set (a normal stop), restarting it after a failure.

        A loop that returns while ``until`` is not set counts as a failure too. After ``restarts`` failures within
        ``HEALTHY_AFTER_SECONDS`` the loop is dead and ``fatal`` is set.
        """
        failures: list[float] = []

        def record(_state: RetryCallState) -> None:
            now = time.monotonic()
            failures[:] = [t for t in failures if now - t < HEALTHY_AFTER_SECONDS] + [now]

        def log_retry(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            reason = f"{type(error).__name__}: {error}" if error is not None else "?"
            self.failing[name] = reason
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            log.error("loop %s failed (%d in a row): %s; restarting in %.1fs", name, len(failures), reason, wait,
                      exc_info=error if len(failures) == 1 else None)

        retrying = AsyncRetrying(
            stop=lambda _state: len(failures) >= self.restarts,
            wait=wait_exponential(multiplier=self.first_wait, max=self.max_wait),
            retry=retry_if_exception_type(Exception),
            after=record,
            before_sleep=log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    self.failing.pop(name, None)
                    await loop()
                    _check_ended(name, until)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the loop is dead whatever it raised
            reason = f"{type(error).__name__}: {error}"
            self.dead[name] = reason
            self.failing.pop(name, None)
            log.critical("loop %s is dead after %d failures: %s", name, self.restarts, reason)
            self.fatal.set()


def _check_ended(name: str, until: asyncio.Event | None) -> None:
    if until is None or not until.is_set():
        raise LoopEnded(f"loop {name} returned while it should run")


async def first_of(*waits: Awaitable[Any]) -> None:
    """Wait until the first of `waits` finishes; cancel the others (all of them when this wait is cancelled)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
