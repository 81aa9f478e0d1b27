"""Koordinator Reservations read as Koordinator defines them (hoss/model/reservations.py), and the resolver's sync
keeping an Available Reservation's room in the ledger until it is used, fails or is deleted."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import orjson
import pytest
from kubernetes_asyncio import client

from dispatcher.reservations import owners_status
from hoss.ledger.client import Ledger
from hoss.ledger.keys import reservation_key
from hoss.ledger.results import ReservationOwner, ReservationShares
from hoss.model import reservations
from hoss.model.reservations import ReservationError, as_pod, owns, parse, parse_duration
from resolver.sync import LedgerSync
from workers.reservations import Hint, hints_of

NOW = "2026-11-23T00:00:00Z"


def raw(*, owners: list[Any] | None = None, phase: str = "", node: str = "", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "r1", "uid": "uid-r1", "creationTimestamp": NOW, "resourceVersion": "7"},
        "spec": {"template": {"metadata": {"namespace": "team", "labels": {"x": "y"}}, "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "4"}}}]}},
                 "owners": owners if owners is not None else [{"labelSelector": {"matchLabels": {"app": "train"}}}],
                 **spec},
        "status": {"phase": phase, "nodeName": node} if phase else {},
    }


def test_durations_are_go_durations() -> None:
    assert parse_duration("90s", field="spec.ttl") == 90
    assert parse_duration("1h30m", field="spec.ttl") == 5400
    assert parse_duration("1.5m", field="spec.ttl") == 90
    for bad in ("", "10", "ten minutes", "5d"):
        with pytest.raises(ReservationError, match=r"spec\.ttl: invalid duration"):
            parse_duration(bad, field="spec.ttl")


def test_expiry_from_ttl_expires_or_a_day() -> None:
    created = parse(raw()).expires_unix - reservations.DEFAULT_TTL_SECONDS
    assert parse(raw(ttl="10m")).expires_unix == created + 600
    assert parse(raw(ttl="10m", expires="2026-11-23T01:00:00Z")).expires_unix == created + 3600


def test_a_ttl_of_zero_never_expires() -> None:
    assert parse(raw(ttl="0")).expires_unix == math.inf
    assert parse(raw(ttl="0s")).expires_unix == math.inf


def test_a_template_node_name_pins_the_room_to_that_node_whatever_else_the_template_asks() -> None:
    template_affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
    pinned = raw()
    pinned["spec"]["template"]["spec"].update(nodeName="n7", affinity=template_affinity)
    pod_spec = as_pod(parse(pinned), scheduler_name="hoss")["spec"]
    assert "nodeName" not in pod_spec
    [term] = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term == {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}


def test_unschedulable_and_untolerated_taints_keep_new_owners_off_an_available_reservation() -> None:
    assert reservations.usable_by(parse(raw(phase="Available", node="n1")), [])
    assert not reservations.usable_by(parse(raw(phase="Available", node="n1", unschedulable=True)), [])
    tainted = parse(raw(phase="Available", node="n1", taints=[{"key": "team", "value": "a", "effect": "NoSchedule"}]))
    assert not reservations.usable_by(tainted, [])
    assert not reservations.usable_by(tainted, [{"key": "team", "operator": "Equal", "value": "b"}])
    assert reservations.usable_by(tainted, [{"key": "team", "operator": "Equal", "value": "a"}])
    assert reservations.usable_by(tainted, [{"operator": "Exists"}])


def test_a_restricted_reservation_serves_only_an_owner_whose_reserved_requests_fit() -> None:
    restricted = parse(raw(phase="Available", node="n1", allocatePolicy="Restricted"))
    [hint] = hints_of({reservations.HINTS: reservations.hints([restricted])})
    assert hint.restricted and hint.once
    assert hint.serves({"cpu": 2000, "nvidia.com/gpu": 4, "memory": 10})
    assert not hint.serves({"cpu": 3000})
    [aligned] = hints_of({reservations.HINTS: reservations.hints([parse(raw(phase="Available", node="n1"))])})
    assert aligned.serves({"cpu": 3000}), "Aligned: what the Reservation lacks comes from the node"


def test_the_view_and_its_request() -> None:
    view = parse(raw(phase="Available", node="n1"))
    assert view.available and not view.pending and view.allocate_once
    assert view.request["nvidia.com/gpu"] == 4 and view.request["cpu"] == 2000
    assert parse(raw()).pending


@pytest.mark.parametrize(("change", "field"), [
    ({"owners": []}, "spec.owners"),
    ({"owners": [{"name": "x"}]}, "spec.owners[0]"),
    ({"allocateOnce": "yes"}, "spec.allocateOnce"),
    ({"ttl": "forever"}, "spec.ttl"),
    ({"expires": "tomorrow"}, "spec.expires"),
    ({"preAllocation": True}, "spec.preAllocation"),
    ({"allocatePolicy": "Default"}, "spec.allocatePolicy"),
    ({"unschedulable": "no"}, "spec.unschedulable"),
    ({"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}, "spec.taints[0].effect"),
    ({"reserveFor": "ever"}, "spec.reserveFor"),
])
def test_bad_fields_are_named(change: dict[str, Any], field: str) -> None:
    broken = raw()
    broken["spec"].update(change)
    with pytest.raises(ReservationError) as raised:
        parse(broken)
    assert str(raised.value).startswith(field)


def pod(labels: dict[str, str] | None = None, *, controller: dict[str, Any] | None = None,
        name: str = "p", namespace: str = "team") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": "pod-uid", "labels": labels or {}}
    if controller:
        metadata["ownerReferences"] = [{**controller, "controller": True}]
    return {"metadata": metadata}


def test_owners_by_label_selector_object_and_controller() -> None:
    by_label = parse(raw())
    assert owns(by_label, pod({"app": "train"})) and not owns(by_label, pod({"app": "serve"}))
    expressions = parse(raw(owners=[{"labelSelector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["a", "b"]}, {"key": "canary", "operator": "DoesNotExist"}]}}]))
    assert owns(expressions, pod({"app": "b"}))
    assert not owns(expressions, pod({"app": "b", "canary": "1"}))
    by_object = parse(raw(owners=[{"object": {"name": "p", "namespace": "team"}}]))
    assert owns(by_object, pod()) and not owns(by_object, pod(namespace="other"))
    job = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid"}
    by_controller = parse(raw(owners=[{"controller": {"name": "train", "kind": "Job", "namespace": "team"}}]))
    assert owns(by_controller, pod(controller=job))
    assert not owns(by_controller, pod(controller={**job, "name": "other"}))
    assert not owns(by_controller, pod())
    # Any one entry matching is enough.
    either = parse(raw(owners=[{"object": {"name": "q"}}, {"labelSelector": {"matchLabels": {"app": "train"}}}]))
    assert owns(either, pod({"app": "train"}))


def test_the_pod_the_dispatcher_places() -> None:
    made = as_pod(parse(raw()), scheduler_name="hoss")
    assert made["metadata"]["uid"] == "uid-r1" and made["metadata"]["namespace"] == "team"
    assert made["metadata"]["annotations"][reservations.ANNOTATION] == "r1"
    assert made["spec"]["schedulerName"] == "hoss"


@pytest.fixture
async def sync(fake_redis: fakeredis.FakeAsyncRedis) -> AsyncIterator[LedgerSync]:
    api = client.ApiClient()
    synced = LedgerSync(ledger=Ledger(fake_redis), api=api)
    synced.nodes["n1"] = ({"cpu": 8000, "nvidia.com/gpu": 8, "pods": 110}, {}, "")
    await synced.rebuild()
    yield synced
    await api.close()


def fresh(**kwargs: Any) -> dict[str, Any]:
    made = raw(**kwargs)
    made["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return made


async def test_the_sync_holds_available_reservations_and_frees_them_when_they_end(sync: LedgerSync) -> None:
    await sync._on_reservation_event("ADDED", fresh())
    assert await sync.ledger.entries() == []  # Pending: nothing held yet
    await sync._on_reservation_event("MODIFIED", fresh(phase="Available", node="n1"))
    [entry] = await sync.ledger.entries()
    assert (entry.uid, entry.pod, entry.state, entry.node) == ("uid-r1", reservation_key("r1"), "bound", "n1")
    assert entry.request["nvidia.com/gpu"] == 4
    assert await sync.audit() == []  # the audit counts it as the apiserver's truth
    await sync.rebuild()
    assert [e.uid for e in await sync.ledger.entries()] == ["uid-r1"]  # and a rebuild keeps it
    await sync._on_reservation_event("MODIFIED", fresh(phase="Succeeded", node="n1"))
    assert await sync.ledger.entries() == []
    await sync._on_reservation_event("MODIFIED", fresh(phase="Available", node="n1"))
    await sync._on_reservation_event("DELETED", fresh(phase="Available", node="n1"))
    assert await sync.ledger.entries() == []
    # An expired one holds nothing even before the dispatcher marks it Failed.
    await sync._on_reservation_event("MODIFIED", fresh(phase="Available", node="n1", expires=NOW))
    assert await sync.ledger.entries() == []


def test_a_shared_reservations_status_room_left_meta_and_hints() -> None:
    shared = raw(phase="Available", node="n1", allocateOnce=False)
    shared["status"].update({"allocated": {"cpu": "1500m", "nvidia.com/gpu": "3"},
                             "currentOwners": [{"namespace": "team", "name": "a", "uid": "uid-a"}]})
    view = parse(shared)
    assert not view.allocate_once and view.allocated == {"cpu": 1500, "nvidia.com/gpu": 3}
    assert view.room_left == {"cpu": 500, "nvidia.com/gpu": 1}  # no pod count: every owner is a pod of its own
    meta = orjson.loads(view.meta())
    assert meta["allocateOnce"] is False and meta["owners"] == ["uid-a"]
    assert reservations.hints([view]) == [["uid-r1", "r1", "n1", {"cpu": 500, "nvidia.com/gpu": 1}, False, False]]
    assert as_pod(view, scheduler_name="hoss")["metadata"]["annotations"][reservations.SHARED_ANNOTATION] == "false"
    # allocateOnce (the default): the whole room, no flag in the meta
    once = parse(raw(phase="Available", node="n1"))
    assert once.room_left == once.request and "allocateOnce" not in orjson.loads(once.meta())
    patch = reservations.shared_status(view, [{"namespace": "team", "name": "b", "uid": "uid-b"}],
                                       {"cpu": 1000, "nvidia.com/gpu": 2})
    assert patch == {"status": {"currentOwners": [{"namespace": "team", "name": "b", "uid": "uid-b"}],
                                "allocated": {"cpu": "1", "nvidia.com/gpu": "2"}}}
    assert reservations.available_status("n1", view.request)["status"]["allocatable"] == {
        "cpu": "2", "nvidia.com/gpu": "4"}


def test_the_owners_status_follows_the_ledgers_shares() -> None:
    shared = raw(phase="Available", node="n1", allocateOnce=False)
    shared["status"].update({"allocated": {"cpu": "1", "nvidia.com/gpu": "2"},
                             "currentOwners": [{"namespace": "team", "name": "a", "uid": "uid-a"}]})
    view = parse(shared)
    a = ReservationOwner(uid="uid-a", pod="team/a", node="n1", state="bound", share={"cpu": 1000, "nvidia.com/gpu": 2})
    b = ReservationOwner(uid="uid-b", pod="team/b", node="n1", state="assumed", share={"nvidia.com/gpu": 2})
    assert owners_status(view, ReservationShares(room={}, owners=(a,))) is None  # says so already
    assert owners_status(view, ReservationShares(room={}, owners=(a, b))) == {"status": {
        "currentOwners": [{"namespace": "team", "name": "a", "uid": "uid-a"},
                          {"namespace": "team", "name": "b", "uid": "uid-b"}],
        "allocated": {"cpu": "1", "nvidia.com/gpu": "4"}}}
    assert owners_status(view, ReservationShares(room={}, owners=())) == {"status": {
        "currentOwners": [], "allocated": {"cpu": "0", "nvidia.com/gpu": "0"}}}


def test_which_reservations_a_worker_gives_back_for_a_pod() -> None:
    shared = Hint(uid="u", name="r", node="n1", request={"cpu": 1000, "nvidia.com/gpu": 2, "pods": 1}, once=False)
    assert shared.serves({"cpu": 1000, "nvidia.com/gpu": 2, "pods": 1, "memory": 1 << 30})
    assert not shared.serves({"cpu": 1000, "nvidia.com/gpu": 3, "pods": 1})
    once = Hint(uid="u", name="r", node="n1", request={"nvidia.com/gpu": 2})
    assert once.serves({"nvidia.com/gpu": 8})  # the rest from the node's free room
    assert hints_of({reservations.HINTS: [["u", "r", "n1", {"cpu": 1}, False], ["v", "s", "n2", {"cpu": 2}]]}) == [
        Hint(uid="u", name="r", node="n1", request={"cpu": 1}, once=False),
        Hint(uid="v", name="s", node="n2", request={"cpu": 2}, once=True)]
