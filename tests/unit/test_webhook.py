"""The webhook over real HTTPS, in process, with the ledger on fakeredis."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hoss.ledger.arguments import Placement
from hoss.ledger.results import Reserved
from hoss.model.admission import BINDING_LANES, SERVED_LANES, lane_path
from resolver.metrics import LatencyWindow
from resolver.stats import stats_fields
from tests.unit.webhooks import NODE_ROOM, WORKER, PodReads, Webhook, pod, review, start


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[Webhook]:
    async for hook in start(tmp_path):
        yield hook


async def test_foreign_binding_that_fits_is_allowed_and_recorded_in_the_ledger(webhook: Webhook) -> None:
    status, body = await webhook.post(review(pod_name="small", uid="u-small", node="n1"))
    assert status == 200
    assert body["response"] == {"uid": "review-1", "allowed": True}
    usage = await webhook.ledger.node_usage(["n1"])
    assert usage["n1"][1]["cpu"] == 500


async def test_binding_that_does_not_fit_is_denied_with_409_naming_node_resource_requested_and_free(
    webhook: Webhook,
) -> None:
    status, body = await webhook.post(review(pod_name="big", uid="u-big", node="n1"))
    assert status == 200
    response = body["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 409
    assert response["status"]["message"] == "hoss: node n1 has no room for team/big: cpu requested 3, free 2"
    assert webhook.state.denials[-1].pod == "team/big"


async def test_every_lane_path_judges_bindings_alike(webhook: Webhook) -> None:
    """deploy/webhook.yaml's binding lanes call paths of their own (hoss/model/admission.py); each judges alike."""
    for lane in range(1, BINDING_LANES):
        status, body = await webhook.post(review(pod_name="big", uid="u-big", node="n1"), path=lane_path(lane))
        assert status == 200 and body["response"]["status"]["code"] == 409, (lane, body)
    status, body = await webhook.post(review(pod_name="small", uid="u-small", node="n1"), path=lane_path(3))
    assert status == 200 and body["response"] == {"uid": "review-1", "allowed": True}
    assert (await webhook.ledger.node_usage(["n1"]))["n1"][1]["cpu"] == 500


async def test_lane_paths_beyond_the_shipped_lanes_are_judged_during_an_upgrade(webhook: Webhook) -> None:
    """A later version's webhook configuration may register more lanes than this resolver's; while an upgrade
    rolls, its reviews reach this resolver, which judges them (a 404 would deny every such binding)."""
    status, body = await webhook.post(review(pod_name="big", uid="u-big", node="n1"),
                                      path=lane_path(SERVED_LANES - 1))
    assert SERVED_LANES > BINDING_LANES
    assert status == 200 and body["response"]["status"]["code"] == 409, body
    async with webhook.session.post(f"{webhook.url}{lane_path(SERVED_LANES)}", data=b"{}") as response:
        assert response.status == 404


async def test_binding_to_the_reserved_node_is_allowed_even_when_the_node_is_now_full(webhook: Webhook) -> None:
    reserved = await webhook.ledger.reserve(
        uid="u-mine", pod="team/mine", node="n1", request={"cpu": 1000, "pods": 1}, owner=WORKER, ttl_seconds=30
    )
    assert reserved == Reserved(node="n1")
    await webhook.ledger.reserve(
        uid="u-other", pod="team/other", node="n1", request={"cpu": 1000, "pods": 1}, owner=WORKER, ttl_seconds=30
    )
    status, body = await webhook.post(review(pod_name="mine", uid="u-mine", node="n1", user=WORKER))
    assert (status, body["response"]["allowed"]) == (200, True)


async def test_a_binding_without_uid_is_refused_whatever_room_the_node_has(webhook: Webhook) -> None:
    _, body = await webhook.post(review(pod_name="small", uid=None, node="n1"))
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 400
    assert body["response"]["status"]["message"] == (
        "hoss: the binding of team/small to node n1 has no metadata.uid; set it to the pod's uid")
    assert (await webhook.ledger.node_usage(["n1"]))["n1"][1].get("cpu", 0) == 0


async def test_unknown_node_and_unknown_pod_are_denied_with_the_reason(webhook: Webhook) -> None:
    _, body = await webhook.post(review(pod_name="small", uid="u-small", node="ghost"))
    assert "node ghost is not in the ledger" in body["response"]["status"]["message"]
    _, body = await webhook.post(review(pod_name="nobody", uid="u-nobody", node="n1"))
    assert "pod team/nobody is not known" in body["response"]["status"]["message"]


async def test_ledger_that_lost_its_data_fails_closed(webhook: Webhook) -> None:
    await webhook.redis.flushall()
    _, body = await webhook.post(review(pod_name="small", uid="u-small", node="n1"))
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 503
    assert "ledger is not ready" in body["response"]["status"]["message"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "body is not JSON"),
        (b"[]", "must be a JSON object"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(), "apiVersion"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "x"}})
         .encode(), "request.resource"),
    ],
)
async def test_malformed_review_gets_http_400_with_the_reason(webhook: Webhook, body: bytes, reason: str) -> None:
    status, answer = await webhook.post(body)
    assert status == 400
    assert reason in answer["error"]


def review_with(**request: Any) -> bytes:
    body = review(pod_name="small", uid="u-small", node="n1")
    body["request"].update(request)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (review_with(uid=5), "request.uid: expected a string, got 5"),
        (review_with(operation=None), "request.operation: missing"),
        (review_with(userInfo="bob"), "request.userInfo: expected an object, got 'bob'"),
        (review_with(object=None), "request.object: expected a Binding, got None"),
        (review_with(object={"target": {"kind": "Pod", "name": "n1"}}),
         "request.object.target.kind: expected Node, got 'Pod'"),
        (review_with(object={"target": {"name": ""}}), "request.object.target.name: expected a node name, got ''"),
        (review_with(object={"metadata": {"uid": 7}, "target": {"name": "n1"}}),
         "request.object.metadata.uid: expected a string, got 7"),
    ],
)
async def test_a_malformed_field_is_named_with_its_value(webhook: Webhook, body: bytes, reason: str) -> None:
    status, answer = await webhook.post(body)
    assert status == 400
    assert reason in answer["error"]


async def test_reviews_of_other_resources_are_allowed_untouched(webhook: Webhook) -> None:
    body = review(pod_name="big", uid="u-big", node="n1")
    body["request"]["resource"] = {"group": "example.com", "version": "v1", "resource": "pods"}
    _, answer = await webhook.post(body)
    assert answer["response"] == {"uid": "review-1", "allowed": True}


async def test_oversized_review_gets_http_400(webhook: Webhook) -> None:
    huge = json.dumps(review(pod_name="small", uid="u-small", node="n1") | {"padding": "x" * (2 << 20)}).encode()
    status, answer = await webhook.post(huge)
    assert status == 400
    assert "larger than" in answer["error"]


async def test_hoss_only_mode_lets_foreign_bindings_through_unchecked(tmp_path: Path) -> None:
    async for hook in start(tmp_path, enforce="hoss-only"):
        _, body = await hook.post(review(pod_name="big", uid="u-big", node="n1"))
        assert body["response"]["allowed"] is True
        _, body = await hook.post(review(pod_name="big", uid="u-big", node="n1", user=WORKER))
        assert body["response"]["allowed"] is False


async def test_metrics_and_status_count_the_verdicts(webhook: Webhook) -> None:
    await webhook.post(review(pod_name="small", uid="u-small", node="n1"))
    await webhook.post(review(pod_name="big", uid="u-big", node="n1"))
    async with webhook.session.get(f"{webhook.url}/metrics") as response:
        text = await response.text()
    assert 'hoss_resolver_verdicts_total{allowed="false",reason="conflict"} 1.0' in text
    assert "hoss_resolver_review_duration_seconds_bucket" in text
    async with webhook.session.get(f"{webhook.url}/status") as response:
        status = await response.json()
    assert status["verdicts"] == {"fits": 1, "conflict": 1}
    assert status["recent_denials"][0]["node"] == "n1"
    async with webhook.session.get(f"{webhook.url}/readyz") as response:
        assert response.status == 200


async def test_a_hoss_binding_is_judged_by_its_reservation_without_reading_the_pod(tmp_path: Path) -> None:
    reads = PodReads()
    async for hook in start(tmp_path, get_pod=reads):
        await hook.ledger.rebuild(nodes=[("n1", NODE_ROOM, {}), ("n2", NODE_ROOM, {})], bound=[])
        await hook.ledger.reserve(uid="u-new", pod="team/new", node="n1", request={"cpu": 1500, "pods": 1},
                                  owner=WORKER, ttl_seconds=30)
        _, body = await hook.post(review(pod_name="new", uid="u-new", node="n1", user=WORKER, resource_version="7"))
        assert body["response"]["allowed"] is True
        _, body = await hook.post(review(pod_name="new", uid="u-new", node="n2", user=WORKER, resource_version="7"))
        assert "already holds resources on node n1" in body["response"]["status"]["message"]
        assert reads.reads == []
        assert hook.state.verdict_counts == {"reserved": 1, "held-elsewhere": 1}


async def test_a_binding_without_a_reservation_reads_the_pod_once_and_is_fit_checked(tmp_path: Path) -> None:
    reads = PodReads(pod("late", "u-late", "1"), pod("huge", "u-huge", "4"))
    async for hook in start(tmp_path, get_pod=reads):
        # a hoss binding whose reservation expired: the ledger asks for the request, and the pod still fits
        _, body = await hook.post(review(pod_name="late", uid="u-late", node="n1", user=WORKER))
        assert body["response"]["allowed"] is True
        # a foreign binding of a pod no index knows: read, then fit-checked
        _, body = await hook.post(review(pod_name="huge", uid="u-huge", node="n1"))
        assert body["response"]["status"]["message"] == (
            "hoss: node n1 has no room for team/huge: cpu requested 4, free 1"
        )
        assert reads.reads == ["team/late", "team/huge"]
        entries = {e.uid: (e.node, e.request.get("cpu")) for e in await hook.ledger.entries()}
        assert entries == {"u-late": ("n1", 1000)}


async def test_a_pod_the_apiserver_does_not_have_or_that_was_replaced_is_denied(tmp_path: Path) -> None:
    reads = PodReads(pod("reborn", "u-new-life", "1"))
    async for hook in start(tmp_path, get_pod=reads):
        _, body = await hook.post(review(pod_name="gone", uid="u-gone", node="n1"))
        assert "pod team/gone is not known" in body["response"]["status"]["message"]
        _, body = await hook.post(review(pod_name="reborn", uid="u-old-life", node="n1"))
        assert "pod team/reborn is not known" in body["response"]["status"]["message"]
        assert await hook.ledger.entries() == []


async def test_review_latency_p50_and_p99_are_reported_in_metrics_status_and_the_stats_hash(
    webhook: Webhook,
) -> None:
    for _ in range(3):
        await webhook.post(review(pod_name="small", uid="u-small", node="n1"))
    async with webhook.session.get(f"{webhook.url}/metrics") as response:
        text = await response.text()
    assert "hoss_resolver_review_latency_p50_seconds " in text
    assert "hoss_resolver_review_latency_p99_seconds " in text
    async with webhook.session.get(f"{webhook.url}/status") as response:
        status = await response.json()
    latency = status["review_latency_ms"]
    assert latency["count"] == 3
    assert 0 < latency["p50"] <= latency["p99"] < 1000
    fields = stats_fields(webhook.state)
    assert float(fields["review_p50_ms"]) == latency["p50"]
    assert float(fields["review_p99_ms"]) == latency["p99"]
    assert json.loads(fields["verdicts"]) == {"fits": 1, "reserved": 2}, "the first binding recorded the pod"


def test_the_latency_window_keeps_the_most_recent_reviews() -> None:
    window = LatencyWindow(size=100)
    assert window.summary_ms() == {"p50": None, "p99": None, "count": 0}
    for ms in range(1, 1001):
        window.add(ms / 1000)
    assert window.count == 100
    assert window.summary_ms() == {"p50": 950.0, "p99": 999.0, "count": 100}


def pod_write(*, operation: str, obj: dict[str, Any], old: dict[str, Any] | None = None,
              namespace: str = "team", user: str = "alice", groups: tuple[str, ...] = ()) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "review-2", "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": obj["metadata"]["name"], "namespace": namespace, "operation": operation,
        "userInfo": {"username": user, "groups": list(groups)}, "object": obj,
    }
    if operation == "UPDATE":
        request["subResource"] = "resize"
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def on_node(spec: dict[str, Any], node: str = "n1") -> dict[str, Any]:
    return {**spec, "spec": {**spec["spec"], "nodeName": node}}


async def test_a_pod_created_on_a_node_is_judged_and_its_nodes_own_mirror_pod_is_not(webhook: Webhook) -> None:
    _, body = await webhook.post(pod_write(operation="CREATE", obj=on_node(pod("c1", "u-c1", "1500m"))))
    assert body["response"]["allowed"] is True
    _, body = await webhook.post(pod_write(operation="CREATE", obj=on_node(pod("c2", "u-c2", "1"))))
    assert body["response"]["status"]["message"] == "hoss: node n1 has no room for team/c2: cpu requested 1, free 500m"
    mirror = on_node(pod("m", "u-m", "1"))
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    _, body = await webhook.post(pod_write(operation="CREATE", obj=mirror, user="system:node:n1",
                                           groups=("system:nodes", "system:authenticated")))
    assert body["response"]["allowed"] is True
    assert webhook.state.verdict_counts["mirror-pod"] == 1
    assert (await webhook.ledger.node_usage(["n1"]))["n1"][1]["cpu"] == 1500


@pytest.mark.parametrize(("user", "groups"), [
    ("alice", ()),                                   # anyone may write the annotation
    ("system:node:n1", ()),                          # the node's name without the nodes' group
    ("system:node:n2", ("system:nodes",)),           # another node's kubelet
    ("alice", ("system:nodes",)),                    # the group without the node's name
])
async def test_a_mirror_annotation_from_anyone_but_the_pods_own_node_is_judged_like_any_pod(
    webhook: Webhook, user: str, groups: tuple[str, ...],
) -> None:
    await webhook.ledger.bind_many([Placement(uid="u-full", pod="team/full", node="n1", request={"cpu": 2000})])
    forged = on_node(pod("forged", "u-forged", "16"))
    forged["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    _, body = await webhook.post(pod_write(operation="CREATE", obj=forged, user=user, groups=groups))
    assert body["response"]["status"]["message"] == (
        "hoss: node n1 has no room for team/forged: cpu requested 16, free 0")
    assert webhook.state.verdict_counts["mirror-pod"] == 0


async def test_a_resize_is_judged_only_when_it_grows(webhook: Webhook) -> None:
    before = on_node(pod("r", "u-r", "1"))
    await webhook.ledger.bind_many([Placement(uid="u-r", pod="team/r", node="n1", request={"cpu": 1000, "pods": 1})])
    _, body = await webhook.post(pod_write(operation="UPDATE", obj=on_node(pod("r", "u-r", "500m")), old=before))
    assert (body["response"]["allowed"], webhook.state.verdict_counts["resize-not-growing"]) == (True, 1)
    _, body = await webhook.post(pod_write(operation="UPDATE", obj=on_node(pod("r", "u-r", "3")), old=before))
    assert body["response"]["status"]["message"] == "hoss: node n1 has no room for team/r: cpu requested 3, free 2"
    _, body = await webhook.post(pod_write(operation="UPDATE", obj=on_node(pod("r", "u-r", "2")), old=before))
    assert body["response"]["allowed"] is True
    assert (await webhook.ledger.node_usage(["n1"]))["n1"][1]["cpu"] == 2000


async def test_the_system_entry_lets_through_what_the_ledger_cannot_judge_and_judges_the_rest(
    webhook: Webhook,
) -> None:
    async def post_system(body: dict[str, Any]) -> dict[str, Any]:
        data = io.BytesIO(json.dumps(body).encode())
        async with webhook.session.post(f"{webhook.url}/validate-system", data=data) as response:
            reply: dict[str, Any] = await response.json()
            return reply

    over = pod_write(operation="CREATE", obj=on_node(pod("s", "u-s", "3")), namespace="kube-system")
    assert (await post_system(over))["response"]["allowed"] is False, "a write that oversells is refused there too"
    await webhook.ledger.mark_not_ready()
    assert (await post_system(over))["response"]["allowed"] is True
    _, body = await webhook.post(over)
    assert body["response"]["allowed"] is False, "elsewhere a ledger that is not ready refuses"
    assert webhook.state.verdict_counts["system-unjudged"] == 1
