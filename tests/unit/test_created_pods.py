"""Pods created with spec.nodeName whose create may fail after the webhook: a name another pod holds is answered
AlreadyExists and holds nothing, and one user's creates not yet confirmed hold at most one node's room."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hoss.ledger.arguments import Placement
from hoss.model import admission
from resolver.judge import name_taken
from tests.unit.webhooks import NODE_ROOM, PodReads, Webhook, pod, review, start


def create(name: str, uid: str, cpu: str, *, node: str = "n1", user: str = "alice") -> dict[str, Any]:
    obj = pod(name, uid, cpu)
    obj["spec"]["nodeName"] = node
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": f"review-{uid}", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": name, "namespace": "team", "operation": "CREATE", "userInfo": {"username": user}, "object": obj,
    }}


def write(name: str) -> admission.PodWriteRequest:
    return admission.PodWriteRequest(review_uid="r", namespace="team", pod=name, node="n1", username="alice",
                                      operation="create", object={})


def test_a_name_held_by_another_pod_is_answered_as_the_apiserver_answers_it() -> None:
    held = {"metadata": {"name": "web", "uid": "u-old"}}
    verdict = name_taken(write("web"), held, uid="u-new")
    assert verdict is not None and not verdict.allowed
    assert (verdict.code, verdict.status_reason, verdict.message) == (409, "AlreadyExists",
                                                                       'hoss: pods "web" already exists')
    leaving = {"metadata": {"name": "web", "uid": "u-old", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    verdict = name_taken(write("web"), leaving, uid="u-new")
    assert verdict is not None and verdict.message == 'hoss: object is being deleted: pods "web" already exists'
    assert name_taken(write("web"), None, uid="u-new") is None


async def test_a_create_under_a_taken_name_holds_no_room_and_the_next_create_gets_it(tmp_path: Path) -> None:
    reads = PodReads(pod("web", "u-old", "100m"))
    async for hook in start(tmp_path, get_pod=reads):
        _, body = await hook.post(create("web", "u-new", "2"))
        assert body["response"]["status"] == {"code": 409, "reason": "AlreadyExists",
                                              "message": 'hoss: pods "web" already exists'}
        assert await hook.ledger.entries() == []
        _, body = await hook.post(create("api", "u-api", "2"))
        assert body["response"]["allowed"] is True
        assert reads.reads == ["team/web", "team/api"]


async def two_nodes(hook: Webhook) -> None:
    await hook.ledger.rebuild(nodes=[("n1", NODE_ROOM, {}), ("n2", NODE_ROOM, {})], bound=[])


async def test_one_users_unconfirmed_creates_hold_at_most_one_nodes_room(tmp_path: Path) -> None:
    async for hook in start(tmp_path):
        await two_nodes(hook)
        _, body = await hook.post(create("a1", "u-a1", "1500m", node="n1"))
        assert body["response"]["allowed"] is True
        _, body = await hook.post(create("a2", "u-a2", "1", node="n2"))
        assert body["response"]["status"] == {
            "code": 429, "reason": "TooManyRequests",
            "message": "hoss: alice's pods created on nodes and not yet confirmed hold 1500m cpu; team/a2 asks 1 "
                       "more, past node n2's allocatable 2 (the most one user's unconfirmed creates may hold); retry "
                       "once they are bound or refused",
        }
        _, body = await hook.post(create("a3", "u-a3", "500m", node="n2"))
        assert body["response"]["allowed"] is True, "up to one node's allocatable in all"
        _, body = await hook.post(create("b1", "u-b1", "1", node="n2", user="bob"))
        assert body["response"]["allowed"] is True, "another user's creates are counted apart"
        # The sync sees a1 and a3 bound: they are confirmed, and alice may create again.
        await hook.ledger.bind_many([
            Placement(uid="u-a1", pod="team/a1", node="n1", request={"cpu": 1500, "pods": 1}),
            Placement(uid="u-a3", pod="team/a3", node="n2", request={"cpu": 500, "pods": 1}),
        ])
        _, body = await hook.post(create("a4", "u-a4", "500m", node="n1"))
        assert body["response"]["allowed"] is True


async def test_bindings_are_not_limited_by_the_binders_unconfirmed_creates(tmp_path: Path) -> None:
    async for hook in start(tmp_path):
        await two_nodes(hook)
        _, body = await hook.post(create("k1", "u-k1", "1500m", node="n1", user="system:kube-scheduler"))
        assert body["response"]["allowed"] is True
        # the fixture's pod "mine" asks 1 CPU: 1500m + 1 would pass a node's 2 if bindings counted
        _, body = await hook.post(review(pod_name="mine", uid="u-mine", node="n2"))
        assert body["response"]["allowed"] is True
