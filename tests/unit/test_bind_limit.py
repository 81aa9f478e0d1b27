"""The binding limit: one budget shared by the workers, resizable while bindings wait."""

from __future__ import annotations

import asyncio

import pytest

from tests.waiting import until
from workers.bindlimit import BindLimit, share


def test_share_splits_the_budget_and_keeps_bounds() -> None:
    assert share(24, 1, 64) == 24
    assert share(24, 2, 64) == 12
    assert share(24, 8, 64) == 3
    assert share(24, 50, 64) == 2, "never below two in flight"
    assert share(24, 1, 10) == 10, "never above the worker's own cap"
    assert share(0, 4, 64) == 64, "budget 0 means no sharing"
    assert share(24, 0, 64) == 24


async def _run(limit: BindLimit, peaks: list[int], gate: asyncio.Event) -> None:
    async with limit:
        peaks.append(limit.active)
        await gate.wait()


async def test_never_more_in_flight_than_the_limit_and_resizing_admits_waiters() -> None:
    limit = BindLimit(3)
    gate = asyncio.Event()
    peaks: list[int] = []
    tasks = [asyncio.create_task(_run(limit, peaks, gate)) for _ in range(10)]
    await until(lambda: limit.demand == 10, timeout=10, what="all ten to be in flight or waiting")
    assert (limit.active, len(peaks)) == (3, 3)
    limit.resize(5)
    await until(lambda: len(peaks) == 5, timeout=10, what="the two admitted by the resize to enter")
    assert (limit.active, limit.demand) == (5, 10)
    limit.resize(1)  # lowered: those in flight finish, no new one enters until below the limit
    gate.set()
    await asyncio.gather(*tasks)
    assert max(peaks) == 5
    assert peaks[5:] == [1] * 5, "after lowering, one at a time"
    assert limit.active == 0


async def test_a_cancelled_waiter_gives_its_slot_back() -> None:
    limit = BindLimit(1)
    gate = asyncio.Event()
    first = asyncio.create_task(_run(limit, [], gate))
    await until(lambda: limit.active == 1, timeout=10, what="the first to enter")
    waiting = asyncio.create_task(_run(limit, [], gate))
    await until(lambda: limit.demand == 2, timeout=10, what="the second to wait")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set()
    await first
    assert limit.active == 0
    async with limit:
        assert limit.active == 1


async def test_a_waiter_cancelled_after_being_handed_the_slot_releases_it() -> None:
    limit = BindLimit(1)
    await limit.__aenter__()
    waiting = asyncio.create_task(_run(limit, [], asyncio.Event()))
    await until(lambda: limit.demand == 2, timeout=10, what="the second to wait")
    await limit.__aexit__(None, None, None)  # hands the slot to the waiter ...
    waiting.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert limit.active == 0
