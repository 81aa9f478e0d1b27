"""The loop supervisor: a failing loop is restarted with a bounded backoff, a loop that keeps failing is dead and
makes the process stop, and health names both."""

from __future__ import annotations

import asyncio

import pytest

from hoss.supervise import Supervisor
from tests.waiting import until


async def test_a_loop_that_fails_then_recovers_is_restarted_and_ends_healthy() -> None:
    supervisor = Supervisor(restarts=3, first_wait=0.01, max_wait=0.02)
    done = asyncio.Event()
    runs = 0
    seen: list[dict[str, str]] = []

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        seen.append(supervisor.health())
        if runs < 3:
            raise ValueError(f"bad pod {runs}")
        done.set()

    await supervisor.run("schedule", flaky, until=done)
    assert runs == 3
    assert supervisor.health() == {} and not supervisor.fatal.is_set()


async def test_a_loop_that_keeps_failing_is_dead_and_fatal() -> None:
    supervisor = Supervisor(restarts=3, first_wait=0.01, max_wait=0.02)
    runs = 0

    async def broken() -> None:
        nonlocal runs
        runs += 1
        raise KeyError("boom")

    await supervisor.run("intake", broken)
    assert runs == 3
    assert supervisor.health() == {"intake": "dead: KeyError: 'boom'"}
    assert supervisor.fatal.is_set()


async def test_a_loop_that_returns_while_it_should_run_counts_as_a_failure() -> None:
    supervisor = Supervisor(restarts=2, first_wait=0.01, max_wait=0.02)

    async def quits() -> None:
        return None

    await supervisor.run("ack", quits, until=asyncio.Event())
    assert "returned while it should run" in supervisor.health()["ack"]


async def test_cancelling_a_supervised_loop_cancels_it() -> None:
    supervisor = Supervisor()
    started = asyncio.Event()

    async def beating() -> None:
        started.set()
        await asyncio.sleep(10)

    task = asyncio.create_task(supervisor.run("heartbeat", beating))
    await until(started.is_set, timeout=10, what="the supervised loop to start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert supervisor.health() == {} and not supervisor.fatal.is_set()
