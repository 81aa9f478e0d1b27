"""Route workloads to hoss without editing them: the mutating admission webhook's decision (POST /mutate-pod).

A pod created in a namespace labelled ``hoss.io/policy=<policy>``, or matched by a rule of the routing file
(namespace label selector and pod label selector -> policy; the first matching rule wins, before the namespace
label), gets ``spec.schedulerName`` set to hoss's scheduler name and the label ``hoss.io/policy: <policy>`` (a
policy label the pod carries already is kept). Never routed: a pod that names a scheduler other than
``default-scheduler`` (the apiserver writes ``default-scheduler`` into every pod that names none, so that value
is read as "none named"), a pod created on a node (``spec.nodeName``), a pod labelled ``hoss.io/route: "off"``.
The webhook is registered with failurePolicy Ignore (deploy/router.yaml): while the resolver does not answer,
pods are created unchanged and go to the default scheduler.

Namespace labels come from an informer every resolver replica runs while routing is on (a routing file is set, or
`route_namespaces`); a namespace the informer has not seen yet is read as unlabelled.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from hoss.errors import HossError
from hoss.model.objects import Json

log = logging.getLogger(__name__)

POLICY_LABEL = "hoss.io/policy"
ROUTE_LABEL = "hoss.io/route"
"""A pod labelled hoss.io/route: "off" is never routed."""
DEFAULT_SCHEDULER = "default-scheduler"


class RoutingError(HossError, ValueError):
    """A routing file or rule hoss cannot use; the message names the file, rule and field."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        match self.operator:
            case "In":
                return self.key in labels and labels[self.key] in self.values
            case "NotIn":
                return self.key not in labels or labels[self.key] not in self.values
            case "Exists":
                return self.key in labels
            case _:  # DoesNotExist
                return self.key not in labels


@dataclass(frozen=True)
class Selector:
    """A Kubernetes label selector (matchLabels and matchExpressions); the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def parse_selector(raw: object, *, field: str) -> Selector:
    if raw is None:
        return Selector()
    if not isinstance(raw, Mapping):
        raise RoutingError(f"{field}: expected a label selector (matchLabels, matchExpressions), got {raw!r}")
    unknown = set(raw) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise RoutingError(f"{field}: unknown field(s) {sorted(unknown)}")
    requirements = []
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise RoutingError(f"{field}.matchLabels: expected a map of label -> value, got {labels!r}")
    for key, value in labels.items():
        requirements.append(Requirement(str(key), "In", frozenset({str(value)})))
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise RoutingError(f"{field}.matchExpressions: expected a list, got {expressions!r}")
    for index, expression in enumerate(expressions):
        where = f"{field}.matchExpressions[{index}]"
        if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str):
            raise RoutingError(f"{where}: expected key, operator and values, got {expression!r}")
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise RoutingError(f"{where}.operator: expected In, NotIn, Exists or DoesNotExist, got {operator!r}")
        if not isinstance(values, list) or (operator in ("In", "NotIn")) != bool(values):
            raise RoutingError(f"{where}.values: In and NotIn need values, Exists and DoesNotExist none; "
                               f"got {values!r}")
        requirements.append(Requirement(expression["key"], operator, frozenset(str(v) for v in values)))
    return Selector(tuple(requirements))


@dataclass(frozen=True)
class Rule:
    """Pods matching `pod_selector` in namespaces matching `namespace_selector` go to hoss with `policy`."""

    namespace_selector: Selector
    pod_selector: Selector
    policy: str


def load_rules(path: str | Path) -> list[Rule]:
    """The rules of a routing file (configs/routing.yaml shows the format); raises RoutingError naming the field."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise RoutingError(f"routing file {path}: {error}") from error
    return rules_from_text(text, source=str(path))


def rules_from_text(text: str, *, source: str) -> list[Rule]:
    """The rules in the text of a routing file (`source` names it in errors: the resolver reloading its file
    parses what it read); raises RoutingError naming the field."""
    path = source
    try:
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise RoutingError(f"routing file {path}: {error}") from error
    if document is None:
        return []
    if not isinstance(document, Mapping) or not isinstance(document.get("rules", []), list):
        raise RoutingError(f"routing file {path}: expected a map with a list 'rules'")
    unknown = set(document) - {"rules"}
    if unknown:
        raise RoutingError(f"routing file {path}: unknown field(s) {sorted(unknown)}")
    rules = []
    for index, raw in enumerate(document.get("rules") or []):
        field = f"routing file {path}: rules[{index}]"
        if not isinstance(raw, Mapping):
            raise RoutingError(f"{field}: expected a map, got {raw!r}")
        unknown = set(raw) - {"namespaceSelector", "podSelector", "policy"}
        if unknown:
            raise RoutingError(f"{field}: unknown field(s) {sorted(unknown)}")
        policy = raw.get("policy")
        if not isinstance(policy, str) or not policy:
            raise RoutingError(f"{field}.policy: expected a policy name, got {policy!r}")
        rules.append(Rule(parse_selector(raw.get("namespaceSelector"), field=f"{field}.namespaceSelector"),
                          parse_selector(raw.get("podSelector"), field=f"{field}.podSelector"), policy))
    return rules


def policy_for(pod_labels: Mapping[str, str], namespace_labels: Mapping[str, str], rules: Sequence[Rule]) -> str | None:
    """The policy a pod is routed with, or None: the first matching rule, else the namespace's hoss.io/policy."""
    for rule in rules:
        if rule.namespace_selector.matches(namespace_labels) and rule.pod_selector.matches(pod_labels):
            return rule.policy
    return namespace_labels.get(POLICY_LABEL) or None


def route(pod: Json, namespace_labels: Mapping[str, str], rules: Sequence[Rule], *,
          scheduler_name: str) -> tuple[list[Json], str]:
    """The JSON patch that routes `pod` to hoss ([] to leave it) and why, for logs and the review's warnings."""
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    assert isinstance(metadata, dict) and isinstance(spec, dict)
    labels = metadata.get("labels") if isinstance(metadata.get("labels"), dict) else {}
    assert isinstance(labels, dict)
    named = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if named not in (DEFAULT_SCHEDULER, scheduler_name):
        return [], f"names scheduler {named}"
    if spec.get("nodeName"):
        return [], "created on a node"
    if labels.get(ROUTE_LABEL) == "off":
        return [], f"labelled {ROUTE_LABEL}=off"
    policy = policy_for(labels, namespace_labels, rules)
    if policy is None:
        return [], "no rule and no namespace label"
    patch: list[Json] = []
    if named != scheduler_name:
        patch.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    if POLICY_LABEL not in labels:
        if "labels" in metadata and isinstance(metadata["labels"], dict):
            patch.append({"op": "add", "path": "/metadata/labels/" + POLICY_LABEL.replace("~", "~0").replace("/", "~1"),
                          "value": policy})
        else:
            patch.append({"op": "add", "path": "/metadata/labels", "value": {POLICY_LABEL: policy}})
    return patch, f"policy {labels.get(POLICY_LABEL, policy)}"


def mutation_response(review_uid: str, patch: Sequence[Json]) -> bytes:
    """An allowing AdmissionReview response carrying `patch` (none when empty)."""
    response: Json = {"uid": review_uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(patch))).decode()
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})


class NamespaceLabels:
    """Namespace name -> labels, kept by an informer (`resolver.main` runs it while routing is on)."""

    def __init__(self) -> None:
        self.labels: dict[str, dict[str, str]] = {}

    @staticmethod
    def _entry(obj: Json) -> tuple[str, dict[str, str]]:
        metadata = obj.get("metadata") or {}
        return str(metadata.get("name") or ""), {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}

    async def on_list(self, items: list[Json]) -> None:
        self.labels = dict(self._entry(obj) for obj in items)

    async def on_event(self, kind: str, obj: Json) -> None:
        name, labels = self._entry(obj)
        if kind == "DELETED":
            self.labels.pop(name, None)
        else:
            self.labels[name] = labels
