"""Review parsing: the fast path for reviews shaped as the apiserver sends them agrees with the checked path."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from resolver.admission import BindingRequest, OtherRequest, _binding_as_sent, _parse_checked, parse_review

SENT: dict[str, Any] = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "r1",
        "kind": {"group": "", "version": "v1", "kind": "Binding"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "binding",
        "name": "p",
        "namespace": "team",
        "operation": "CREATE",
        "userInfo": {"username": "system:kube-scheduler", "groups": ["system:authenticated"]},
        "object": {"kind": "Binding", "apiVersion": "v1", "metadata": {"name": "p", "namespace": "team", "uid": "u1"},
                   "target": {"kind": "Node", "name": "n1"}},
        "oldObject": None,
        "dryRun": False,
    },
}


def variant(path: str, value: object) -> dict[str, Any]:
    body = copy.deepcopy(SENT)
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return body


def test_a_review_as_the_apiserver_sends_it_takes_the_fast_path() -> None:
    assert _binding_as_sent(SENT) == BindingRequest(
        review_uid="r1", namespace="team", pod="p", pod_uid="u1", node="n1", username="system:kube-scheduler"
    )


@pytest.mark.parametrize(
    "body",
    [
        variant("request.object.metadata.uid", KeyError),
        variant("request.object.target.kind", KeyError),
        variant("request.resource.group", KeyError),
        variant("request.namespace", ""),
        variant("request.name", ""),
        variant("request.resource.resource", "bindings"),
        variant("request.resource.group", "example.com"),
        variant("request.operation", "UPDATE"),
        variant("request.userInfo", {}),
    ],
)
def test_every_other_shape_gets_the_checked_paths_answer(body: dict[str, Any]) -> None:
    assert _binding_as_sent(body) is None or isinstance(_parse_checked(body), BindingRequest)
    assert parse_review(orjson.dumps(body)) == _parse_checked(body)


def test_other_resources_are_not_bindings() -> None:
    parsed = parse_review(orjson.dumps(variant("request.operation", "DELETE")))
    assert parsed == OtherRequest(review_uid="r1", what="DELETE pods/binding")
