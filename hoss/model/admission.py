"""AdmissionReview v1 for bindings and pod writes: parse a review into a typed request, and build the verdicts.
Pure, no I/O.

A binding reaches the webhook in two forms: the ``pods/binding`` subresource (resource ``pods``, subResource
``binding``; what kube-scheduler and hoss workers post) and the legacy ``bindings`` resource. Both carry a
``Binding`` object: metadata.name is the pod, metadata.uid the pod's uid when the binder set it (the webhook
refuses a binding without one), metadata.resourceVersion the pod's version the binder read (hoss workers set it: the
apiserver then binds only that version, so the pod's spec is the one its reservation was made for), target.name
the node. A pod may also land on a node without a binding: created with ``spec.nodeName`` set (resource
``pods``, CREATE), and a pod's requests may grow by an in-place resize (``pods/resize``, UPDATE; bound or not);
both parse into a `PodWriteRequest` carrying the pod. ``request.dryRun`` is kept: a dry run must leave no trace.

This is the webhook's hot path, so the body is parsed with orjson and only the fields the verdict needs are read
(apiVersion/kind; request.uid, resource.{group,resource}, subResource, operation, namespace, name,
userInfo.username (and for a pod write userInfo.groups); object.metadata.{name,namespace,uid,resourceVersion},
object.target.{kind,name}); everything else in the review is ignored. A field that is there but of the wrong type,
or a required one that is missing, raises `MalformedReview` naming the field by its JSON path and the value found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from hoss.errors import HossError
from hoss.model.objects import Json

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

# Binding lanes. The apiserver reaches a webhook over HTTP/1.1 and keeps at most 25 idle connections per transport
# and host (client-go's transport); every binding in flight beyond them costs a new TLS connection, a full
# handshake on both sides, closed again after one review. So hoss workers label each Binding they post with a lane
# (round robin), and deploy/webhook.yaml judges bindings in BINDING_LANES entries that differ only in an
# objectSelector on that label and in their path (`lane_path`): the apiserver caches one client per webhook client
# configuration (its name left out), so a path of its own gives each lane its own client, transport and 25 idle
# connections. Every binding matches exactly one entry (the first entry takes every binding whose label is not one
# of the others' values, unlabelled ones included), so a label can choose the connection a review travels on,
# never whether it is judged.
LANE_LABEL = "hoss.io/lane"
BINDING_LANES = 8
SERVED_LANES = 64
"""The resolver judges bindings on the paths of this many lanes, more than deploy/webhook.yaml registers, so that
a webhook configuration with more lanes (a later version's) works against this version's resolver while an
upgrade rolls: a lane path it did not serve would answer 404, and failurePolicy Fail would deny the binding."""
BINDING_PATH = "/validate-binding"


def lane_path(lane: int) -> str:
    """The path the webhook entry of ``lane`` calls: /validate-binding for the first, /validate-binding/lane-N for
    the others (judged alike)."""
    return BINDING_PATH if lane == 0 else f"{BINDING_PATH}/lane-{lane}"


def lane_of(index: int) -> str:
    """The lane label value of the ``index``-th binding a client posts (round robin over the lanes)."""
    return str(index % BINDING_LANES)
_MISSING: Any = object()


class MalformedReview(HossError, ValueError):
    """The body is not an AdmissionReview v1 the webhook can judge; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class BindingRequest:
    """One binding to judge."""

    review_uid: str
    namespace: str
    pod: str
    pod_uid: str | None
    node: str
    username: str
    dry_run: bool = False
    resource_version: str = ""
    """The Binding's metadata.resourceVersion: the apiserver binds the pod only at that version ("" for any)."""

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class PodWriteRequest:
    """A pod created with spec.nodeName (``operation`` "create") or an in-place resize of a pod (``operation``
    "resize"; ``node`` "" when the pod is not bound yet): the pod as it will be stored, and for a resize the pod
    before."""

    review_uid: str
    namespace: str
    pod: str
    node: str
    username: str
    operation: str
    object: Json
    old_object: Json | None = None
    dry_run: bool = False
    groups: tuple[str, ...] = ()
    """request.userInfo.groups: with the user name, who wrote it (a node's own mirror pod is let through)."""

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class OtherRequest:
    """A review for something other than a binding CREATE (allowed: not the webhook's business)."""

    review_uid: str
    what: str


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _object(parent: Json, key: str, path: str, *, required: bool = False) -> Json:
    """``parent[key]`` when it is an object; {} when absent or null (unless required)."""
    value = parent.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise MalformedReview(f"{path}: missing")
        return {}
    if not isinstance(value, dict):
        raise MalformedReview(f"{path}: expected an object, got {_shown(value)}")
    return value


def _string(parent: Json, key: str, path: str, *, required: bool = False) -> str:
    """``parent[key]`` when it is a string; "" when absent or null (unless required)."""
    value = parent.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise MalformedReview(f"{path}: missing")
        return ""
    if not isinstance(value, str):
        raise MalformedReview(f"{path}: expected a string, got {_shown(value)}")
    return value


def parse_review(body: bytes) -> BindingRequest | PodWriteRequest | OtherRequest:
    """Parse a raw AdmissionReview body; raise MalformedReview naming the field that is wrong and its value."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise MalformedReview(f"body is not JSON: {error}") from error
    if not isinstance(raw, dict):
        raise MalformedReview(f"body must be a JSON object, got {type(raw).__name__}")
    return _binding_as_sent(raw) or _parse_checked(raw)


def _binding_as_sent(raw: Json) -> BindingRequest | None:
    """The binding of a review shaped exactly as the apiserver sends one, read without per-field checks; None
    for anything else (another resource, a missing or mistyped field), which `_parse_checked` then handles."""
    try:
        request = raw["request"]
        resource = request["resource"]
        binding = request["object"]
        target = binding["target"]
        metadata = binding["metadata"]
        review_uid, node, pod, namespace = request["uid"], target["name"], request["name"], request["namespace"]
        uid, username = metadata["uid"], request["userInfo"]["username"]
        if not (
            raw["apiVersion"] == API_VERSION and raw["kind"] == KIND
            and resource["resource"] == "pods" and request.get("subResource") == "binding"
            and resource.get("group") == "" and request["operation"] == "CREATE"
            and target.get("kind") in (None, "", "Node") and not request.get("dryRun")
            and type(review_uid) is str and type(node) is str and type(pod) is str and type(namespace) is str
            and type(uid) is str and type(username) is str and node and pod and namespace and uid
        ):
            return None
    except (KeyError, TypeError):
        return None
    version = metadata.get("resourceVersion") or ""
    if type(version) is not str:
        return None
    return BindingRequest(
        review_uid=review_uid, namespace=namespace, pod=pod, pod_uid=uid, node=node, username=username,
        resource_version=version,
    )


def _dry_run(request: Json) -> bool:
    value = request.get("dryRun")
    if value is not None and not isinstance(value, bool):
        raise MalformedReview(f"request.dryRun: expected a boolean, got {_shown(value)}")
    return bool(value)


def _pod_write(request: Json, review_uid: str, operation: str) -> PodWriteRequest | OtherRequest:
    """A pod CREATE (judged only with spec.nodeName set) or a pods/resize UPDATE."""
    pod = request.get("object")
    if not isinstance(pod, dict):
        raise MalformedReview(f"request.object: expected a Pod, got {_shown(pod)}")
    metadata = _object(pod, "metadata", "request.object.metadata")
    spec = _object(pod, "spec", "request.object.spec")
    node = _string(spec, "nodeName", "request.object.spec.nodeName")
    kind = "create" if operation == "CREATE" else "resize"
    if not node and kind == "create":
        return OtherRequest(review_uid=review_uid, what=f"{operation} pods without spec.nodeName")
    name = _string(request, "name", "request.name") or _string(metadata, "name", "request.object.metadata.name")
    namespace = _string(request, "namespace", "request.namespace") or _string(
        metadata, "namespace", "request.object.metadata.namespace"
    )
    old = request.get("oldObject")
    if kind == "resize" and not isinstance(old, dict):
        raise MalformedReview(f"request.oldObject: expected the Pod before the resize, got {_shown(old)}")
    user = _object(request, "userInfo", "request.userInfo")
    groups = user.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(group, str) for group in groups):
        raise MalformedReview(f"request.userInfo.groups: expected a list of strings, got {_shown(groups)}")
    return PodWriteRequest(
        review_uid=review_uid, namespace=namespace or "default", pod=name, node=node,
        username=_string(user, "username", "request.userInfo.username"), operation=kind, object=pod,
        old_object=old if isinstance(old, dict) else None, dry_run=_dry_run(request), groups=tuple(groups),
    )


def _parse_checked(raw: Json) -> BindingRequest | PodWriteRequest | OtherRequest:
    """Every field checked, for reviews the fast path does not take; raises MalformedReview naming the field."""
    api_version = raw.get("apiVersion")
    kind = raw.get("kind")
    if api_version != API_VERSION or kind != KIND:
        raise MalformedReview(
            f"apiVersion/kind: expected {API_VERSION} {KIND}, got {_shown(api_version)} {_shown(kind)}"
        )
    request = _object(raw, "request", "request", required=True)
    review_uid = _string(request, "uid", "request.uid", required=True)
    resource = _object(request, "resource", "request.resource", required=True)
    group = _string(resource, "group", "request.resource.group")
    resource_name = _string(resource, "resource", "request.resource.resource", required=True)
    sub_resource = _string(request, "subResource", "request.subResource")
    operation = _string(request, "operation", "request.operation", required=True)
    is_binding = group == "" and (
        (resource_name == "pods" and sub_resource == "binding") or resource_name == "bindings"
    )
    if group == "" and resource_name == "pods" and (
        (sub_resource == "" and operation == "CREATE") or (sub_resource == "resize" and operation == "UPDATE")
    ):
        return _pod_write(request, review_uid, operation)
    if not is_binding or operation != "CREATE":
        what = f"{operation} {resource_name}/{sub_resource}".rstrip("/")
        return OtherRequest(review_uid=review_uid, what=what)
    binding = request.get("object")
    if not isinstance(binding, dict):
        raise MalformedReview(f"request.object: expected a Binding, got {_shown(binding)}")
    metadata = _object(binding, "metadata", "request.object.metadata")
    target = _object(binding, "target", "request.object.target")
    node = target.get("name")
    if not isinstance(node, str) or not node:
        raise MalformedReview(f"request.object.target.name: expected a node name, got {_shown(node)}")
    target_kind = _string(target, "kind", "request.object.target.kind")
    if target_kind not in ("", "Node"):
        raise MalformedReview(f"request.object.target.kind: expected Node, got {_shown(target_kind)}")
    pod = _string(request, "name", "request.name") or _string(metadata, "name", "request.object.metadata.name")
    if not pod:
        raise MalformedReview("request.name: missing pod name")
    uid = _string(metadata, "uid", "request.object.metadata.uid")
    namespace = _string(request, "namespace", "request.namespace") or _string(
        metadata, "namespace", "request.object.metadata.namespace"
    )
    user = _object(request, "userInfo", "request.userInfo")
    return BindingRequest(
        review_uid=review_uid,
        namespace=namespace or "default",
        pod=pod,
        pod_uid=uid or None,
        node=node,
        username=_string(user, "username", "request.userInfo.username"),
        dry_run=_dry_run(request),
        resource_version=_string(metadata, "resourceVersion", "request.object.metadata.resourceVersion"),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The webhook's answer: ``reason`` is a short label for metrics, ``message`` the text users read."""

    allowed: bool
    reason: str
    message: str = ""
    code: int = 200
    status_reason: str = ""
    """The denial's metav1 StatusReason, which clients branch on (e.g. AlreadyExists); "" means Conflict for a 409
    and Forbidden otherwise. The apiserver passes it on to the writer."""


def review_response(review_uid: str, verdict: Verdict) -> Json:
    """The AdmissionReview response body for ``verdict`` (always sent with HTTP 200)."""
    response: Json = {"uid": review_uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        reason = verdict.status_reason or ("Conflict" if verdict.code == 409 else "Forbidden")
        response["status"] = {"code": verdict.code, "reason": reason, "message": verdict.message}
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def review_response_bytes(review_uid: str, verdict: Verdict) -> bytes:
    """`review_response` serialised (orjson), as the webhook sends it."""
    return orjson.dumps(review_response(review_uid, verdict))
