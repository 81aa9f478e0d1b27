"""The ledger's promises of a node's CSI attach slots (hoss/ledger/lua/promise_attach.lua) on a real redis-server:
the volumes a worker counts on the node, those promised to other pods and the pod's own, each handle once, never
exceed the driver's limit, even when many workers ask at once for the last slot; a pod's own promise is renewed,
not counted against it; a failed binding gives it back; it expires by itself."""

from __future__ import annotations

import asyncio

import pytest

from hoss.ledger.arguments import AttachSlots
from hoss.ledger.client import Ledger
from tests.waiting import until

pytestmark = pytest.mark.integration

DRIVER = "hostpath.csi.example.com"


async def ready(ledger: Ledger) -> Ledger:
    await ledger.rebuild(nodes=[("node1", {"cpu": 1000, "memory": 1 << 30, "pods": 10}, {})], bound=[])
    return ledger


def slots(*handles: str, attached: tuple[str, ...] = (), limit: int = 2) -> list[AttachSlots]:
    return [AttachSlots(driver=DRIVER, limit=limit, attached=attached, handles=handles)]


async def test_the_last_slot_goes_to_one_pod_of_many_asking_at_once(ledger: Ledger) -> None:
    await ready(ledger)
    answers = await asyncio.gather(*(
        ledger.promise_attach(uid=f"pod-{i}", node="node1", drivers=slots(f"vol-{i}", attached=("vol-old",)),
                              ttl_seconds=30)
        for i in range(20)))
    winners = [i for i, answer in enumerate(answers) if answer is None]
    assert len(winners) == 1
    assert {answer for answer in answers if answer is not None} == {(DRIVER, 3, 2)}


async def test_a_volume_already_attached_or_promised_takes_no_slot(ledger: Ledger) -> None:
    await ready(ledger)
    assert await ledger.promise_attach(uid="a", node="node1", drivers=slots("v1", attached=("v0",)),
                                       ttl_seconds=30) is None
    # the node is full (v0 attached, v1 promised to a): b shares v1, c shares v0 -- neither adds a volume
    assert await ledger.promise_attach(uid="b", node="node1", drivers=slots("v1", attached=("v0",)),
                                       ttl_seconds=30) is None
    assert await ledger.promise_attach(uid="c", node="node1", drivers=slots("v0", attached=("v0",)),
                                       ttl_seconds=30) is None
    assert await ledger.promise_attach(uid="d", node="node1", drivers=slots("v2", attached=("v0",)),
                                       ttl_seconds=30) == (DRIVER, 3, 2)
    # a's own promise is renewed, not counted against it; another node's slots are its own
    assert await ledger.promise_attach(uid="a", node="node1", drivers=slots("v1", attached=("v0",)),
                                       ttl_seconds=30) is None
    assert await ledger.promise_attach(uid="d", node="node2", drivers=slots("v2", attached=("v0",)),
                                       ttl_seconds=30) is None


async def test_a_promise_is_given_back_only_by_its_pod_and_expires_by_itself(ledger: Ledger) -> None:
    await ready(ledger)
    assert await ledger.promise_attach(uid="a", node="node1", drivers=slots("v1", limit=1), ttl_seconds=30) is None
    assert await ledger.unpromise_attach(uid="b", node="node1", drivers=[DRIVER]) == 0
    assert await ledger.promise_attach(uid="b", node="node1", drivers=slots("v2", limit=1),
                                       ttl_seconds=30) == (DRIVER, 2, 1)
    assert await ledger.unpromise_attach(uid="a", node="node1", drivers=[DRIVER]) == 1
    assert await ledger.promise_attach(uid="b", node="node1", drivers=slots("v2", limit=1), ttl_seconds=0.2) is None

    async def expired() -> tuple[bool, str]:
        answer = await ledger.promise_attach(uid="c", node="node1", drivers=slots("v3", limit=1), ttl_seconds=30)
        return answer is None, str(answer)

    await until(expired, timeout=10, what="b's short promise to expire")


async def test_a_disk_is_promised_on_a_node_to_one_pod_unless_all_mount_it_read_only(ledger: Ledger) -> None:
    """promise_disks.lua: VolumeRestrictions' in-tree disks, held while a pod's binding is under way."""
    await ready(ledger)
    pd = ("gcePersistentDisk", "data", True)
    assert await ledger.promise_disks(uid="a", node="node1", disks=[pd], ttl_seconds=30) is None
    assert await ledger.promise_disks(uid="b", node="node1", disks=[pd], ttl_seconds=30) is None  # both read-only
    assert await ledger.promise_disks(uid="c", node="node1", disks=[("gcePersistentDisk", "data", False)],
                                      ttl_seconds=30) == ("gcePersistentDisk/data", "a")
    assert await ledger.promise_disks(uid="c", node="node2", disks=[("gcePersistentDisk", "data", False)],
                                      ttl_seconds=30) is None
    ebs = ("awsElasticBlockStore", "vol-1", True)
    answers = await asyncio.gather(*(ledger.promise_disks(uid=f"pod-{i}", node="node1", disks=[ebs], ttl_seconds=30)
                                     for i in range(10)))
    assert sum(answer is None for answer in answers) == 1, answers
    assert await ledger.unpromise_disks(uid="a", node="node1") == 1
    assert await ledger.unpromise_disks(uid="b", node="node1") == 1
    assert await ledger.promise_disks(uid="c", node="node1", disks=[("gcePersistentDisk", "data", False)],
                                      ttl_seconds=30) is None


async def test_a_pod_s_own_promise_is_renewed_even_when_the_node_filled_up_since(ledger: Ledger) -> None:
    """Its own volume's VolumeAttachment, made after the promise, counts on the node: the renewal (cut short once
    the pod is bound) is not refused for it."""
    await ready(ledger)
    assert await ledger.promise_attach(uid="a", node="node1", drivers=slots("v1", attached=("v0",)),
                                       ttl_seconds=30) is None
    assert await ledger.promise_attach(uid="a", node="node1", drivers=slots("v1", attached=("v0", "va:v1")),
                                       ttl_seconds=0.2) is None
    assert await ledger.promise_disks(uid="a", node="node1", disks=[("awsElasticBlockStore", "v", False)],
                                      ttl_seconds=30) is None
    assert await ledger.promise_disks(uid="a", node="node1", disks=[("awsElasticBlockStore", "v", False)],
                                      ttl_seconds=0.2) is None
