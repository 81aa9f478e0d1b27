"""Judging one write against the ledger: a binding, a pod created on a node, or a resize that grows a pod.

The hot path is one Redis call (``Ledger.confirm``) and no apiserver call: a hoss worker's binding carries the pod's
uid and resourceVersion, and the worker's reservation already holds the pod's request at that version (the only one
the apiserver binds), so the ledger is asked without one. A binding without a uid is refused. Only a binding with no
entry in the ledger (a foreign scheduler's, or a hoss binding whose reservation expired) or without a version needs
the pod's request: from the sync's index of bound pods when this replica syncs and has the pod, else from one GET of
the pod. A binding is allowed when the pod's reservation is for that node (and whatever the pod asks beyond it
fits), or (a foreign scheduler's binding) when the pod still fits, in which case the same call records it.
Otherwise it is denied with status code 409 and a message naming node, resource, requested and free.

Invariant: a ledger that is unreachable, slow or not ready denies (fail closed); nothing is oversold, scheduling
pauses and resumes by itself. Only the system entry turns what the ledger cannot judge into an allow
(`system_verdict`). `verdict_for` and `system_verdict` are pure; `judge` and `judge_pod_write` make the calls.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from hoss.errors import HossError, LedgerUnavailable
from hoss.kube.client import KubeError
from hoss.ledger.results import (
    Confirmed,
    ConfirmResult,
    Conflict,
    HeldElsewhere,
    LedgerNotReady,
    NeedRequest,
    QuotaExceeded,
    UnconfirmedCreates,
    UnknownNode,
)
from hoss.model import admission
from hoss.model.dra import without_dra
from hoss.model.objects import Json
from hoss.model.resources import ResourceVector, format_quantity
from resolver.mirror import PodInfo, parse_pod
from resolver.state import WebhookState

log = logging.getLogger(__name__)

POD_READ_TIMEOUT_SECONDS = 2.0
"""Deadline of the pod GET a binding without a reservation needs (the apiserver gives the webhook 5 s in all)."""
LEDGER_CALL_TIMEOUT_SECONDS = 2.0
"""Deadline of one ledger call made for a review; past it the binding is denied (fail closed)."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
NODE_USER_PREFIX = "system:node:"
NODES_GROUP = "system:nodes"
"""How a kubelet authenticates: user system:node:<its node>, group system:nodes (the Node authorizer's names)."""
FAIL_OPEN_REASONS = frozenset({"ledger-not-ready", "ledger-unavailable", "unknown-node"})
"""Verdicts the system entry (/validate-system) turns into an allow: the ledger cannot judge, and refusing would
keep hoss's own pods, Redis or CoreDNS from starting (the deadlock the exemption exists for)."""


def verdict_for(result: ConfirmResult, *, binding: admission.BindingRequest) -> admission.Verdict:
    """Turn the ledger's answer into the webhook's verdict. Pure."""
    who = f"pod {binding.pod_key} on node {binding.node}"
    match result:
        case Confirmed(foreign=False):
            return admission.Verdict(allowed=True, reason="reserved")
        case Confirmed(foreign=True):
            return admission.Verdict(allowed=True, reason="fits")
        case QuotaExceeded():
            return admission.Verdict(
                allowed=False, reason="quota", code=403,
                message=f"hoss: {binding.pod_key} on node {binding.node} denied: {result}",
            )
        case UnconfirmedCreates(node=node, resource=resource, wanted=wanted, held=held):
            return admission.Verdict(
                allowed=False, reason="unconfirmed-creates", code=429, status_reason="TooManyRequests",
                message=(
                    f"hoss: {binding.username}'s pods created on nodes and not yet confirmed hold "
                    f"{format_quantity(resource, held)} {resource}; {binding.pod_key} asks "
                    f"{format_quantity(resource, wanted)} more, past node {node}'s allocatable "
                    f"{format_quantity(resource, held + result.free)} (the most one user's unconfirmed creates "
                    "may hold); retry once they are bound or refused"
                ),
            )
        case Conflict(node=node, resource=resource, wanted=wanted, free=free):
            return admission.Verdict(
                allowed=False,
                reason="conflict",
                code=409,
                message=(
                    f"hoss: node {node} has no room for {binding.pod_key}: {resource} requested "
                    f"{format_quantity(resource, wanted)}, free {format_quantity(resource, max(free, 0))}"
                ),
            )
        case UnknownNode(node=node):
            return admission.Verdict(
                allowed=False, reason="unknown-node", code=409,
                message=f"hoss: node {node} is not in the ledger (no such node, or not synced yet); {who} denied",
            )
        case HeldElsewhere(node=node, state=state):
            return admission.Verdict(
                allowed=False, reason="held-elsewhere", code=409,
                message=f"hoss: {binding.pod_key} already holds resources on node {node} ({state}); {who} denied",
            )
        case LedgerNotReady(reason=reason):
            return admission.Verdict(
                allowed=False, reason="ledger-not-ready", code=503,
                message=f"hoss: the ledger is not ready ({reason}); binding of {who} denied, retry later",
            )
        case NeedRequest():
            # Only a confirm without a request answers this, and judge() then asks again with one.
            return admission.Verdict(
                allowed=False, reason="unknown-pod", code=409,
                message=f"hoss: no reservation and no request known for {binding.pod_key}; {who} denied, retry",
            )
    raise AssertionError(f"unhandled ledger result {result!r}")


def nodes_own_mirror(write: admission.PodWriteRequest) -> bool:
    """Whether a pod write is a kubelet's mirror of one of its static pods: the mirror annotation, posted by the
    node the pod names (user ``system:node:<spec.nodeName>`` in group ``system:nodes``). Anyone else's pod with
    that annotation is an ordinary pod: the annotation alone proves nothing, any user may set it. Pure."""
    annotations = (write.object.get("metadata") or {}).get("annotations")
    return (
        isinstance(annotations, dict) and MIRROR_ANNOTATION in annotations
        and write.username == f"{NODE_USER_PREFIX}{write.node}" and NODES_GROUP in write.groups
    )


def no_uid(binding: admission.BindingRequest) -> admission.Verdict:
    """The denial of a binding without metadata.uid: the apiserver would bind whichever pod has that name then, not
    necessarily the one it was judged for (kube-scheduler and hoss workers always set it). Pure."""
    return admission.Verdict(
        allowed=False, reason="no-uid", code=400,
        message=f"hoss: the binding of {binding.pod_key} to node {binding.node} has no metadata.uid; set it to the "
                "pod's uid",
    )


def name_taken(write: admission.PodWriteRequest, holder: Json | None, *, uid: str) -> admission.Verdict | None:
    """The answer to a pod created under a name that ``holder`` holds with another uid: AlreadyExists, as the
    apiserver itself answers (its own wording), so the create holds no room. ``holder`` is the pod of that name a
    GET returned while the create was being admitted (None: none). None when the name is free. Pure.

    A pod of another uid held the name at a moment during the create, before it could be stored: the apiserver's
    answer at that moment was AlreadyExists, and it is the answer the writer gets."""
    metadata = (holder or {}).get("metadata") or {}
    if holder is None or metadata.get("uid") == uid:
        return None
    message = f'pods "{write.pod}" already exists'
    if metadata.get("deletionTimestamp"):
        message = f"object is being deleted: {message}"
    return admission.Verdict(allowed=False, reason="already-exists", code=409, status_reason="AlreadyExists",
                             message=f"hoss: {message}")


def system_verdict(verdict: admission.Verdict) -> admission.Verdict:
    """The system entry's verdict: a denial only because the ledger cannot judge becomes an allow. Pure."""
    if verdict.allowed or verdict.reason not in FAIL_OPEN_REASONS:
        return verdict
    return admission.Verdict(allowed=True, reason="system-unjudged")


def unavailable(error: LedgerUnavailable | TimeoutError) -> admission.Verdict:
    """The denial of a write the ledger did not answer. Pure."""
    why = str(error) if isinstance(error, LedgerUnavailable) else f"no answer within {LEDGER_CALL_TIMEOUT_SECONDS}s"
    return admission.Verdict(
        allowed=False, reason="ledger-unavailable", code=503,
        message=f"hoss: the ledger is unreachable ({why}); binding denied, retry later",
    )


async def _counted(state: WebhookState, node: str, request: ResourceVector) -> ResourceVector:
    """``request`` as the ledger counts it on ``node``: without the extended resources a DeviceClass maps that the
    node has none of (kube-scheduler leaves them to DRA there; `hoss.model.dra`). The node's allocatable is read
    only for a request that names such a resource."""
    dra = state.device_classes.names
    if dra.isdisjoint(request):
        return request
    usage = await state.ledger.node_usage([node])
    return without_dra(request, allocatable=usage[node][0] if node in usage else {}, dra=dra)


async def _name_holder(state: WebhookState, write: admission.PodWriteRequest) -> Json | None:
    """The pod holding the name of a pod being created, by one GET; None when there is none, and when it cannot be
    read (the create is then judged as any other, and the limit on unconfirmed creates bounds what it holds)."""
    if state.get_pod is None:
        return None
    state.pod_reads += 1
    try:
        async with asyncio.timeout(POD_READ_TIMEOUT_SECONDS):
            return await state.get_pod(write.namespace, write.pod)
    except KubeError as error:
        if error.status != 404:
            log.warning("cannot read pod %s, created on %s: %s", write.pod_key, write.node, error)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
        log.warning("cannot read pod %s, created on %s: %s", write.pod_key, write.node, error)
    return None


async def _pod_info(state: WebhookState, binding: admission.BindingRequest, *, uid: str) -> PodInfo | None:
    """The view of pod `uid` for a binding without a reservation: from the sync's index of bound pods when this
    replica syncs and has it, else one GET from the apiserver. None when the pod is unknown (or another pod by that
    name).

    The request read may be older than a resize of the pod (the index is as fresh as the sync's watch, and a resize
    may be written after the GET): confirm also counts what such a resize allowed (see 'Growth' in common.lua)."""
    index = state.sync.pods if state.sync is not None else state.pods
    found = index.find(uid=uid, key=binding.pod_key)
    if found is None and state.sync is not None:
        # a foreign scheduler's pending pod, as the sync's informer last saw it
        found = state.sync.pending.find(uid=uid, key=binding.pod_key)
    if found is not None or state.get_pod is None:
        return found
    state.pod_reads += 1
    try:
        async with asyncio.timeout(POD_READ_TIMEOUT_SECONDS):
            raw = await state.get_pod(binding.namespace, binding.pod)
    except (KubeError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
        log.warning("cannot read pod %s: %s", binding.pod_key, error)
        return None
    info = parse_pod(raw)
    return info if info.uid == uid else None


async def _confirm(
    state: WebhookState, binding: admission.BindingRequest, *, uid: str, pod: str,
    request: ResourceVector | None, owner: str, meta: str = "",
) -> ConfirmResult:
    # asyncio.timeout, not the Redis client's socket timeout: redis-py implements that with asyncio.wait_for, which
    # costs a task per command and can swallow a cancellation on Python 3.11.
    async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
        return await state.ledger.confirm(
            uid=uid, pod=pod, node=binding.node, request=request, owner=owner,
            verify_after_seconds=state.settings.verify_after_seconds, dry_run=binding.dry_run, meta=meta,
        )


async def judge(state: WebhookState, binding: admission.BindingRequest) -> admission.Verdict:
    """A binding's verdict: by the pod's reservation when a hoss worker's binding has one, else by whether the pod
    (its request from the sync's indexes or the apiserver) still fits on the node."""
    settings = state.settings
    own = binding.username in state.hoss_usernames
    if settings.enforce == "hoss-only" and not own:
        return admission.Verdict(allowed=True, reason="not-enforced")
    if not binding.pod_uid:
        return no_uid(binding)
    owner = binding.username if own else f"foreign:{binding.username}"
    if own and binding.resource_version:
        # A hoss worker's binding: its reservation holds the request of the pod at the version the binding names,
        # which is the only version the apiserver binds, so no pod lookup is needed. One without a version is
        # judged as any other, from the pod's request (confirm checks any growth over the reservation).
        try:
            result = await _confirm(state, binding, uid=binding.pod_uid, pod=binding.pod_key, request=None, owner=owner)
        except (LedgerUnavailable, TimeoutError) as error:
            return unavailable(error)
        if not isinstance(result, NeedRequest):
            return verdict_for(result, binding=binding)
    try:
        pod = await _pod_info(state, binding, uid=binding.pod_uid)
    except HossError as error:
        return admission.Verdict(allowed=False, reason="malformed-pod", code=400, message=f"hoss: {error}")
    if pod is None:
        return admission.Verdict(
            allowed=False, reason="unknown-pod", code=409,
            message=f"hoss: pod {binding.pod_key} is not known to the resolver yet; retry",
        )
    try:
        async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
            request = await _counted(state, binding.node, pod.request)
        # The meta carries the pod's priority: room held for a preempting pod of higher priority stays free.
        result = await _confirm(state, binding, uid=pod.uid, pod=pod.key, request=request, owner=owner,
                                meta=pod.meta)
    except (LedgerUnavailable, TimeoutError) as error:
        return unavailable(error)
    return verdict_for(result, binding=binding)


async def judge_pod_write(state: WebhookState, write: admission.PodWriteRequest) -> admission.Verdict:
    """A pod created with spec.nodeName, or an in-place resize: the same atomic check as a binding, with the
    request read from the pod in the review (no lookup). A resize of a pod not bound yet is judged on the node of
    its entry (a reservation, or a binding admitted that may still commit), if it has one. A create under a name
    another pod holds is answered AlreadyExists (one GET of the name; `name_taken`), and a foreign user's creates
    not yet confirmed hold at most one node's room (`UnconfirmedCreates`)."""
    own = write.username in state.hoss_usernames
    if state.settings.enforce == "hoss-only" and not own:
        return admission.Verdict(allowed=True, reason="not-enforced")
    if nodes_own_mirror(write):
        # A static pod's mirror: the kubelet runs the pod whatever the apiserver says, so refusing the mirror would
        # only hide it from the ledger. The sync counts it (an overcommit is counted and logged).
        return admission.Verdict(allowed=True, reason="mirror-pod")
    binding = admission.BindingRequest(
        review_uid=write.review_uid, namespace=write.namespace, pod=write.pod, pod_uid=None, node=write.node,
        username=write.username, dry_run=write.dry_run,
    )
    try:
        info = parse_pod(write.object)
    except HossError as error:
        return admission.Verdict(allowed=False, reason="malformed-pod", code=400, message=f"hoss: {error}")
    if not info.uid:
        return admission.Verdict(allowed=False, reason="malformed-pod", code=400,
                                 message=f"hoss: pod {write.pod_key}: metadata.uid is missing")
    owner = write.username if own else f"foreign:{write.username}"
    if write.operation == "create" and (taken := name_taken(write, await _name_holder(state, write),
                                                            uid=info.uid)) is not None:
        return taken
    try:
        async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
            request = await _counted(state, write.node, info.request)
            if write.operation == "create":
                result = await state.ledger.confirm(
                    uid=info.uid, pod=info.key, node=write.node, request=request, owner=owner,
                    verify_after_seconds=state.settings.verify_after_seconds, dry_run=write.dry_run, via="create",
                    ports=info.ports, meta=info.meta, limit_owner=not own,
                )
            else:
                old = parse_pod(write.old_object) if write.old_object is not None else None
                if old is not None and all(info.request.get(r, 0) <= old.request.get(r, 0) for r in info.request):
                    # Nothing grows: the sync applies the smaller request once the kubelet allocated it.
                    return admission.Verdict(allowed=True, reason="resize-not-growing")
                result = await state.ledger.resize(
                    uid=info.uid, pod=info.key, node=write.node, request=request, owner=owner,
                    verify_after_seconds=state.settings.verify_after_seconds, dry_run=write.dry_run,
                    check_after_seconds=0.0 if state.authenticate else state.settings.held_write_timeout_seconds,
                )
    except (LedgerUnavailable, TimeoutError) as error:
        return unavailable(error)
    except HossError as error:
        return admission.Verdict(allowed=False, reason="malformed-pod", code=400, message=f"hoss: {error}")
    if isinstance(result, Confirmed) and not result.node:
        # A pod with neither node nor entry: nothing holds room for it yet; the growth is remembered for bindings.
        return admission.Verdict(allowed=True, reason="resize-unplaced")
    return verdict_for(result, binding=binding)
