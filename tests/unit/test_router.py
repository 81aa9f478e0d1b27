"""The router's decision (resolver/router.py): which pods are routed to hoss with which policy, the JSON patch,
and the routing file's errors naming the field."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from resolver.router import RoutingError, load_rules, mutation_response, parse_selector, policy_for, route

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def pod(*, scheduler: str | None = "default-scheduler", labels: dict[str, str] | None = None,
        node: str | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"containers": [{"name": "c", "image": "i"}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    metadata: dict[str, object] = {"name": "p"}
    if labels is not None:
        metadata["labels"] = labels
    return {"metadata": metadata, "spec": spec}


def test_a_pod_of_a_labelled_namespace_goes_to_hoss_with_its_policy() -> None:
    patch, why = route(pod(labels={"app": "x"}), {"hoss.io/policy": "binpack"}, [], scheduler_name="hoss")
    assert patch == [{"op": "add", "path": "/spec/schedulerName", "value": "hoss"},
                     {"op": "add", "path": "/metadata/labels/hoss.io~1policy", "value": "binpack"}]
    assert why == "policy binpack"
    # No labels at all: the labels map is added whole.
    patch, _ = route(pod(labels=None), {"hoss.io/policy": "binpack"}, [], scheduler_name="hoss")
    assert patch[1] == {"op": "add", "path": "/metadata/labels", "value": {"hoss.io/policy": "binpack"}}


def test_what_is_never_routed() -> None:
    namespace = {"hoss.io/policy": "binpack"}
    assert route(pod(scheduler="volcano"), namespace, [], scheduler_name="hoss") == ([], "names scheduler volcano")
    assert route(pod(node="n1"), namespace, [], scheduler_name="hoss") == ([], "created on a node")
    assert route(pod(labels={"hoss.io/route": "off"}), namespace, [], scheduler_name="hoss")[0] == []
    assert route(pod(), {}, [], scheduler_name="hoss") == ([], "no rule and no namespace label")


def test_a_pod_naming_hoss_keeps_its_own_policy_label() -> None:
    patch, why = route(pod(scheduler="hoss", labels={"hoss.io/policy": "gang-topology"}),
                       {"hoss.io/policy": "binpack"}, [], scheduler_name="hoss")
    assert patch == [] and why == "policy gang-topology"


def test_rules_come_before_the_namespace_label(tmp_path: Path) -> None:
    rules = load_rules(CONFIGS / "routing.yaml")
    ml = {"hoss.io/policy": "binpack", "hoss.io/tenant-class": "ml"}
    assert policy_for({"job-name": "train"}, ml, rules) == "gang-topology"
    assert policy_for({"app": "notebook"}, ml, rules) == "binpack"
    assert policy_for({"job-name": "train"}, {"hoss.io/policy": "default"}, rules) == "default"


@pytest.mark.parametrize(("text", "named"), [
    ("rules: [{policy: ''}]", "rules[0].policy"),
    ("rules: [{policy: p, podSelector: {matchLabels: [a]}}]", "rules[0].podSelector.matchLabels"),
    ("rules: [{policy: p, namespaceSelector: {matchExpressions: [{key: k, operator: Near}]}}]",
     "rules[0].namespaceSelector.matchExpressions[0].operator"),
    ("rules: [{policy: p, podSelector: {matchExpressions: [{key: k, operator: In}]}}]",
     "rules[0].podSelector.matchExpressions[0].values"),
    ("rules: [{policy: p, scheduler: x}]", "rules[0]: unknown field(s) ['scheduler']"),
    ("route: []", "unknown field(s) ['route']"),
])
def test_a_bad_routing_file_names_the_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(text)
    with pytest.raises(RoutingError, match=named.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_rules(path)


def test_selectors_match_as_kubernetes_does() -> None:
    selector = parse_selector({"matchLabels": {"a": "1"},
                               "matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["x"]},
                                                    {"key": "c", "operator": "DoesNotExist"}]}, field="s")
    assert selector.matches({"a": "1"}) and selector.matches({"a": "1", "b": "y"})
    assert not selector.matches({"a": "1", "b": "x"}) and not selector.matches({"a": "1", "c": ""})


def test_the_response_carries_the_patch() -> None:
    body = json.loads(mutation_response("u1", [{"op": "add", "path": "/spec/schedulerName", "value": "hoss"}]))
    response = body["response"]
    assert response["uid"] == "u1" and response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"]))[0]["value"] == "hoss"
    assert "patch" not in json.loads(mutation_response("u2", []))["response"]
