"""The ledger's promises of DRA shared counters (hoss/ledger/lua/promise_counters.lua) on a real redis-server, with
allocations made by hoss's allocator: partitions of one 80Gi GPU drawing on its memory counter. Two pods deciding
from the same view never overdraw it between them, whichever asks first; a pod whose view saw the other's allocation
is not held back by its promise; a failed binding gives the draw back; a promise expires by itself."""

from __future__ import annotations

import asyncio

import pytest

from hoss.ledger.client import Ledger
from hoss.model import devices as dra
from hoss.model.devices.counters import CounterDraw, counter_draws
from hoss.model.objects import Json
from tests.waiting import until

pytestmark = pytest.mark.integration

DRIVER = "gpu.example.com"
GPU_CLASS: Json = {"metadata": {"name": "gpu"},
                   "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
INVENTORY = dra.Inventory.from_slices([
    {"metadata": {"name": "counters"}, "spec": {
        "driver": DRIVER, "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 2},
        "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]}},
    {"metadata": {"name": "parts"}, "spec": {
        "driver": DRIVER, "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 2},
        "devices": [{"name": name, "attributes": {"part": {"string": name}},
                     "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": size}}}]}
                    for name, size in (("whole", "80Gi"), ("half-a", "40Gi"), ("half-b", "40Gi"))]}}])


def draws(part: str, *, seen: tuple[str, ...] = ()) -> list[CounterDraw]:
    """What a claim for the partition `part` draws, decided from a view where `seen` were allocated."""
    claim = {"metadata": {"namespace": "ns", "name": part}, "spec": {"devices": {"requests": [{
        "name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": [
            {"cel": {"expression": f'device.attributes["{DRIVER}"].part == "{part}"'}}]}}]}}}
    allocated = {(DRIVER, "n1", name) for name in seen}
    allocation = dra.allocate([dra.claim_needs(claim, {"gpu": GPU_CLASS})], node="n1", node_labels={},
                              inventory=INVENTORY, allocated=allocated)
    assert allocation is not None, part
    return counter_draws(dra.devices_of(allocation), allocated=allocated, inventory=INVENTORY)


async def ready(ledger: Ledger) -> Ledger:
    await ledger.rebuild(nodes=[("n1", {"cpu": 1000, "memory": 1 << 30, "pods": 10}, {})], bound=[])
    return ledger


def test_a_draw_names_the_set_its_capacity_and_what_each_side_draws() -> None:
    [draw] = draws("half-b", seen=("half-a",))
    gib = 1 << 30
    assert draw.key == f"{DRIVER}/n1/gpu-0"
    assert draw.counters == (("memory", 80 * gib * 1000, 40 * gib * 1000, 40 * gib * 1000),)
    assert draw.seen_devices == (f"{DRIVER}/n1/half-a",)
    assert draw.mine_devices == ((f"{DRIVER}/n1/half-b", f"memory={40 * gib * 1000}"),)


async def test_two_pods_deciding_from_one_view_never_overdraw_a_counter_set(ledger: Ledger) -> None:
    await ready(ledger)
    # the whole GPU and half of it, both decided while nothing was allocated: exactly one is promised
    answers = await asyncio.gather(ledger.promise_counters(uid="whole-pod", draws=draws("whole"), ttl_seconds=30),
                                   ledger.promise_counters(uid="half-pod", draws=draws("half-a"), ttl_seconds=30))
    assert sum(answer is None for answer in answers) == 1, answers
    loser = next(answer for answer in answers if answer is not None)
    assert loser[:2] == (f"{DRIVER}/n1/gpu-0", "memory")


async def test_two_halves_fit_together_and_a_view_that_saw_the_first_is_not_held_back(ledger: Ledger) -> None:
    await ready(ledger)
    assert await ledger.promise_counters(uid="a", draws=draws("half-a"), ttl_seconds=30) is None
    # decided without seeing a's half: 40Gi unseen + 40Gi fit in 80Gi
    assert await ledger.promise_counters(uid="b", draws=draws("half-b"), ttl_seconds=30) is None
    # the whole GPU, decided without seeing either: refused, naming a holder
    refused = await ledger.promise_counters(uid="c", draws=draws("whole"), ttl_seconds=30)
    assert refused is not None and refused[2] in ("a", "b")


async def test_a_failed_binding_gives_its_draw_back_and_a_promise_expires_by_itself(ledger: Ledger) -> None:
    await ready(ledger)
    assert await ledger.promise_counters(uid="a", draws=draws("whole"), ttl_seconds=30) is None
    assert await ledger.promise_counters(uid="b", draws=draws("half-a"), ttl_seconds=30) is not None
    assert await ledger.unpromise_counters(uid="b", keys=[f"{DRIVER}/n1/gpu-0"]) == 0  # not b's to give back
    assert await ledger.unpromise_counters(uid="a", keys=[f"{DRIVER}/n1/gpu-0"]) == 1
    assert await ledger.promise_counters(uid="b", draws=draws("half-a"), ttl_seconds=0.2) is None

    async def expired() -> tuple[bool, str]:
        answer = await ledger.promise_counters(uid="c", draws=draws("whole"), ttl_seconds=30)
        return answer is None, str(answer)

    await until(expired, timeout=10, what="b's promise to expire")
