"""Review parsing: the fast path for reviews shaped as the apiserver sends them agrees with the checked path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from hoss.model import admission
from hoss.model.admission import BindingRequest, OtherRequest, _binding_as_sent, _parse_checked, parse_review
from hoss.model.reservations import selector_matches

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


def test_every_binding_lane_value_is_judged_by_exactly_one_binding_entry_of_the_shipped_webhook() -> None:
    """deploy/webhook.yaml's binding entries differ only in their objectSelector on the lane label; whatever a
    Binding's label says (none, a lane, an unknown value), exactly one of them judges it, and the lanes hoss
    workers take each have their own entry (so their own apiserver connections)."""
    manifest = yaml.safe_load((Path(__file__).parents[2] / "deploy" / "webhook.yaml").read_text())
    bindings = [hook for hook in manifest["webhooks"]
                if any("pods/binding" in rule["resources"] for rule in hook["rules"])
                and hook["failurePolicy"] == "Fail"]
    assert len(bindings) == admission.BINDING_LANES
    for hook in bindings:
        rest = {key: value for key, value in hook.items() if key not in ("name", "objectSelector", "clientConfig")}
        first = {key: value for key, value in bindings[0].items() if key not in ("name", "objectSelector",
                                                                                   "clientConfig")}
        assert rest == first, hook["name"]
        service = {key: value for key, value in hook["clientConfig"]["service"].items() if key != "path"}
        assert service == {key: value for key, value in bindings[0]["clientConfig"]["service"].items()
                           if key != "path"}
    # The apiserver keeps one client (and 25 idle connections) per client configuration, its name left out: each
    # lane needs a path of its own, and the resolver serves each.
    assert [hook["clientConfig"]["service"]["path"] for hook in bindings] == [
        admission.lane_path(lane) for lane in range(admission.BINDING_LANES)]
    assert len({admission.lane_path(lane) for lane in range(admission.BINDING_LANES)}) == admission.BINDING_LANES
    lanes_taken = {admission.lane_of(index) for index in range(1000)}
    assert lanes_taken == {str(lane) for lane in range(admission.BINDING_LANES)}
    entry_of_lane = {}
    for value in (None, "", "7", "lane", *sorted(lanes_taken)):
        labels = {} if value is None else {admission.LANE_LABEL: value}
        judging = [hook["name"] for hook in bindings if selector_matches(hook["objectSelector"], labels)]
        assert len(judging) == 1, (value, judging)
        entry_of_lane[value] = judging[0]
    assert len({entry_of_lane[lane] for lane in lanes_taken}) == admission.BINDING_LANES
