"""Elastic quotas in the ledger, on a real redis-server: the max and borrowing rule checked in the same atomic call
as the node's room, for every way an entry is made (a worker's batch, a gang, a foreign binding, a resize), and
the namespaces' used totals kept equal to their entries through release, bind, rebuild and quota changes.

The concurrency test races many clients (separate connections) reserving, confirming foreign bindings and
releasing for tenants with random quotas; after every round no tenant is above its max, the quota namespaces
together use no more than the sum of their min, and every namespace's used total is the sum of its entries.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hoss.ledger.arguments import BatchPod, BoundPod, ElasticQuota, GangMember
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed, GangReserved, QuotaExceeded, Reserved

GPU = "nvidia.com/gpu"
TTL = 120.0


async def _gpu_cluster(ledger: Ledger, nodes: int, gpus_per_node: int) -> list[str]:
    names = [f"g{i}" for i in range(nodes)]
    await ledger.rebuild(nodes=[(n, {GPU: gpus_per_node, "cpu": 64_000, "pods": 110}, {}) for n in names],
                         bound=[])
    return names


def _pod(ns: str, i: int, gpus: int = 1) -> tuple[str, str, dict[str, int]]:
    return f"{ns}-{i}", f"{ns}/p{i}", {GPU: gpus, "cpu": 100}


async def _used_by_entries(ledger: Ledger) -> dict[str, Counter[str]]:
    used: dict[str, Counter[str]] = {}
    for entry in await ledger.entries():
        ns = entry.pod.split("/", 1)[0]
        used.setdefault(ns, Counter()).update(entry.request)
    return used


async def _check_totals(ledger: Ledger) -> None:
    """Each quota namespace's used is the sum of its entries; the sums are the sums of the quotas'."""
    assert await ledger.quota_drift() == []
    report = await ledger.quotas()
    truth = await _used_by_entries(ledger)
    for use in report.quotas:
        assert use.used == {r: a for r, a in truth.get(use.quota.namespace, Counter()).items() if a}, use
    total: Counter[str] = Counter()
    for use in report.quotas:
        total.update(use.used)
    assert report.sum_used == {r: a for r, a in total.items() if a}
    mins: Counter[str] = Counter()
    for use in report.quotas:
        mins.update(use.quota.min)
    assert report.sum_min == dict(mins)


async def test_the_a_b_example_max_and_borrowing(ledger: Ledger) -> None:
    """A min 4 max 6, B min 6 max 8 on 10 GPUs: A borrows up to its max (6), B then gets only the 4 left before
    the sum of min is reached; B's fifth pod is refused by the borrowing rule (reclaim's job), A's 7th by max."""
    nodes = await _gpu_cluster(ledger, 5, 2)
    await ledger.set_quotas([ElasticQuota("team-a", {GPU: 4}, {GPU: 6}), ElasticQuota("team-b", {GPU: 6}, {GPU: 8})],
                            replace=True)
    a = [BatchPod(uid=u, pod=p, digest="", candidates=nodes, request=r) for u, p, r in
         (_pod("team-a", i) for i in range(7))]
    results = await ledger.reserve_batch(a, owner="w", ttl_seconds=TTL)
    assert isinstance(results, list)
    assert [isinstance(r, Reserved) for r in results] == [True] * 6 + [False]
    refusal = results[6]
    assert isinstance(refusal, QuotaExceeded)
    assert str(refusal) == "quota team-a: nvidia.com/gpu 6 used + 1 requested > max 6"
    assert refusal.namespace == "team-a"

    b = [BatchPod(uid=u, pod=p, digest="", candidates=nodes, request=r) for u, p, r in
         (_pod("team-b", i) for i in range(5))]
    results = await ledger.reserve_batch(b, owner="w", ttl_seconds=TTL)
    assert isinstance(results, list)
    assert [isinstance(r, Reserved) for r in results] == [True] * 4 + [False]
    assert str(results[4]) == ("quota team-b: nvidia.com/gpu 10 used by all quotas + 1 requested > 10 guaranteed "
                               "(sum of min)")
    # A foreign binding is judged by the same rule (the webhook's confirm).
    uid, pod, request = _pod("team-a", 99)
    foreign = await ledger.confirm(uid=uid, pod=pod, node=nodes[-1], request=request, owner="f",
                                   verify_after_seconds=TTL)
    assert isinstance(foreign, QuotaExceeded), foreign
    # A namespace without a quota is not limited by anyone's (and the nodes are full anyway here).
    report = await ledger.quotas()
    assert {u.quota.namespace: u.used[GPU] for u in report.quotas} == {"team-a": 6, "team-b": 4}
    assert {u.quota.namespace: u.borrowed for u in report.quotas} == {"team-a": {GPU: 2}, "team-b": {}}
    await _check_totals(ledger)


async def test_gangs_count_together_and_resize_growth_is_checked(ledger: Ledger) -> None:
    nodes = await _gpu_cluster(ledger, 4, 4)
    await ledger.set_quotas([ElasticQuota("t", {GPU: 16}, {GPU: 5})])
    gang = [GangMember(uid=f"m{i}", pod=f"t/m{i}", node=nodes[i], request={GPU: 2}) for i in range(3)]
    refused = await ledger.reserve_gang(members=gang, owner="w", ttl_seconds=TTL)
    assert isinstance(refused, QuotaExceeded)
    assert str(refused) == "quota t: nvidia.com/gpu 0 used + 6 requested > max 5"
    assert isinstance(await ledger.reserve_gang(members=gang[:2], owner="w", ttl_seconds=TTL), GangReserved)
    # Refreshing a reservation gives its own request back first.
    again = await ledger.reserve(uid="m0", pod="t/m0", node=nodes[0], request={GPU: 2}, owner="w", ttl_seconds=TTL)
    assert again == Reserved(nodes[0])
    # Growing in place by one GPU fits the max (4 + 1 = 5), by two does not.
    await ledger.bind_many([BoundPod(uid="m0", pod="t/m0", node=nodes[0], request={GPU: 2})])
    grown = await ledger.resize(uid="m0", pod="t/m0", node=nodes[0], request={GPU: 4}, owner="r",
                                verify_after_seconds=TTL)
    assert isinstance(grown, QuotaExceeded), grown
    assert isinstance(await ledger.resize(uid="m0", pod="t/m0", node=nodes[0], request={GPU: 3}, owner="r",
                                          verify_after_seconds=TTL), Confirmed)
    await _check_totals(ledger)


async def test_totals_follow_release_rebuild_and_quota_changes(ledger: Ledger) -> None:
    nodes = await _gpu_cluster(ledger, 2, 8)
    for i in range(3):
        uid, pod, request = _pod("late", i)
        assert await ledger.reserve(uid=uid, pod=pod, node=nodes[0], request=request, owner="w",
                                    ttl_seconds=TTL) == Reserved(nodes[0])
    # A quota created after its namespace's pods were placed counts them at once.
    await ledger.set_quotas([ElasticQuota("late", {GPU: 3}, {GPU: 3})])
    report = await ledger.quotas()
    assert report.quotas[0].used[GPU] == 3 and report.sum_used == {GPU: 3, "cpu": 300}
    uid, pod, request = _pod("late", 3)
    assert isinstance(await ledger.reserve(uid=uid, pod=pod, node=nodes[1], request=request, owner="w",
                                           ttl_seconds=TTL), QuotaExceeded)
    assert await ledger.release("late-0")
    assert await ledger.reserve(uid=uid, pod=pod, node=nodes[1], request=request, owner="w",
                                ttl_seconds=TTL) == Reserved(nodes[1])
    await _check_totals(ledger)
    # A rebuild recomputes the totals from the entries it keeps and the bound pods it is given.
    await ledger.rebuild(nodes=[(n, {GPU: 8, "cpu": 64_000, "pods": 110}, {}) for n in nodes],
                         bound=[BoundPod(uid="late-1", pod="late/p1", node=nodes[0], request={GPU: 1, "cpu": 100})])
    report = await ledger.quotas()
    assert report.quotas[0].used == {GPU: 3, "cpu": 300}  # late-1 bound, late-2 and late-3 still assumed
    await _check_totals(ledger)
    # Replacing the quotas with none removes the namespace from the sums.
    await ledger.set_quotas([], replace=True)
    report = await ledger.quotas()
    assert report.quotas == [] and report.sum_used == {} and report.sum_min == {}


TENANTS = ("ta", "tb", "tc", "td")


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mins=st.lists(st.integers(0, 6), min_size=len(TENANTS), max_size=len(TENANTS)),
    extra=st.lists(st.integers(0, 6), min_size=len(TENANTS), max_size=len(TENANTS)),
    seed=st.integers(0, 2**32 - 1),
)
async def test_racing_clients_never_push_a_tenant_past_its_quota(
    redis_url: str, mins: list[int], extra: list[int], seed: int
) -> None:
    """16 clients on their own connections race 30 operations each (batches of reservations, gangs, foreign
    bindings, releases) for four tenants; demand far exceeds every max. After each of the rounds: no tenant above
    its max, the sum of use no more than the sum of min, and the totals equal the entries."""
    rng = random.Random(seed)
    quotas = [ElasticQuota(ns, {GPU: m}, {GPU: m + e}) for ns, m, e in zip(TENANTS, mins, extra, strict=True)]
    async with redis.asyncio.Redis.from_url(redis_url) as fresh:
        await fresh.flushdb()  # a fresh database per generated example
    async with Ledger.from_url(redis_url) as admin:
        nodes = await _gpu_cluster(admin, 8, 4)  # 32 GPUs, more than any sum of min here (at most 24)
        await admin.set_quotas(quotas, replace=True)
        ledgers = [Ledger.from_url(redis_url) for _ in range(16)]
        try:
            counter = iter(range(10**9))

            async def client(ledger: Ledger, crng: random.Random) -> None:
                mine: list[str] = []
                for _ in range(30):
                    ns = crng.choice(TENANTS)
                    action = crng.random()
                    if action < 0.5:
                        pods = [_pod(ns, next(counter), crng.choice((1, 1, 2))) for _ in range(crng.randint(1, 4))]
                        results = await ledger.reserve_batch(
                            [BatchPod(uid=u, pod=p, digest="", candidates=crng.sample(nodes, 3), request=r)
                             for u, p, r in pods], owner="w", ttl_seconds=TTL)
                        assert isinstance(results, list)
                        mine.extend(u for (u, _p, _r), res in zip(pods, results, strict=True)
                                    if isinstance(res, Reserved))
                    elif action < 0.65:
                        members = [GangMember(uid=u, pod=p, node=crng.choice(nodes), request=r)
                                   for u, p, r in (_pod(ns, next(counter)) for _ in range(3))]
                        if isinstance(await ledger.reserve_gang(members=members, owner="w", ttl_seconds=TTL),
                                      GangReserved):
                            mine.extend(m.uid for m in members)
                    elif action < 0.85:
                        uid, pod, request = _pod(ns, next(counter))
                        result = await ledger.confirm(uid=uid, pod=pod, node=crng.choice(nodes), request=request,
                                                      owner="f", verify_after_seconds=TTL)
                        if isinstance(result, Confirmed):
                            mine.append(uid)
                    elif mine:
                        await ledger.release(mine.pop(crng.randrange(len(mine))))

            for _round in range(2):
                await asyncio.gather(*(client(lg, random.Random(rng.random())) for lg in ledgers))
                report = await admin.quotas()
                for use in report.quotas:
                    assert use.used.get(GPU, 0) <= use.quota.max[GPU], use
                assert report.sum_used.get(GPU, 0) <= report.sum_min.get(GPU, 0), report
                truth = await _used_by_entries(admin)
                assert sum(truth[ns][GPU] for ns in truth) == report.sum_used.get(GPU, 0)
                await _check_totals(admin)
            # The race was real: the tenants together reached the sum of min (demand exceeds it many times).
            assert report.sum_used.get(GPU, 0) >= min(sum(mins), 32) - 2, report
        finally:
            for lg in ledgers:
                await lg.close()


async def test_the_audit_finds_totals_that_drifted_from_the_entries(ledger: Ledger, redis_url: str) -> None:
    nodes = await _gpu_cluster(ledger, 1, 8)
    await ledger.set_quotas([ElasticQuota("t", {GPU: 4}, {GPU: 8})])
    uid, pod, request = _pod("t", 0)
    assert await ledger.reserve(uid=uid, pod=pod, node=nodes[0], request=request, owner="w",
                                ttl_seconds=TTL) == Reserved(nodes[0])
    assert await ledger.quota_drift() == []
    async with redis.asyncio.Redis.from_url(redis_url) as raw:
        await raw.hincrby("{hoss}:nsused", f"t/{GPU}", 2)  # what a bug (or a hand) could do
    assert await ledger.quota_drift() == [f"quota t/{GPU}: kept 3, entries 1"]
    await ledger.rebuild(nodes=[(nodes[0], {GPU: 8, "cpu": 64_000, "pods": 110}, {})], bound=[])
    assert await ledger.quota_drift() == []
