"""The limit on one user's unconfirmed creates (confirm.lua, limit_owner), on a real redis-server: the creates of a
user that the sync has not settled hold at most one node's room, counted apart per user and only while admitted,
and a dry run gives the same answer and writes nothing."""

from __future__ import annotations

import pytest

from hoss.ledger.arguments import Placement
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed, UnconfirmedCreates

NODE = {"cpu": 4000, "memory": 8 << 30, "pods": 110}


@pytest.fixture
async def ready(ledger: Ledger) -> Ledger:
    await ledger.rebuild(nodes=[("n1", NODE, {}), ("n2", NODE, {}), ("n3", NODE, {})], bound=[])
    return ledger


async def create(ledger: Ledger, uid: str, node: str, cpu: int, *, owner: str = "foreign:alice",
                 dry_run: bool = False) -> object:
    return await ledger.confirm(uid=uid, pod=f"team/{uid}", node=node, request={"cpu": cpu, "pods": 1}, owner=owner,
                                verify_after_seconds=60, via="create", limit_owner=True, dry_run=dry_run)


async def test_a_users_unconfirmed_creates_hold_at_most_one_nodes_room_until_the_sync_settles_them(
    ready: Ledger,
) -> None:
    assert isinstance(await create(ready, "a1", "n1", 3000), Confirmed)
    refused = await create(ready, "a2", "n2", 2000)
    assert refused == UnconfirmedCreates(node="n2", resource="cpu", wanted=2000, free=1000, held=3000)
    assert await create(ready, "a2", "n2", 2000, dry_run=True) == refused
    assert isinstance(await create(ready, "a3", "n3", 1000), Confirmed)
    assert isinstance(await create(ready, "b1", "n2", 4000, owner="foreign:bob"), Confirmed)
    # a1 is bound (confirmed), a3's create failed (dropped): alice holds nothing unconfirmed any more.
    await ready.bind_many([Placement(uid="a1", pod="team/a1", node="n1", request={"cpu": 3000, "pods": 1})])
    assert await ready.release_many(["a3"]) == 1
    assert isinstance(await create(ready, "a4", "n3", 4000), Confirmed)
    assert {e.uid: e.state for e in await ready.entries()} == {
        "a1": "bound", "b1": "admitted", "a4": "admitted"}


async def test_without_the_limit_a_confirm_is_judged_on_room_alone(ready: Ledger) -> None:
    for uid, node in (("k1", "n1"), ("k2", "n2")):
        result = await ready.confirm(uid=uid, pod=f"team/{uid}", node=node, request={"cpu": 4000, "pods": 1},
                                     owner="foreign:system:kube-scheduler", verify_after_seconds=60)
        assert isinstance(result, Confirmed)
