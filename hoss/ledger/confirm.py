"""Confirm batching: the webhook's concurrent confirms share one script call instead of queueing one call each.

A confirm made while no confirm call is in flight goes out at once; those made while one is wait for it, then go out
together in one call (up to `CONFIRM_BATCH` confirms), in the order they were made. So concurrent reviews share the
script's fixed cost and one round trip; a quiet webhook pays nothing for this. Each caller gets the reply its confirm
would have had in a call of its own: confirm.lua answers each in turn, as if called once per confirm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from hoss.errors import LedgerUnavailable

CONFIRM_BATCH: Final = 64
"""Most confirms the webhook's concurrent reviews send in one script call."""

RunScript = Callable[[str, Sequence[str | int]], Awaitable[list[Any]]]
"""Runs a ledger script by name (`hoss.ledger.scripts.ScriptRunner.run`)."""


class ConfirmBatcher:
    """Gathers confirms (their confirm.lua arguments) into shared script calls run by `run`."""

    def __init__(self, run: RunScript) -> None:
        self._run = run
        self._waiting: list[tuple[list[str | int], asyncio.Future[list[Any]]]] = []
        """Confirms waiting for the next confirm call."""
        self._sending: asyncio.Task[None] | None = None

    async def confirm(self, args: list[str | int]) -> list[Any]:
        """One confirm's reply, from the call it went out in."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append((args, future))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send())
        return await future

    async def _send(self) -> None:
        """Send the waiting confirms, a call at a time, until none wait. A caller that stopped waiting (its
        review timed out) before its call went is left out; every error reaches every caller of its call."""
        while self._waiting:
            batch = [(args, future) for args, future in self._waiting[:CONFIRM_BATCH] if not future.done()]
            del self._waiting[:CONFIRM_BATCH]
            if not batch:
                continue
            try:
                reply = await self._call([args for args, _ in batch])
            except asyncio.CancelledError:
                for _, future in (*batch, *self._waiting):
                    future.cancel()
                self._waiting.clear()
                raise
            except Exception as error:  # each caller raises it, as a call of its own would
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), answer in zip(batch, reply, strict=True):
                if not future.done():
                    future.set_result(answer)

    async def _call(self, confirms: Sequence[Sequence[str | int]]) -> list[Any]:
        """One confirm script call for ``confirms``: a reply for each, in order."""
        reply = await self._run("confirm", [len(confirms), *(arg for args in confirms for arg in args)])
        if reply and not isinstance(reply[0], list):  # not ready: the one answer for every confirm
            return [reply] * len(confirms)
        if len(reply) != len(confirms):
            raise LedgerUnavailable(f"ledger script confirm answered {len(reply)} of {len(confirms)} confirms")
        return reply
