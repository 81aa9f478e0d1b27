"""A worker's node table against the ledger's truth, on a real redis-server, when the change-stream entry of the
worker's own reservation is applied before the reservation call's reply is (the two come on different
connections, in either order). A bind in place writes no entry, so a reservation counted twice would stay
counted twice: the worker would see the node fuller than it is and leave a pod that fits unplaced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio

from bench.pipeline import drive, node_object, pod_object, prepare_ledger, run_worker, worker_settings
from dev.local.plane import POLICIES_FILE
from dispatcher.gangs import MIN_AVAILABLE_LABEL, NAME_LABEL
from hoss.framework.nodes import stream_position
from hoss.ledger.client import Ledger
from hoss.ledger.keys import CHANGES_KEY
from hoss.ledger.results import GangReserved, Reserved
from tests.waiting import until
from workers.core import Worker

pytestmark = pytest.mark.integration

NODES = ("n0", "n1", "n2")


def entry_first(worker: Worker) -> None:
    """Make every reserving call of `worker` return only once its feed applied the entry the call wrote."""
    ledger = worker.ledger
    reserve_batch, reserve_gang = ledger.reserve_batch, ledger.reserve_gang

    async def applied(change: str) -> None:
        assert change, "a call that reserved names its change-stream entry"
        await caught_up(worker, change)

    async def batch(*args: Any, **kwargs: Any) -> Any:
        results = await reserve_batch(*args, **kwargs)
        changes = {r.change for r in results if isinstance(r, Reserved)} if isinstance(results, list) else set()
        for change in changes:
            await applied(change)
        return results

    async def gang(*args: Any, **kwargs: Any) -> Any:
        result = await reserve_gang(*args, **kwargs)
        if isinstance(result, GangReserved):
            await applied(result.change)
        return result

    ledger.reserve_batch, ledger.reserve_gang = batch, gang  # type: ignore[method-assign]


async def caught_up(worker: Worker, change: str) -> None:
    """Until the worker's feed applied entry `change`."""
    async def check() -> tuple[bool, str]:
        return stream_position(worker.feed.position) >= stream_position(change), f"at {worker.feed.position}"

    await until(check, timeout=10, what=f"the feed to apply {change}")


def gang_pods(first: int, count: int, *, cpu: str) -> list[dict[str, Any]]:
    pods = [pod_object(n, cpu=cpu) for n in range(first, first + count)]
    for pod in pods:
        pod["metadata"]["labels"].update({NAME_LABEL: "train", MIN_AVAILABLE_LABEL: str(count)})
    return pods


async def table_matches_ledger(client: redis.asyncio.Redis, worker: Worker, names: Sequence[str]) -> None:
    """Once the worker applied the stream's last entry, its usage per node is the ledger's."""
    last: Any = await client.xrevrange(CHANGES_KEY, count=1)
    await caught_up(worker, str(last[0][0]))
    usage = await Ledger(client).node_usage(list(names))
    for name in names:
        assert worker.nodes.used_of(name) == usage[name][1], name


@asynccontextmanager
async def entry_first_worker(redis_url: str) -> AsyncIterator[Worker]:
    """One sink worker whose reserving calls return only after its feed applied their entries (`entry_first`)."""
    stop = asyncio.Event()
    held: list[Worker] = []

    def prepare(worker: Worker) -> None:
        entry_first(worker)
        held.append(worker)

    task = asyncio.create_task(run_worker(worker_settings("w1", redis_url, str(POLICIES_FILE)), stop,
                                          prepare=prepare))
    try:
        await until(lambda: bool(held), timeout=10, what="the worker to be built")
        yield held[0]
    finally:
        stop.set()
        await task


async def test_a_gang_reserved_while_the_feed_runs_ahead_is_counted_once_and_what_fits_still_binds(
    client: redis.asyncio.Redis, redis_url: str
) -> None:
    # 3 nodes of 8 cpu; a gang of 4 pods of 4 cpu takes 16, then 2 pods of 4 cpu fill the nodes exactly.
    await prepare_ledger(client, [node_object(name, cpu="8") for name in NODES])
    async with entry_first_worker(redis_url) as worker:
        gang = await drive(client, gang_pods(0, 4, cpu="4"), expected_workers=1, timeout=60)
        assert gang.bound == 4
        await table_matches_ledger(client, worker, NODES)
        rest = await drive(client, [pod_object(n, cpu="4") for n in (10, 11)], expected_workers=1, timeout=30)
        assert rest.bound == 2, "a pod that fits was left unplaced"
        await table_matches_ledger(client, worker, NODES)
    usage = await Ledger(client).node_usage(list(NODES))
    assert {name: used["cpu"] for name, (_alloc, used) in usage.items()} == dict.fromkeys(NODES, 8000)


async def test_singles_reserved_while_the_feed_runs_ahead_leave_the_table_equal_to_the_ledger(
    client: redis.asyncio.Redis, redis_url: str
) -> None:
    # 3 nodes of 2 cpu, 60 pods of 100m: exactly full, in batches whose entries the feed applies first.
    await prepare_ledger(client, [node_object(name, cpu="2") for name in NODES])
    async with entry_first_worker(redis_url) as worker:
        run = await drive(client, [pod_object(n) for n in range(60)], expected_workers=1, timeout=60)
        assert run.bound == 60
        await table_matches_ledger(client, worker, NODES)
