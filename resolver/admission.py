"""AdmissionReview v1 for bindings: parse a review into a typed request, and build the verdicts. Pure, no I/O.

A binding reaches the webhook in two forms: the ``pods/binding`` subresource (resource ``pods``, subResource
``binding``; what kube-scheduler and hoss workers post) and the legacy ``bindings`` resource. Both carry a
``Binding`` object: metadata.name is the pod, metadata.uid the pod's uid when the binder set it, target.name
the node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from resolver.errors import ResolverError

Json = dict[str, Any]


class MalformedReview(ResolverError, ValueError):
    """The body is not an AdmissionReview v1 the webhook can judge; the message says what is wrong."""


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class _GroupVersionResource(_Loose):
    group: str = ""
    version: str = ""
    resource: str


class _UserInfo(_Loose):
    username: str = ""


class _Request(_Loose):
    uid: str
    resource: _GroupVersionResource
    subResource: str = ""
    name: str = ""
    namespace: str = ""
    operation: str
    userInfo: _UserInfo = _UserInfo()
    object: Json | None = None


class _Review(_Loose):
    apiVersion: str
    kind: str
    request: _Request | None = None


@dataclass(frozen=True)
class BindingRequest:
    """One binding to judge."""

    review_uid: str
    namespace: str
    pod: str
    pod_uid: str | None
    node: str
    username: str

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True)
class OtherRequest:
    """A review for something other than a binding CREATE (allowed: not the webhook's business)."""

    review_uid: str
    what: str


def parse_review(body: bytes) -> BindingRequest | OtherRequest:
    """Parse a raw AdmissionReview body; raise MalformedReview naming the field that is wrong."""
    try:
        raw = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise MalformedReview(f"body is not JSON: {error}") from error
    if not isinstance(raw, dict):
        raise MalformedReview(f"body must be a JSON object, got {type(raw).__name__}")
    try:
        review = _Review.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise MalformedReview(f"{field}: {first['msg']}") from error
    if review.apiVersion != "admission.k8s.io/v1" or review.kind != "AdmissionReview":
        raise MalformedReview(
            f"apiVersion/kind: expected admission.k8s.io/v1 AdmissionReview, got {review.apiVersion} {review.kind}"
        )
    request = review.request
    if request is None:
        raise MalformedReview("request: missing")
    is_binding = (request.resource.resource == "pods" and request.subResource == "binding") or (
        request.resource.resource == "bindings"
    )
    if not is_binding or request.operation != "CREATE":
        what = f"{request.operation} {request.resource.resource}/{request.subResource}".rstrip("/")
        return OtherRequest(review_uid=request.uid, what=what)
    binding = request.object
    if not isinstance(binding, dict):
        raise MalformedReview("request.object: missing Binding")
    metadata = binding.get("metadata") or {}
    target = binding.get("target") or {}
    node = target.get("name") if isinstance(target, dict) else None
    if not isinstance(node, str) or not node:
        raise MalformedReview(f"request.object.target.name: expected a node name, got {node!r}")
    pod = request.name or (metadata.get("name") if isinstance(metadata, dict) else "") or ""
    if not pod:
        raise MalformedReview("request.name: missing pod name")
    uid = metadata.get("uid") if isinstance(metadata, dict) else None
    return BindingRequest(
        review_uid=request.uid,
        namespace=request.namespace or str(metadata.get("namespace") or "default"),
        pod=pod,
        pod_uid=str(uid) if uid else None,
        node=node,
        username=request.userInfo.username,
    )


@dataclass(frozen=True)
class Verdict:
    """The webhook's answer: ``reason`` is a short label for metrics, ``message`` the text users read."""

    allowed: bool
    reason: str
    message: str = ""
    code: int = 200


def review_response(review_uid: str, verdict: Verdict) -> Json:
    """The AdmissionReview response body for ``verdict`` (always sent with HTTP 200)."""
    response: Json = {"uid": review_uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": verdict.code, "reason": "Conflict" if verdict.code == 409 else "Forbidden",
                              "message": verdict.message}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
