"""Holes of issue 12 that live in the ledger's scripts and the webhook's lookups, on a real redis-server.

Hole 2: an entry the webhook admitted is gone before the sync saw the pod bound (expiry, a worker releasing after a
timeout, a 409 or a reset connection, a duplicate work item moving it, release_owner on shutdown). Each test plays
the webhook's confirm and then what the worker or timer does while the sync lags, and checks that the node still
counts the pod. Hole 7: dry runs write nothing; a binding the apiserver answered with an error is settled by the
sync's check at once. Hole 8: a binding without a uid is refused (before issue 33 it was judged against the live pod,
not a deleted one of the same name). Plus the ledger side of holes 1 (overcommits counted), 3 (resize) and 5 (an
older copy detected).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from kubernetes_asyncio import client

from hoss.ledger.arguments import BatchPod, Placement
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed, Conflict, HeldElsewhere, Overcommit
from hoss.model import admission
from hoss.model.objects import Json
from resolver.admitted import admitted_verdict
from resolver.judge import judge
from resolver.mirror import PodIndex, parse_pod
from resolver.settings import ResolverSettings
from resolver.state import WebhookState
from resolver.sync import LedgerSync
from tests.integration.redis_server import redis_clock_past
from tests.waiting import until

NODE = {"cpu": 2000, "memory": 8 << 30, "pods": 110}
POD = {"cpu": 1500, "pods": 1}


@pytest.fixture
async def ready(ledger: Ledger) -> Ledger:
    await ledger.rebuild(nodes=[("n1", NODE, {}), ("n2", NODE, {})], bound=[])
    return ledger


async def cpu(ledger: Ledger, node: str) -> int:
    return (await ledger.node_usage([node]))[node][1].get("cpu", 0)


async def admitted_by_the_webhook(ledger: Ledger, uid: str = "p", ttl: float = 0.05) -> None:
    """A worker reserved the pod on n1 (a short deadline), and the webhook confirmed its binding."""
    await ledger.reserve(uid=uid, pod=f"ns/{uid}", node="n1", request=POD, owner="w1", ttl_seconds=ttl)
    assert await ledger.confirm(uid=uid, pod=f"ns/{uid}", node="n1", request=None, owner="w1",
                                verify_after_seconds=30) == Confirmed(node="n1", foreign=False)


# -- hole 2 ------------------------------------------------------------------------------------------------------


async def test_hole2_an_admitted_binding_outlives_its_reservations_deadline(ready: Ledger) -> None:
    await admitted_by_the_webhook(ready, ttl=0.05)
    # A witness with the same deadline, reserved just after: once it expires, the admitted one's deadline passed.
    await ready.reserve(uid="witness", pod="ns/witness", node="n1", request={"cpu": 100, "pods": 1}, owner="w1",
                        ttl_seconds=0.05)
    expired: list[str] = []

    async def witness_expired() -> tuple[bool, str]:
        expired.extend(await ready.expire())
        return "witness" in expired, f"expired so far: {expired}"

    await until(witness_expired, timeout=10, what="the witness reservation to pass its deadline")
    assert expired == ["witness"], "the admitted entry does not expire"
    assert await cpu(ready, "n1") == 1500


async def test_hole2_a_worker_releasing_after_a_timeout_or_a_409_keeps_an_admitted_entry(ready: Ledger) -> None:
    await admitted_by_the_webhook(ready)
    assert await ready.release_assumed(uid="p", node="n1") is False  # timeout or reset: no answer seen
    assert await ready.release_assumed(uid="p", node="n1", answered=True) is False  # a 409
    assert await cpu(ready, "n1") == 1500
    (entry,) = (await ready.verify_due()).entries
    assert (entry.uid, entry.node, entry.answered) == ("p", "n1", True)


async def test_hole2_release_owner_on_shutdown_keeps_admitted_entries(ready: Ledger) -> None:
    await admitted_by_the_webhook(ready)
    await ready.reserve(uid="q", pod="ns/q", node="n2", request=POD, owner="w1", ttl_seconds=30)
    assert await ready.release_owner("w1") == 1  # q, only assumed
    assert (await cpu(ready, "n1"), await cpu(ready, "n2")) == (1500, 0)


async def test_hole2_a_duplicate_work_item_never_moves_an_admitted_entry(ready: Ledger) -> None:
    await admitted_by_the_webhook(ready)
    duplicate = BatchPod(uid="p", pod="ns/p", digest="d", candidates=["n2"], request=POD)
    assert await ready.reserve_batch([duplicate], owner="w2", ttl_seconds=30) == [
        HeldElsewhere(node="n1", state="bound")]
    assert isinstance(await ready.reserve(uid="p", pod="ns/p", node="n2", request=POD, owner="w2", ttl_seconds=30),
                      HeldElsewhere)
    assert (await cpu(ready, "n1"), await cpu(ready, "n2")) == (1500, 0)


async def test_hole2_a_rebuild_keeps_admitted_entries_and_the_sync_binds_them(ready: Ledger) -> None:
    await admitted_by_the_webhook(ready)
    await ready.rebuild(nodes=[("n1", NODE, {}), ("n2", NODE, {})], bound=[])
    assert await cpu(ready, "n1") == 1500
    await ready.bind_many([Placement(uid="p", pod="ns/p", node="n1", request=POD)])
    ((uid, state),) = [(e.uid, e.state) for e in await ready.entries()]
    assert (uid, state) == ("p", "bound")
    assert (await ready.verify_due()).entries == []


def pod_json(uid: str, *, node: str | None = None, deleting: bool = False, cpu: str = "1500m") -> Json:
    metadata: Json = {"name": "p", "namespace": "ns", "uid": uid}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: Json = {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": metadata, "spec": spec}


async def test_hole2_and_7_the_check_drops_an_admitted_entry_only_on_proof(ready: Ledger) -> None:
    await admitted_by_the_webhook(ready)
    assert (await ready.verify_due()).entries == [], "not due for 30 s"
    await ready.release_assumed(uid="p", node="n1", answered=True)
    batch = await ready.verify_due()
    (entry,) = batch.entries
    timeout = 60_000
    # bound where it was admitted: kept (the sync binds it)
    assert admitted_verdict(entry, pod_json("p", node="n1"), now_ms=batch.now_ms, write_timeout_ms=timeout) == "keep"
    # bound elsewhere, gone, or being deleted: the binding can never happen
    assert admitted_verdict(entry, pod_json("p", node="n2"), now_ms=batch.now_ms,
                            write_timeout_ms=timeout) == "bound elsewhere"
    assert admitted_verdict(entry, None, now_ms=batch.now_ms, write_timeout_ms=timeout) == "pod gone"
    assert admitted_verdict(entry, pod_json("other-uid"), now_ms=batch.now_ms, write_timeout_ms=timeout) == "pod gone"
    # unbound and answered with an error: the write is over and failed
    assert admitted_verdict(entry, pod_json("p"), now_ms=batch.now_ms, write_timeout_ms=timeout) == "write failed"
    unanswered = type(entry)(**{**entry.__dict__, "answered": False})
    assert admitted_verdict(unanswered, pod_json("p"), now_ms=batch.now_ms, write_timeout_ms=timeout) == "keep"
    assert admitted_verdict(unanswered, pod_json("p"), now_ms=entry.admitted_ms + timeout,
                            write_timeout_ms=timeout) == "write failed"
    assert admitted_verdict(unanswered, pod_json("p", deleting=True), now_ms=batch.now_ms,
                            write_timeout_ms=timeout) == "pod being deleted"
    assert await ready.drop_admitted(entry)
    assert await cpu(ready, "n1") == 0
    assert not await ready.drop_admitted(entry), "a second drop finds nothing"


async def test_hole2_a_drop_never_takes_an_entry_admitted_again_meanwhile(ready: Ledger, redis_url: str) -> None:
    await admitted_by_the_webhook(ready)
    await ready.release_assumed(uid="p", node="n1", answered=True)
    (entry,) = (await ready.verify_due()).entries
    await redis_clock_past(redis_url, entry.admitted_ms)  # admitted again later: a later admission time
    assert await ready.confirm(uid="p", pod="ns/p", node="n1", request=None, owner="w1",
                               verify_after_seconds=30) == Confirmed(node="n1", foreign=False)
    assert not await ready.drop_admitted(entry)
    assert await cpu(ready, "n1") == 1500


# -- hole 7: dry runs --------------------------------------------------------------------------------------------


async def test_hole7_a_dry_run_confirm_answers_and_writes_nothing(ready: Ledger) -> None:
    assert await ready.confirm(uid="d", pod="ns/d", node="n1", request=POD, owner="foreign:x",
                               verify_after_seconds=30, dry_run=True) == Confirmed(node="n1", foreign=True)
    assert await ready.entries() == []
    await ready.confirm(uid="e", pod="ns/e", node="n1", request=POD, owner="foreign:x", verify_after_seconds=30)
    assert isinstance(await ready.confirm(uid="d", pod="ns/d", node="n1", request=POD, owner="foreign:x",
                                          verify_after_seconds=30, dry_run=True), Conflict)
    assert [e.uid for e in await ready.entries()] == ["e"]


# -- hole 1: overcommits the sync learns -------------------------------------------------------------------------


async def test_hole1_an_overcommit_from_the_apiserver_is_recorded_counted_and_returned(ready: Ledger) -> None:
    first = await ready.bind_many([Placement(uid="a", pod="ns/a", node="n1", request=POD)])
    second = await ready.bind_many([Placement(uid="b", pod="ns/b", node="n1", request=POD)])
    assert first == []
    assert all(isinstance(o, Overcommit) for o in second)
    overcommits = [(o.pod, o.node, o.what) for o in second if isinstance(o, Overcommit)]
    assert overcommits == [("ns/b", "n1", "cpu used 3000 of 2000")]
    assert await cpu(ready, "n1") == 3000
    assert (await ready.stats())["overcommits"] == "1"
    assert await ready.bind_many([Placement(uid="b", pod="ns/b", node="n1", request=POD)]) == [], \
        "the same pod bound again adds nothing"


# -- hole 3: resize ----------------------------------------------------------------------------------------------


async def test_hole3_a_resize_that_grows_past_the_node_is_refused_and_one_that_fits_replaces_the_request(
    ready: Ledger,
) -> None:
    await ready.bind_many([Placement(uid="r", pod="ns/r", node="n1", request={"cpu": 1000, "pods": 1})])
    assert await ready.resize(uid="r", pod="ns/r", node="n1", request={"cpu": 2500, "pods": 1}, owner="u",
                              verify_after_seconds=30) == Conflict(node="n1", resource="cpu", wanted=2500, free=2000)
    assert await ready.resize(uid="r", pod="ns/r", node="n1", request={"cpu": 1800, "pods": 1}, owner="u",
                              verify_after_seconds=30, dry_run=True) == Confirmed(node="n1", foreign=False)
    assert await cpu(ready, "n1") == 1000
    assert await ready.resize(uid="r", pod="ns/r", node="n1", request={"cpu": 1800, "pods": 1}, owner="u",
                              verify_after_seconds=30) == Confirmed(node="n1", foreign=False)
    ((state, request),) = [(e.state, e.request) for e in await ready.entries()]
    assert (state, request, await cpu(ready, "n1")) == ("bound", {"cpu": 1800, "pods": 1}, 1800)


# -- hole 4 and 5: the sync's node events, the stamp and the audit ------------------------------------------------


@pytest.fixture
async def sync(ready: Ledger) -> AsyncIterator[LedgerSync]:
    api = client.ApiClient()
    synced = LedgerSync(ledger=ready, api=api)
    synced.nodes["n1"] = (NODE, {}, "")
    synced.nodes["n2"] = (NODE, {}, "")
    await synced.rebuild()
    yield synced
    await api.close()


def node_json(name: str) -> Json:
    return {"metadata": {"name": name, "labels": {}}, "status": {"allocatable": {"cpu": "2", "memory": "8Gi",
                                                                                  "pods": "110"}}}


async def test_hole4_a_node_deleted_and_recreated_keeps_the_pods_that_still_name_it(sync: LedgerSync) -> None:
    await sync._on_pod_event("ADDED", {**pod_json("s", node="n1"), "status": {"phase": "Running"}})
    await sync.flush_pods()
    assert await cpu(sync.ledger, "n1") == 1500
    await sync._on_node_event("DELETED", node_json("n1"))
    assert await cpu(sync.ledger, "n1") == 1500, "the pod still stands: it stays counted"
    await sync._on_node_event("ADDED", node_json("n1"))
    assert await cpu(sync.ledger, "n1") == 1500
    assert isinstance(await sync.ledger.confirm(uid="x", pod="ns/x", node="n1", request=POD, owner="f",
                                                verify_after_seconds=30), Conflict)


async def test_hole5_an_older_copy_of_the_ledger_is_noticed(sync: LedgerSync, redis_url: str) -> None:
    assert await sync._older_copy() is None
    assert await sync._older_copy() is None
    async with redis.asyncio.Redis.from_url(redis_url) as raw:
        await raw.decr("{hoss}:stamp", 2)  # what a restart from an older snapshot brings back
    assert "stamp" in (await sync._older_copy() or "")
    async with redis.asyncio.Redis.from_url(redis_url) as raw:
        await raw.set("{hoss}:epoch", "older")
    assert "epoch older" in (await sync._older_copy() or "")


async def test_hole5_the_audit_finds_and_repairs_drift(sync: LedgerSync) -> None:
    await sync._on_pod_event("ADDED", {**pod_json("s", node="n1"), "status": {"phase": "Running"}})
    await sync.flush_pods()
    assert await sync.audit() == []
    await sync.ledger.release("s")  # drift: a bound pod's entry lost
    await sync.ledger.bind_many([Placement(uid="ghost", pod="ns/ghost", node="n2", request=POD)])
    drift = await sync.audit()
    assert len(drift) == 2, drift
    assert (await cpu(sync.ledger, "n1"), await cpu(sync.ledger, "n2")) == (1500, 0)
    assert (await sync.ledger.stats())["audit_drift"] == "2"
    assert await sync.audit() == []


# -- hole 8: a binding without a uid -----------------------------------------------------------------------------


async def test_hole8_a_binding_without_uid_is_refused_before_any_lookup(ready: Ledger) -> None:
    """By name alone the apiserver binds whichever pod has the name when the binding lands, which is not
    necessarily the pod any lookup saw (the sync's index may still hold a deleted namesake, and a GET may see a pod
    replaced just after): such a binding is refused (issue 33), with nothing read and nothing held."""
    index = PodIndex()
    index.put(parse_pod({**pod_json("old-uid", node="n2", cpu="100m")}))  # a deleted namesake, still indexed
    reads: list[str] = []

    async def live_pod(namespace: str, name: str) -> Json:
        reads.append(f"{namespace}/{name}")
        return pod_json("new-uid", cpu="1500m")

    settings = ResolverSettings(tls_cert_file="unused", tls_key_file="unused")
    state = WebhookState(settings=settings, ledger=ready, pods=index, get_pod=live_pod)
    no_uid = admission.BindingRequest(review_uid="r", namespace="ns", pod="p", pod_uid=None, node="n1",
                                      username="someone")
    verdict = await judge(state, no_uid)
    assert (verdict.allowed, verdict.code, verdict.reason) == (False, 400, "no-uid")
    assert (reads, await ready.entries()) == ([], [])
