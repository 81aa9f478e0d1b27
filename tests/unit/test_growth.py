"""A pod that grows between admission and binding (issue 33, item 1), in the parts that need no apiserver: the
reviews' parsing (a resize of a pod not bound yet, a Binding's resourceVersion), the ledger's confirm and resize
scripts on fakeredis (growth over an entry is fit-checked, a resize's growth is remembered for bindings judged from an
older view of the pod), and the webhook's verdicts (a binding without uid, a hoss binding with and without the pod's
version)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from hoss.framework.pod import parse_pod
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed, Conflict
from hoss.model import admission, compact
from tests.kube_objects import Json, raw_pod
from tests.unit.webhooks import WORKER, PodReads, Webhook, pod, review, start

SMALL = {"cpu": 100, "pods": 1}
HUGE = {"cpu": 64000, "pods": 1}
FILLER = {"cpu": 3900, "pods": 1}
"""n1 and n2 have 4 cpu: 100m and the filler take all of n1."""


def resize_review(*, old: Json, new: Json) -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "r1", "userInfo": {"username": "alice"}, "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "resize", "operation": "UPDATE", "namespace": "team", "name": "p", "object": new,
        "oldObject": old}})


# -- parsing ------------------------------------------------------------------------------------------------------


def test_a_resize_of_a_pod_not_bound_yet_is_a_pod_write_on_no_node() -> None:
    parsed = admission.parse_review(resize_review(old=raw_pod("p", {"cpu": "100m"}, uid="u"),
                                                  new=raw_pod("p", {"cpu": "64"}, uid="u")))
    assert isinstance(parsed, admission.PodWriteRequest)
    assert (parsed.operation, parsed.node, parsed.pod_key) == ("resize", "", "team/p")


def test_a_bindings_resource_version_is_read_on_the_fast_path_and_the_checked_one() -> None:
    sent = review(pod_name="p", uid="u", node="n1", user=WORKER, resource_version="42")
    parsed = admission.parse_review(orjson.dumps(sent))
    assert isinstance(parsed, admission.BindingRequest) and parsed.resource_version == "42"
    sent["request"]["dryRun"] = True  # leaves the fast path
    parsed = admission.parse_review(orjson.dumps(sent))
    assert isinstance(parsed, admission.BindingRequest) and (parsed.resource_version, parsed.dry_run) == ("42", True)
    unpinned = admission.parse_review(orjson.dumps(review(pod_name="p", uid="u", node="n1")))
    assert isinstance(unpinned, admission.BindingRequest) and unpinned.resource_version == ""


def test_a_workers_view_of_a_pod_carries_the_version_its_work_item_was_made_from() -> None:
    raw = raw_pod("p", {"cpu": "1"}, uid="u")
    raw["metadata"]["resourceVersion"] = "1234"
    form = compact.compact_pod(raw)
    assert parse_pod(form).resource_version == "1234"
    # a write to the pod's status alone (a worker's PodScheduled=False) moves its resourceVersion but schedules it
    # the same way: no new version for the dispatcher to send; a label is one
    written = {**raw, "metadata": {**raw["metadata"], "resourceVersion": "1235"},
               "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    assert compact.compact_pod(written)["metadata"]["resourceVersion"] == "1235"
    assert compact.digest(compact.compact_pod(written)) == compact.digest(form)
    assert compact.same_but_version(form, written)
    labelled = {**written, "metadata": {**written["metadata"], "labels": {"app": "other"}}}
    assert compact.digest(compact.compact_pod(labelled)) != compact.digest(form)
    assert not compact.same_but_version(form, labelled)
    resized = {**written, "spec": {**raw["spec"], "containers": [
        {**raw["spec"]["containers"][0], "resources": {"requests": {"cpu": "2"}}}]}}
    assert not compact.same_but_version(form, resized)
    deleting = {**written, "metadata": {**written["metadata"], "deletionTimestamp": "2026-11-27T20:00:00Z"}}
    assert not compact.same_but_version(form, deleting)


# -- the ledger's scripts -----------------------------------------------------------------------------------------


async def cpu(ledger: Ledger, node: str = "n1") -> int:
    return (await ledger.node_usage([node]))[node][1].get("cpu", 0)


async def admitted(ledger: Ledger, uid: str = "p", request: dict[str, int] | None = None) -> None:
    """A foreign binding of the pod to n1 the webhook admitted (the apiserver may still refuse it)."""
    assert await ledger.confirm(uid=uid, pod=f"team/{uid}", node="n1", request=request or SMALL, owner="foreign:x",
                                verify_after_seconds=60) == Confirmed(node="n1", foreign=True)


async def fill(ledger: Ledger) -> None:
    assert await ledger.confirm(uid="filler", pod="team/filler", node="n1", request=FILLER, owner="foreign:x",
                                verify_after_seconds=60, via="create") == Confirmed(node="n1", foreign=True)


async def test_a_binding_asking_more_than_its_entry_is_refused_when_the_growth_does_not_fit(ledger: Ledger) -> None:
    await admitted(ledger)
    await fill(ledger)
    refused = await ledger.confirm(uid="p", pod="team/p", node="n1", request=HUGE, owner="foreign:x",
                                   verify_after_seconds=60)
    assert refused == Conflict(node="n1", resource="cpu", wanted=64000, free=100)
    assert await cpu(ledger) == 4000, "the entry keeps what it held"


async def test_a_binding_asking_more_than_its_entry_grows_it_when_the_growth_fits(ledger: Ledger) -> None:
    await admitted(ledger)
    grown = {"cpu": 3000, "pods": 1}
    assert await ledger.confirm(uid="p", pod="team/p", node="n1", request=grown, owner="foreign:x",
                                verify_after_seconds=60) == Confirmed(node="n1", foreign=False)
    assert await cpu(ledger) == 3000
    # asking less never shrinks what the entry holds (the write the first admission allowed may still commit)
    assert await ledger.confirm(uid="p", pod="team/p", node="n1", request=SMALL, owner="foreign:x",
                                verify_after_seconds=60) == Confirmed(node="n1", foreign=False)
    assert await cpu(ledger) == 3000


async def test_a_dry_run_binding_checks_the_growth_and_writes_nothing(ledger: Ledger) -> None:
    await admitted(ledger)
    assert await ledger.confirm(uid="p", pod="team/p", node="n1", request={"cpu": 3000, "pods": 1},
                                owner="foreign:x", verify_after_seconds=60, dry_run=True) == Confirmed("n1", False)
    assert await cpu(ledger) == 100


async def test_a_resize_of_a_pod_not_bound_yet_is_judged_on_the_node_of_its_entry(ledger: Ledger) -> None:
    await admitted(ledger)
    await fill(ledger)
    refused = await ledger.resize(uid="p", pod="team/p", node="", request=HUGE, owner="alice",
                                  verify_after_seconds=60)
    assert refused == Conflict(node="n1", resource="cpu", wanted=64000, free=100)
    assert await cpu(ledger) == 4000
    # and a later binding judged from the pod's old request counts nothing the refused resize asked
    assert await ledger.confirm(uid="p", pod="team/p", node="n1", request=SMALL, owner="foreign:x",
                                verify_after_seconds=60) == Confirmed(node="n1", foreign=False)


async def test_a_resize_of_a_pod_not_bound_yet_that_fits_grows_its_entry(ledger: Ledger) -> None:
    await ledger.reserve(uid="p", pod="team/p", node="n1", request={"cpu": 1000, "memory": 512, "pods": 1},
                         owner="w1", ttl_seconds=30)
    # more cpu, less memory: the entry holds the larger of each until the sync sees the pod bound
    assert await ledger.resize(uid="p", pod="team/p", node="", request={"cpu": 2000, "memory": 256, "pods": 1},
                               owner="alice", verify_after_seconds=60) == Confirmed(node="n1", foreign=False)
    (entry,) = await ledger.entries()
    assert (entry.state, entry.request) == ("assumed", {"cpu": 2000, "memory": 512, "pods": 1})


async def test_a_resize_of_a_pod_with_no_entry_is_remembered_for_a_binding_judged_from_its_old_request(
    ledger: Ledger,
) -> None:
    await fill(ledger)
    assert await ledger.resize(uid="p", pod="team/p", node="", request=HUGE, owner="alice",
                               verify_after_seconds=60) == Confirmed(node="", foreign=False)
    assert await cpu(ledger) == 3900, "nothing is held for a pod without node or entry"
    # the sync's index still had the pod at 100m: the binding is judged for 64 cpu
    refused = await ledger.confirm(uid="p", pod="team/p", node="n1", request=SMALL, owner="foreign:x",
                                   verify_after_seconds=60)
    assert refused == Conflict(node="n1", resource="cpu", wanted=64000, free=100)
    # and a worker's reservation made from an old work item is checked for it when its binding is confirmed
    await ledger.reserve(uid="p", pod="team/p", node="n2", request=SMALL, owner="w1", ttl_seconds=30)
    refused = await ledger.confirm(uid="p", pod="team/p", node="n2", request=None, owner=WORKER,
                                   verify_after_seconds=60)
    assert refused == Conflict(node="n2", resource="cpu", wanted=64000, free=4000)


async def test_a_dry_run_resize_remembers_nothing(ledger: Ledger) -> None:
    assert await ledger.resize(uid="p", pod="team/p", node="", request=HUGE, owner="alice",
                               verify_after_seconds=60, dry_run=True) == Confirmed(node="", foreign=False)
    await admitted(ledger)
    assert await cpu(ledger) == 100


async def test_the_remembered_growth_expires(ledger: Ledger, fake_redis: Any) -> None:
    await ledger.resize(uid="p", pod="team/p", node="", request=HUGE, owner="alice", verify_after_seconds=60,
                        grown_ttl_seconds=600)
    ttl = await fake_redis.pttl("{hoss}:grown:p")
    assert 0 < ttl <= 600_000


async def test_an_unauthenticated_resize_that_grows_an_entry_is_due_for_a_check(
    ledger: Ledger, fake_redis: Any,
) -> None:
    await ledger.bind(uid="p", pod="team/p", node="n1", request=SMALL)
    assert await ledger.resize(uid="p", pod="team/p", node="n1", request={"cpu": 2000, "pods": 1}, owner="x",
                               verify_after_seconds=60, check_after_seconds=600) == Confirmed("n1", False)
    assert await fake_redis.zscore("{hoss}:resized", "p") > 0
    assert await ledger.resized_due() == [], "not due for ten minutes"
    await fake_redis.zadd("{hoss}:resized", {"p": 0})  # its time has come
    assert await ledger.resized_due() == ["p"]
    assert await ledger.resized_due() == [], "taken out of line: checked once"


async def test_an_authenticated_resize_needs_no_check(ledger: Ledger, fake_redis: Any) -> None:
    await ledger.bind(uid="p", pod="team/p", node="n1", request=SMALL)
    await ledger.resize(uid="p", pod="team/p", node="n1", request={"cpu": 2000, "pods": 1}, owner="x",
                        verify_after_seconds=60)
    assert await fake_redis.zcard("{hoss}:resized") == 0


# -- the webhook ----------------------------------------------------------------------------------------------------


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[Webhook]:
    async for hook in start(tmp_path, get_pod=PodReads(pod("grown", "u-grown", "3"))):
        yield hook


async def test_a_hoss_binding_naming_the_pods_version_is_judged_by_its_reservation(webhook: Webhook) -> None:
    """The apiserver binds the pod only at that version, whose request the worker reserved: no lookup."""
    await webhook.ledger.reserve(uid="u-grown", pod="team/grown", node="n1", request={"cpu": 500, "pods": 1},
                                 owner=WORKER, ttl_seconds=30)
    await webhook.ledger.reserve(uid="other", pod="team/other", node="n1", request={"cpu": 1500, "pods": 1},
                                 owner=WORKER, ttl_seconds=30)
    _, body = await webhook.post(review(pod_name="grown", uid="u-grown", node="n1", user=WORKER,
                                        resource_version="7"))
    assert body["response"]["allowed"] is True


async def test_a_hoss_binding_without_the_pods_version_is_checked_against_the_pods_request(
    webhook: Webhook,
) -> None:
    """Without a version the apiserver binds the pod as it is then: the pod (3 cpu, resized since the worker
    reserved 500m) is read, and its growth does not fit beside the other pod."""
    await webhook.ledger.reserve(uid="u-grown", pod="team/grown", node="n1", request={"cpu": 500, "pods": 1},
                                 owner=WORKER, ttl_seconds=30)
    await webhook.ledger.reserve(uid="other", pod="team/other", node="n1", request={"cpu": 1500, "pods": 1},
                                 owner=WORKER, ttl_seconds=30)
    _, body = await webhook.post(review(pod_name="grown", uid="u-grown", node="n1", user=WORKER))
    assert body["response"]["status"]["message"] == (
        "hoss: node n1 has no room for team/grown: cpu requested 3, free 500m")
