"""Parsing the pod writes the webhook judges besides bindings (a pod created on a node, an in-place resize, dry
runs), and the request of a pod being resized, counted as kube-scheduler counts it."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from hoss.model import admission
from hoss.model.resources import pod_requests, status_resources_key
from tests.kube_objects import Json, raw_pod


def review(request: dict[str, Any]) -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "r1", "userInfo": {"username": "alice"}, **request}})


def pod(node: str | None = None, cpu: str = "1") -> Json:
    return raw_pod("p", {"cpu": cpu}, uid="u1", namespace="ns", node=node)


def test_a_pod_created_on_a_node_is_a_pod_write() -> None:
    parsed = admission.parse_review(review({
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": "ns", "name": "p", "object": pod("n1"), "dryRun": True,
    }))
    assert isinstance(parsed, admission.PodWriteRequest)
    assert (parsed.operation, parsed.node, parsed.pod_key, parsed.dry_run) == ("create", "n1", "ns/p", True)


def test_a_pod_write_carries_the_writers_groups_and_names_a_malformed_list() -> None:
    request = {"resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
               "namespace": "ns", "name": "p", "object": pod("n1")}
    body = orjson.loads(review(request))
    body["request"]["userInfo"] = {"username": "system:node:n1", "groups": ["system:nodes", "system:authenticated"]}
    parsed = admission.parse_review(orjson.dumps(body))
    assert isinstance(parsed, admission.PodWriteRequest)
    assert parsed.groups == ("system:nodes", "system:authenticated")
    body["request"]["userInfo"]["groups"] = "system:nodes"
    with pytest.raises(admission.MalformedReview, match=re.escape("request.userInfo.groups: expected a list")):
        admission.parse_review(orjson.dumps(body))


def test_a_pending_pods_creation_is_not_judged() -> None:
    parsed = admission.parse_review(review({
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE", "object": pod(),
    }))
    assert isinstance(parsed, admission.OtherRequest)


def test_a_resize_carries_both_pods_and_needs_the_old_one() -> None:
    base = {"resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "resize",
            "operation": "UPDATE", "object": pod("n1", "2")}
    parsed = admission.parse_review(review({**base, "oldObject": pod("n1", "1")}))
    assert isinstance(parsed, admission.PodWriteRequest) and parsed.operation == "resize"
    assert parsed.old_object is not None
    with pytest.raises(admission.MalformedReview, match=re.escape("request.oldObject")):
        admission.parse_review(review(base))


def test_a_dry_run_binding_leaves_the_fast_path_and_keeps_its_flag() -> None:
    parsed = admission.parse_review(review({
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "binding",
        "operation": "CREATE", "namespace": "ns", "name": "p", "dryRun": True,
        "object": {"metadata": {"name": "p", "uid": "u1"}, "target": {"kind": "Node", "name": "n1"}},
    }))
    assert isinstance(parsed, admission.BindingRequest) and parsed.dry_run
    with pytest.raises(admission.MalformedReview, match=re.escape("request.dryRun: expected a boolean, got 'yes'")):
        admission.parse_review(review({
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "binding",
            "operation": "CREATE", "namespace": "ns", "name": "p", "dryRun": "yes",
            "object": {"metadata": {"name": "p", "uid": "u1"}, "target": {"kind": "Node", "name": "n1"}},
        }))


def resized(*, spec: str, allocated: str | None, actuated: str | None, infeasible: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "app"}
    if actuated is not None:
        status["resources"] = {"requests": {"cpu": actuated}}
    if allocated is not None:
        status["allocatedResources"] = {"cpu": allocated}
    conditions = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}] if infeasible else []
    return {**pod("n1", spec), "status": {"containerStatuses": [status], "conditions": conditions}}


@pytest.mark.parametrize(("spec", "allocated", "actuated", "infeasible", "cpu"), [
    ("2", "1", "1", False, 2000),       # resize asked, not yet granted: the larger spec counts
    ("1", "2", "2", False, 2000),       # shrink asked: the allocated request counts until the kubelet shrinks it
    ("1", "1500m", None, False, 1000),  # no actuated resources: kube-scheduler reads no status for the container
    ("4", "1", "1", True, 1000),        # infeasible: the spec's request is left out
])
def test_a_pod_being_resized_counts_the_larger_of_spec_and_allocated(
    spec: str, allocated: str, actuated: str | None, infeasible: bool, cpu: int
) -> None:
    assert pod_requests(resized(spec=spec, allocated=allocated, actuated=actuated, infeasible=infeasible))["cpu"] \
        == cpu


def test_the_status_fingerprint_changes_with_what_the_request_reads() -> None:
    one = status_resources_key(resized(spec="1", allocated="1", actuated="1"))
    assert one == status_resources_key(resized(spec="2", allocated="1", actuated="1"))
    assert one != status_resources_key(resized(spec="1", allocated="2", actuated="1"))
    assert one != status_resources_key(resized(spec="1", allocated="1", actuated="1", infeasible=True))
    assert status_resources_key(pod("n1")) == ""
