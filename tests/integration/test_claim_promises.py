"""The ledger's promises of ReadWriteOncePod claims (hoss/ledger/lua/promise_claims.lua) on a real redis-server:
a claim is promised to one pod at a time, all of a pod's claims or none, even when many workers ask at once; the
pod it is promised to may renew it; a failed binding gives it back; it expires by itself."""

from __future__ import annotations

import asyncio

import pytest

from hoss.errors import LedgerNotReadyError
from hoss.ledger.client import Ledger
from tests.waiting import until

pytestmark = pytest.mark.integration


async def ready(ledger: Ledger) -> Ledger:
    await ledger.rebuild(nodes=[("node1", {"cpu": 1000, "memory": 1 << 30, "pods": 10}, {})], bound=[])
    return ledger


async def test_a_claim_is_promised_to_one_pod_and_all_of_a_pod_s_claims_or_none(ledger: Ledger) -> None:
    await ready(ledger)
    assert await ledger.promise_claims(uid="a", claims=["ns/data"], ttl_seconds=30) is None
    assert await ledger.promise_claims(uid="a", claims=["ns/data"], ttl_seconds=30) is None  # renewed by its pod
    assert await ledger.promise_claims(uid="b", claims=["ns/logs", "ns/data"], ttl_seconds=30) == ("ns/data", "a")
    # b got nothing: its other claim is still free for a third pod
    assert await ledger.promise_claims(uid="c", claims=["ns/logs"], ttl_seconds=30) is None
    assert await ledger.promise_claims(uid="a", claims=["other/data"], ttl_seconds=30) is None  # namespaces apart


async def test_of_many_workers_asking_at_once_exactly_one_gets_the_claim(ledger: Ledger) -> None:
    await ready(ledger)
    answers = await asyncio.gather(*(ledger.promise_claims(uid=f"pod-{i}", claims=["ns/once"], ttl_seconds=30)
                                     for i in range(20)))
    winners = [i for i, answer in enumerate(answers) if answer is None]
    assert len(winners) == 1
    assert {answer for answer in answers if answer is not None} == {("ns/once", f"pod-{winners[0]}")}


async def test_a_promise_is_given_back_only_by_its_pod_and_expires_by_itself(ledger: Ledger) -> None:
    await ready(ledger)
    assert await ledger.promise_claims(uid="a", claims=["ns/data"], ttl_seconds=30) is None
    assert await ledger.unpromise_claims(uid="b", claims=["ns/data"]) == 0
    assert await ledger.promise_claims(uid="b", claims=["ns/data"], ttl_seconds=30) == ("ns/data", "a")
    assert await ledger.unpromise_claims(uid="a", claims=["ns/data"]) == 1
    assert await ledger.promise_claims(uid="b", claims=["ns/data"], ttl_seconds=0.2) is None

    async def expired() -> tuple[bool, str]:
        answer = await ledger.promise_claims(uid="c", claims=["ns/data"], ttl_seconds=30)
        return answer is None, str(answer)

    await until(expired, timeout=10, what="b's short promise to expire")


async def test_no_promise_while_the_ledger_is_not_ready(ledger: Ledger) -> None:
    with pytest.raises(LedgerNotReadyError):
        await ledger.promise_claims(uid="a", claims=["ns/data"], ttl_seconds=30)
