"""The conflict resolver: a validating admission webhook that judges every pod binding against the ledger.

``POST /validate-binding`` takes an AdmissionReview v1 for ``pods/binding`` or ``bindings``. The hot path is one
Redis call (``Ledger.confirm``) and no apiserver call: a hoss worker's binding carries the pod's uid and the
worker's reservation already holds the pod's request, so the ledger is asked without one. Only a binding with no
entry in the ledger (a foreign scheduler's, or a hoss binding whose reservation expired) needs the pod's request:
from the sync's index of bound pods when this replica syncs and has the pod, else from one GET of the pod. A
binding is allowed when the pod's reservation is for that node, or (a foreign scheduler's binding) when the pod
still fits, in which case the same call records it. Otherwise it is denied with HTTP 200, ``allowed: false``,
status code 409 and a message naming node, resource, requested and free. A ledger that is unreachable or not
ready denies (fail closed): nothing is oversold, scheduling pauses and resumes by itself.

Every replica serves the webhook; one replica, elected on a Lease (``--lease-name``), runs the ledger sync
(`resolver.sync.LedgerSync`). Losing the Lease stops the sync at once; a sync that fails ends the process with a
non-zero status.

Also serves /healthz, /readyz (ready when the ledger is ready, on followers too), /metrics (Prometheus) and
/status (JSON), and publishes its verdicts and review latency to Redis for the dispatcher's /status.

Only the apiserver may post reviews (``--client-ca-file``): the TLS handshake asks every client for a certificate
and verifies one that is presented against that CA (a bad one ends the handshake); /validate-binding answers 401
on a connection without a verified certificate and 403 when its names are not in ``--client-names``. The
certificate is asked for, not required, so that the kubelet's probes (which present none) reach /healthz and
/readyz on the same port. The check is made once per connection, so a review costs no more with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import math
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import aiohttp
import hiredis
import orjson
from cryptography import x509
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from redis.exceptions import RedisError

from hoss.errors import HossError, LedgerUnavailable
from hoss.kube.access import TokenAccess, challenge
from hoss.kube.client import InformerHandlers, KubeError, api_client, raise_if_cancelled, run_informer
from hoss.kube.leader import KubeLeaseAPI, LeaderElector
from hoss.kube.rest import KubeREST
from hoss.ledger.client import (
    STATS_KEY,
    Confirmed,
    ConfirmResult,
    Conflict,
    HeldElsewhere,
    Ledger,
    LedgerNotReady,
    NeedRequest,
    QuotaExceeded,
    QuotaReport,
    UnknownNode,
)
from hoss.ledger.redisclient import PipelinedRedis
from hoss.model import admission
from hoss.model.objects import Json
from hoss.model.resources import ResourceVector, format_quantity
from hoss.settings import SettingsError, load_settings, run_loop
from resolver.httpserver import Handler, HttpServer, Request, Response
from resolver.mirror import PodIndex, PodInfo, parse_pod
from resolver.router import NamespaceLabels, Rule, load_rules, mutation_response, route
from resolver.settings import ResolverSettings
from resolver.sync import LedgerSync

log = logging.getLogger(__name__)

PodReader = Callable[[str, str], Awaitable[Json]]
"""GET of one pod (namespace, name) as raw JSON; raises KubeError (404 when there is none) or a network error."""
LATENCY_WINDOW = 2048
"""How many recent reviews the p50/p99 latency is computed over."""
POD_READ_TIMEOUT_SECONDS = 2.0
"""Deadline of the pod GET a binding without a reservation needs (the apiserver gives the webhook 5 s in all)."""
LEDGER_CALL_TIMEOUT_SECONDS = 2.0
"""Deadline of one ledger call made for a review; past it the binding is denied (fail closed)."""


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


@dataclass
class Denial:
    at: float
    pod: str
    node: str
    username: str
    reason: str
    message: str


class LatencyWindow:
    """The durations of the last `size` reviews, for their p50 and p99 (nearest rank). Adding is O(1); the
    percentiles sort the window, which is only done when someone reads them (/metrics, /status, the stats hash)."""

    def __init__(self, size: int = LATENCY_WINDOW) -> None:
        self._values = [0.0] * size
        self._size = size
        self._next = 0

    def add(self, seconds: float) -> None:
        self._values[self._next % self._size] = seconds
        self._next += 1

    @property
    def count(self) -> int:
        """How many reviews the window holds (at most its size)."""
        return min(self._next, self._size)

    def quantiles(self, *qs: float) -> list[float]:
        """The `qs` quantiles (0 < q <= 1) of the window in seconds; NaN when it is empty."""
        n = self.count
        if n == 0:
            return [math.nan for _ in qs]
        ordered = sorted(self._values[:n])
        return [ordered[min(max(math.ceil(q * n) - 1, 0), n - 1)] for q in qs]

    def summary_ms(self) -> dict[str, float | int | None]:
        """``{p50, p99, count}`` in milliseconds (None while empty), as /status and the stats hash show it."""
        p50, p99 = self.quantiles(0.5, 0.99)
        return {
            "p50": None if math.isnan(p50) else round(p50 * 1000, 3),
            "p99": None if math.isnan(p99) else round(p99 * 1000, 3),
            "count": self.count,
        }


LEDGER_COUNTERS = {
    "overcommits": "Bound pods the sync recorded on a node that had no room for them (cluster-wide, since the "
                   "ledger was created)",
    "audit_drift": "Ledger entries or nodes the periodic audit found unequal to the apiserver, and repaired",
    "stale_ledger": "Times Redis came back holding an older copy of the ledger (detected and rebuilt)",
}


@dataclass
class WebhookState:
    """Everything the handlers share: settings, ledger, the sync while this replica runs it, metrics and recent
    denials. ``get_pod`` reads a pod from the apiserver (None: no apiserver, e.g. in tests); ``pods`` is an index
    consulted when no sync runs (tests)."""

    settings: ResolverSettings
    ledger: Ledger
    pods: PodIndex = field(default_factory=PodIndex)
    sync: LedgerSync | None = None
    get_pod: PodReader | None = None
    elector: LeaderElector | None = None
    server: HttpServer | None = None
    access: TokenAccess | None = None
    """With it (``--access=kubernetes``), /status and /metrics need a bearer token it accepts."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    denials: collections.deque[Denial] = field(default_factory=lambda: collections.deque(maxlen=50))
    verdict_counts: collections.Counter[str] = field(default_factory=collections.Counter)
    review_latency: LatencyWindow = field(default_factory=LatencyWindow)
    pod_reads: int = 0
    """pods the webhook had to GET from the apiserver (a binding whose pod neither index of the sync held)"""
    ledger_stats: dict[str, str] = field(default_factory=dict)
    """``{hoss}:stats`` as last read (overcommits, audit_drift, stale_ledger), refreshed by publish_stats"""
    namespaces: NamespaceLabels = field(default_factory=NamespaceLabels)
    """Namespace labels for the router (an informer keeps them while the resolver runs)."""
    routing_rules: list[Rule] = field(default_factory=list)
    routed: collections.Counter[str] = field(default_factory=collections.Counter)
    """Router outcomes: policy name of each routed pod, or 'unchanged'."""
    quota_report: QuotaReport | None = None
    """Elastic quotas and their use as last read (publish_stats), for /metrics and /status."""

    def __post_init__(self) -> None:
        self.hoss_usernames = frozenset(self.settings.hoss_usernames)
        self.verdicts = Counter(
            "hoss_resolver_verdicts", "Binding verdicts by outcome and reason",
            ["allowed", "reason"], registry=self.registry,
        )
        self.latency = Histogram(
            "hoss_resolver_review_duration_seconds", "Time to judge one AdmissionReview",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0), registry=self.registry,
        )
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            Gauge(
                f"hoss_resolver_review_latency_{name}_seconds",
                f"{name} of the time to judge one AdmissionReview, over the last {LATENCY_WINDOW} reviews",
                registry=self.registry,
            ).set_function(functools.partial(self._latency_quantile, q))
        Gauge(
            "hoss_resolver_sync_leader", "1 while this replica holds the Lease and runs the ledger sync",
            registry=self.registry,
        ).set_function(lambda: float(self.sync is not None))
        Gauge(
            "hoss_resolver_serving_certificate_expiry_timestamp_seconds",
            "When the serving certificate on disk expires (Unix time; NaN when unreadable): alert well before it",
            registry=self.registry,
        ).set_function(lambda: certificate_expiry(self.settings.tls_cert_file))
        for counter, what in LEDGER_COUNTERS.items():
            Gauge(f"hoss_ledger_{counter}", what, registry=self.registry).set_function(
                functools.partial(self._ledger_counter, counter)
            )
        self.registry.register(QuotaCollector(self))
        self._verdict_children: dict[tuple[bool, str], Any] = {}
        self.authenticate = self.settings.client_ca_file is not None
        self.client_names = frozenset(self.settings.client_names)
        Gauge(
            "hoss_resolver_pod_reads", "Pods the webhook read from the apiserver to judge a binding (neither the"
            " index of bound pods nor that of other schedulers' pending pods held the pod)", registry=self.registry,
        ).set_function(lambda: float(self.pod_reads))
        self.refused = Counter(
            "hoss_resolver_refused_reviews", "Reviews refused before judging: no client certificate (401) or a"
            " client name not allowed (403)", ["code"], registry=self.registry,
        )

    def refusal(self, request: Request) -> Response | None:
        """401 or 403 when the review's client may not post reviews; None when it may (or nobody is checked)."""
        if not self.authenticate:
            return None
        names = request.client_names
        if names is None:
            self.refused.labels("401").inc()
            return _json({"error": "a client certificate signed by the webhook's client CA is required"}, status=401)
        if self.client_names and self.client_names.isdisjoint(names):
            self.refused.labels("403").inc()
            shown = ", ".join(names) or "no names"
            return _json({"error": f"client certificate ({shown}) is not allowed to post reviews"}, status=403)
        return None

    def _ledger_counter(self, counter: str) -> float:
        try:
            return float(self.ledger_stats.get(counter, 0))
        except ValueError:
            return math.nan

    def _latency_quantile(self, q: float) -> float:
        return self.review_latency.quantiles(q)[0]

    def count_verdict(self, verdict: admission.Verdict) -> None:
        self.verdict_counts[verdict.reason] += 1
        key = (verdict.allowed, verdict.reason)
        child = self._verdict_children.get(key)
        if child is None:
            child = self._verdict_children[key] = self.verdicts.labels(str(verdict.allowed).lower(), verdict.reason)
        child.inc()


async def _pod_info(state: WebhookState, binding: admission.BindingRequest) -> PodInfo | None:
    """The pod's view for a binding without a reservation: from the sync's index of bound pods when this replica
    syncs and has it, else one GET from the apiserver. None when the pod is unknown (or another pod by that name).

    A binding without a uid is looked up by GET only: by name, the index may still hold a deleted pod of that
    name (its DELETED event not applied yet), whose request and uid are not the live pod's."""
    index = state.sync.pods if state.sync is not None else state.pods
    found = index.find(uid=binding.pod_uid, key=binding.pod_key) if binding.pod_uid else None
    if found is None and binding.pod_uid and state.sync is not None:
        # a foreign scheduler's pending pod, as the sync's informer last saw it (same uid: the same pod, whose
        # requests only an in-place resize changes, and that bumps the generation the informer follows)
        found = state.sync.pending.find(uid=binding.pod_uid, key=binding.pod_key)
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
    if binding.pod_uid and info.uid != binding.pod_uid:
        return None
    return info


def _unavailable(error: LedgerUnavailable | TimeoutError) -> admission.Verdict:
    why = str(error) if isinstance(error, LedgerUnavailable) else f"no answer within {LEDGER_CALL_TIMEOUT_SECONDS}s"
    return admission.Verdict(
        allowed=False, reason="ledger-unavailable", code=503,
        message=f"hoss: the ledger is unreachable ({why}); binding denied, retry later",
    )


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
    settings = state.settings
    own = binding.username in state.hoss_usernames
    if settings.enforce == "hoss-only" and not own:
        return admission.Verdict(allowed=True, reason="not-enforced")
    owner = binding.username if own else f"foreign:{binding.username}"
    if own and binding.pod_uid:
        # A hoss worker's binding: its reservation holds the request, so no pod lookup is needed.
        try:
            result = await _confirm(state, binding, uid=binding.pod_uid, pod=binding.pod_key, request=None, owner=owner)
        except (LedgerUnavailable, TimeoutError) as error:
            return _unavailable(error)
        if not isinstance(result, NeedRequest):
            return verdict_for(result, binding=binding)
    try:
        pod = await _pod_info(state, binding)
    except HossError as error:
        return admission.Verdict(allowed=False, reason="malformed-pod", code=400, message=f"hoss: {error}")
    if pod is None:
        return admission.Verdict(
            allowed=False, reason="unknown-pod", code=409,
            message=f"hoss: pod {binding.pod_key} is not known to the resolver yet; retry",
        )
    try:
        # The meta carries the pod's priority: room held for a preempting pod of higher priority stays free.
        result = await _confirm(state, binding, uid=pod.uid, pod=pod.key, request=pod.request, owner=owner,
                                meta=pod.meta)
    except (LedgerUnavailable, TimeoutError) as error:
        return _unavailable(error)
    return verdict_for(result, binding=binding)


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


async def judge_pod_write(state: WebhookState, write: admission.PodWriteRequest) -> admission.Verdict:
    """A pod created with spec.nodeName, or an in-place resize: the same atomic check as a binding, with the
    request read from the pod in the review (no lookup)."""
    own = write.username in state.hoss_usernames
    if state.settings.enforce == "hoss-only" and not own:
        return admission.Verdict(allowed=True, reason="not-enforced")
    metadata = write.object.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if isinstance(annotations, dict) and MIRROR_ANNOTATION in annotations:
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
    try:
        async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
            if write.operation == "create":
                result = await state.ledger.confirm(
                    uid=info.uid, pod=info.key, node=write.node, request=info.request, owner=owner,
                    verify_after_seconds=state.settings.verify_after_seconds, dry_run=write.dry_run, via="create",
                    ports=info.ports, meta=info.meta,
                )
            else:
                old = parse_pod(write.old_object) if write.old_object is not None else None
                if old is not None and all(info.request.get(r, 0) <= old.request.get(r, 0) for r in info.request):
                    # Nothing grows: the sync applies the smaller request once the kubelet allocated it.
                    return admission.Verdict(allowed=True, reason="resize-not-growing")
                result = await state.ledger.resize(
                    uid=info.uid, pod=info.key, node=write.node, request=info.request, owner=owner,
                    verify_after_seconds=state.settings.verify_after_seconds, dry_run=write.dry_run,
                )
    except (LedgerUnavailable, TimeoutError) as error:
        return _unavailable(error)
    except HossError as error:
        return admission.Verdict(allowed=False, reason="malformed-pod", code=400, message=f"hoss: {error}")
    return verdict_for(result, binding=binding)


FAIL_OPEN_REASONS = frozenset({"ledger-not-ready", "ledger-unavailable", "unknown-node"})
"""Verdicts the system entry (/validate-system) turns into an allow: the ledger cannot judge, and refusing would
keep hoss's own pods, Redis or CoreDNS from starting (the deadlock the exemption exists for)."""


JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


def _json(body: object, *, status: int = 200) -> Response:
    return Response(status, orjson.dumps(body), JSON)


def _text(text: str, *, status: int = 200) -> Response:
    return Response(status, text.encode(), TEXT)


async def mutate_pod(state: WebhookState, request: Request) -> Response:
    """The router (`resolver.router`): route a pod being created to hoss when its namespace or a rule says so."""
    refused = state.refusal(request)
    if refused is not None:
        return refused
    try:
        review = orjson.loads(request.body)
        inner = review["request"]
        uid, pod, namespace = str(inner["uid"]), inner.get("object") or {}, str(inner.get("namespace") or "")
    except (orjson.JSONDecodeError, KeyError, TypeError) as error:
        return _json({"error": f"malformed AdmissionReview: {error!r}"}, status=400)
    if not isinstance(pod, dict):
        return _json({"error": f"malformed AdmissionReview: request.object is not a pod: {pod!r:.80}"}, status=400)
    patch, why = route(pod, state.namespaces.labels.get(namespace, {}), state.routing_rules,
                       scheduler_name=state.settings.scheduler_names[0])
    state.routed[why.removeprefix("policy ") if patch else "unchanged"] += 1
    if patch:
        log.debug("routed a pod of %s to %s (%s)", namespace, state.settings.scheduler_names[0], why)
    return Response(200, mutation_response(uid, patch), JSON)


async def validate_binding(state: WebhookState, request: Request, *, fail_open: bool = False) -> Response:
    started = time.perf_counter()
    refused = state.refusal(request)
    if refused is not None:
        return refused
    try:
        parsed = admission.parse_review(request.body)
    except admission.MalformedReview as error:
        state.verdict_counts["malformed"] += 1
        return _json({"error": f"malformed AdmissionReview: {error}"}, status=400)
    if isinstance(parsed, admission.OtherRequest):
        verdict = admission.Verdict(allowed=True, reason="not-a-binding")
    else:
        if isinstance(parsed, admission.PodWriteRequest):
            verdict = await judge_pod_write(state, parsed)
        else:
            verdict = await judge(state, parsed)
        if fail_open and not verdict.allowed and verdict.reason in FAIL_OPEN_REASONS:
            log.warning("allowed %s of %s to %s unjudged (system namespace, fail open): %s",
                        "binding" if isinstance(parsed, admission.BindingRequest) else parsed.operation,
                        parsed.pod_key, parsed.node, verdict.message)
            verdict = admission.Verdict(allowed=True, reason="system-unjudged")
        if not verdict.allowed:
            state.denials.append(
                Denial(time.time(), parsed.pod_key, parsed.node, parsed.username, verdict.reason, verdict.message)
            )
            log.info("denied binding of %s to %s by %s: %s", parsed.pod_key, parsed.node, parsed.username,
                     verdict.message)
    state.count_verdict(verdict)
    response = Response(200, admission.review_response_bytes(parsed.review_uid, verdict), JSON)
    elapsed = time.perf_counter() - started
    state.latency.observe(elapsed)
    state.review_latency.add(elapsed)
    return response


async def validate_system(state: WebhookState, request: Request) -> Response:
    """The entry for the system namespaces (kube-system, hoss-system): judged as any other, but a write the ledger
    cannot judge is allowed (see FAIL_OPEN_REASONS); the webhook entry also has failurePolicy Ignore."""
    return await validate_binding(state, request, fail_open=True)


async def healthz(_state: WebhookState, _request: Request) -> Response:
    return _text("ok")


async def readyz(state: WebhookState, _request: Request) -> Response:
    """Ready when the ledger is (its ready key is set): a replica that does not sync judges bindings too."""
    try:
        async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
            ready = await state.ledger.is_ready()
    except (LedgerUnavailable, TimeoutError) as error:
        return _text(f"ledger unavailable: {error or 'no answer'}", status=503)
    return _text("ok") if ready else _text("ledger not ready", status=503)


async def metrics(state: WebhookState, _request: Request) -> Response:
    return Response(200, generate_latest(state.registry), CONTENT_TYPE_LATEST)


async def status(state: WebhookState, _request: Request) -> Response:
    try:
        async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
            ready: bool | str = await state.ledger.is_ready()
            epoch = await state.ledger.epoch()
    except (LedgerUnavailable, TimeoutError) as error:
        ready, epoch = f"unavailable: {error or 'no answer'}", None
    sync = state.sync
    elector = state.elector
    return _json(
        {
            "ledger": {"ready": ready, "epoch": epoch},
            "leader": sync is not None,
            "identity": None if elector is None else elector.identity,
            "leader_identity": None if elector is None else elector.holder,
            "sync": None if sync is None else {
                "synced": sync.synced.is_set(), "nodes": len(sync.nodes), "pods": len(sync.pods.by_uid),
                "foreign_pending_pods": len(sync.pending.by_uid),
                **sync.stats.__dict__,
            },
            "enforce": state.settings.enforce,
            "ledger_counters": {counter: int(state.ledger_stats.get(counter, 0)) for counter in LEDGER_COUNTERS},
            "ledger_last": {key: value for key, value in state.ledger_stats.items() if key.startswith("last_")},
            "verdicts": dict(state.verdict_counts),
            "review_latency_ms": state.review_latency.summary_ms(),
            "pod_reads": state.pod_reads,
            "http": None if state.server is None else {
                "connections_accepted": state.server.accepted, "connections_open": len(state.server.connections),
                "requests": state.server.requests,
            },
            "recent_denials": [d.__dict__ for d in reversed(state.denials)],
            "routed": dict(state.routed),
            "quotas": [] if state.quota_report is None else [
                {"namespace": use.quota.namespace, "min": use.quota.min, "max": use.quota.max, "used": use.used,
                 "borrowed": use.borrowed} for use in state.quota_report.quotas
            ],
        }
    )


class QuotaCollector(Collector):
    """hoss_quota_{min,max,used,borrowed}{namespace,resource}: each elastic quota and its use (base units), from the
    ledger as `publish_stats` last read it."""

    HELP: ClassVar[dict[str, str]] = {
        "min": "ElasticQuota spec.min (base units: milli-CPU, bytes, counts)",
        "max": "ElasticQuota spec.max (base units); a resource missing is not limited",
        "used": "What the namespace's pods hold in the ledger (reserved, admitted, bound), base units",
        "borrowed": "used above min, per resource the quota names (borrowed from others' idle guarantee)",
    }

    def __init__(self, state: WebhookState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {name: GaugeMetricFamily(f"hoss_quota_{name}", text, labels=["namespace", "resource"])
                    for name, text in self.HELP.items()}
        report = self.state.quota_report
        for use in report.quotas if report is not None else ():
            for name, vector in (("min", use.quota.min), ("max", use.quota.max), ("used", use.used),
                                 ("borrowed", use.borrowed)):
                for resource, amount in vector.items():
                    families[name].add_metric([use.quota.namespace, resource], amount)
        yield from families.values()


def build_server(state: WebhookState) -> HttpServer:
    """The resolver's HTTP(S) endpoints: POST /validate-binding (and its lanes' paths, /validate-binding/lane-N)
    and /validate-system (the apiserver's client
    certificate, `WebhookState.refusal`), GET /healthz, /readyz (open: probes), /metrics, /status (``state.access``)."""
    routes: dict[tuple[str, str], Callable[[WebhookState, Request], Awaitable[Response]]] = {
        **{("POST", admission.lane_path(lane)): validate_binding for lane in range(admission.SERVED_LANES)},
        ("POST", "/validate-system"): validate_system,
        ("POST", "/mutate-pod"): mutate_pod,
        ("GET", "/healthz"): healthz,
        ("GET", "/readyz"): readyz,
        ("GET", "/metrics"): metrics,
        ("GET", "/status"): status,
    }
    limit = state.settings.max_body_bytes

    def too_large(_request: Request) -> Response:
        return _json({"error": f"AdmissionReview larger than {limit} bytes"}, status=400)

    def bound(path: str, handler: Callable[[WebhookState, Request], Awaitable[Response]]) -> Handler:
        access = state.access
        if access is None or path not in access.paths:
            return functools.partial(handler, state)

        async def guarded(request: Request) -> Response:
            refusal = await access.authorize(request.path, request.headers.get("authorization", ""))
            if refusal is not None:
                code, message = refusal
                return Response(code, orjson.dumps({"error": message}), JSON, challenge(code))
            return await handler(state, request)

        return guarded

    server = HttpServer(
        {(method, path): bound(path, handler) for (method, path), handler in routes.items()},
        max_body_bytes=limit, too_large=too_large,
    )
    state.server = server
    return server


_EXPIRY_CACHE: dict[str, tuple[float, float]] = {}


def certificate_expiry(cert_file: str) -> float:
    """The notAfter of the PEM certificate in ``cert_file`` as Unix time (re-read only when the file changes); NaN
    when it cannot be read."""
    try:
        stamp = os.stat(cert_file).st_mtime
        cached = _EXPIRY_CACHE.get(cert_file)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        with open(cert_file, "rb") as pem:
            expiry = x509.load_pem_x509_certificate(pem.read()).not_valid_after_utc.timestamp()
    except (OSError, ValueError):
        return math.nan
    _EXPIRY_CACHE[cert_file] = (stamp, expiry)
    return expiry


def tls_context(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    """The serving context; with ``client_ca_file`` it asks clients for a certificate and verifies it against that
    CA alone (never the system's trust store: a public CA must not vouch for a reviewer)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file is not None:
        context.load_verify_locations(cafile=client_ca_file)
        context.verify_mode = ssl.CERT_OPTIONAL
    # No session tickets: the apiserver's webhook client keeps no session cache, so each new connection is a full
    # handshake anyway, and issuing tickets nobody presents costs every handshake.
    context.options |= ssl.OP_NO_TICKET
    return context


async def reload_certificates(
    context: ssl.SSLContext, cert_file: str, key_file: str, interval: float = 5.0, *, client_ca_file: str | None = None
) -> None:
    """Load the serving certificate again whenever its files change (new handshakes use the new one), and the
    client CA file when it changes (its CAs are added to those trusted: a context cannot forget a CA, so a CA
    removed from the file stays trusted until the resolver restarts)."""

    def stamp(*paths: str) -> tuple[float, ...]:
        return tuple(os.stat(path).st_mtime for path in paths)

    seen = stamp(cert_file, key_file)
    seen_ca = stamp(client_ca_file) if client_ca_file is not None else ()
    while True:
        await asyncio.sleep(interval)
        try:
            current = stamp(cert_file, key_file)
            if current != seen:
                context.load_cert_chain(cert_file, key_file)
                seen = current
                log.info("reloaded serving certificate from %s", cert_file)
        except (OSError, ssl.SSLError) as error:
            log.warning("cannot reload serving certificate (keeping the old one): %s", error)
        if client_ca_file is None:
            continue
        try:
            current = stamp(client_ca_file)
            if current != seen_ca:
                context.load_verify_locations(cafile=client_ca_file)
                seen_ca = current
                log.info("reloaded the webhook's client CA from %s", client_ca_file)
        except (OSError, ssl.SSLError) as error:
            log.warning("cannot reload the client CA (keeping the old one): %s", error)


def stats_fields(state: WebhookState) -> dict[str, str]:
    """The resolver's stats hash (``{hoss}:resolver:<instance>``) that the dispatcher's /status reads."""
    latency = state.review_latency.summary_ms()
    return {
        "verdicts": json.dumps(dict(state.verdict_counts)),
        "recent_denials": json.dumps([d.__dict__ for d in reversed(state.denials)]),
        "review_p50_ms": "" if latency["p50"] is None else str(latency["p50"]),
        "review_p99_ms": "" if latency["p99"] is None else str(latency["p99"]),
        "leader": "1" if state.sync is not None else "0",
        "updated_unix": f"{time.time():.3f}",
    }


async def publish_stats(state: WebhookState, redis: Redis, *, instance: str, interval: float = 2.0) -> None:
    """Publish verdict counts, review latency and recent denials for the dispatcher's /status (one key per
    resolver replica)."""
    key = f"{{hoss}}:resolver:{instance}"
    while True:
        try:
            pipe = redis.pipeline(transaction=True)
            fields: dict[Any, Any] = stats_fields(state)
            pipe.hset(key, mapping=fields)
            pipe.expire(key, int(interval * 10))
            pipe.hgetall(STATS_KEY)
            state.ledger_stats = dict((await pipe.execute())[-1] or {})
        except RedisError as error:
            log.warning("cannot publish resolver stats: %s", error)
        try:
            async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
                state.quota_report = await state.ledger.quotas()
        except (HossError, TimeoutError) as error:
            log.warning("cannot read elastic quotas' use: %s", error or "no answer")
        raise_if_cancelled()
        await asyncio.sleep(interval)


async def sync_while_leading(
    state: WebhookState,
    elector: LeaderElector,
    make_sync: Callable[[], LedgerSync],
    *,
    stop_timeout_seconds: float = 10.0,
) -> None:
    """Run a fresh ledger sync each time this replica becomes leader, and stop it the moment it is not.

    Returns only by raising: a sync that ends (it never does unless it fails) ends this task with its error, and
    so does a sync that does not stop within ``stop_timeout_seconds`` of losing the Lease (a deposed leader must
    not keep writing), so the resolver exits non-zero instead of judging against a ledger nobody keeps.
    """
    while True:
        await elector.leading.wait()
        sync = make_sync()
        state.sync = sync
        log.info("leading: starting the ledger sync")
        running = asyncio.create_task(sync.run(), name="ledger-sync")
        lost = asyncio.create_task(elector.following.wait(), name="lease-lost")
        try:
            done, _ = await asyncio.wait({running, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            state.sync = None
            for task in (running, lost):
                task.cancel()
            await asyncio.wait({running, lost}, timeout=stop_timeout_seconds)
        if not running.done():
            raise RuntimeError(f"the ledger sync did not stop within {stop_timeout_seconds:.0f}s of being cancelled")
        if running in done:
            error = running.exception()
            raise error if error is not None else RuntimeError("the ledger sync ended")
        log.warning("lost the Lease: stopped the ledger sync")


class HiredisPack:
    """Connection mixin: commands are packed by hiredis's C packer. redis-py's asyncio connections pack in Python,
    which for a ledger script call (a dozen arguments and more) costs several times the rest of the call."""

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if isinstance(first, str) and " " in first:
            args = (*first.split(), *args[1:])  # "SCRIPT LOAD" and the like are sent as separate words
        return [hiredis.pack_command(args)]


def ledger_redis(url: str, **options: Any) -> Redis:
    """A Redis client for the ledger at ``url`` whose connections pack commands with hiredis."""
    client = Redis.from_url(url, decode_responses=True, **options)
    pool = client.connection_pool
    base = pool.connection_class
    pool.connection_class = type(f"HiredisPack{base.__name__}", (HiredisPack, base), {})
    return client


@contextlib.asynccontextmanager
async def running_resolver(settings: ResolverSettings) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Start the webhook server, the Lease election and the sync (while leading) and timers; stop them on exit.

    Yields the tasks whose end is fatal (the sync's role and the election)."""
    async with contextlib.AsyncExitStack() as stack:
        # Two clients on the ledger: the sync's (redis-py), and the webhook's, one pipelined connection that costs
        # a fraction of redis-py's CPU per call (see hoss.ledger.redisclient); each review bounds its call with
        # asyncio.timeout (see _confirm). Ledger uses only what PipelinedRedis offers for the webhook's calls.
        ledger = Ledger(ledger_redis(settings.redis_url), owns_client=True)
        stack.push_async_callback(ledger.close)
        review_ledger = Ledger(
            cast(Redis, PipelinedRedis(settings.redis_url, connect_timeout=LEDGER_CALL_TIMEOUT_SECONDS)),
            owns_client=True,
        )
        stack.push_async_callback(review_ledger.close)
        api = await api_client(settings.kubeconfig)
        stack.push_async_callback(api.close)
        # Pod reads for bindings without a reservation go over their own lean keep-alive client, so they never
        # queue behind the sync's watches or the Lease renewals.
        rest = await KubeREST.connect(settings.kubeconfig)
        stack.push_async_callback(rest.close)
        elector = LeaderElector(
            KubeLeaseAPI(
                api, name=settings.lease_name, namespace=settings.lease_namespace,
                request_timeout=settings.renew_deadline_seconds,
            ),
            identity=settings.identity,
            lease_duration_seconds=settings.lease_duration_seconds,
            renew_deadline_seconds=settings.renew_deadline_seconds,
            renew_interval_seconds=settings.renew_interval_seconds,
        )

        async def get_pod(namespace: str, name: str) -> Json:
            return await rest.get_pod(namespace, name, timeout=POD_READ_TIMEOUT_SECONDS)

        access = None
        if settings.access == "kubernetes":
            access = TokenAccess(rest, resource="resolvers", namespace=settings.access_namespace,
                                 cache_seconds=settings.access_cache_seconds)
        state = WebhookState(settings=settings, ledger=review_ledger, get_pod=get_pod, elector=elector,
                             access=access,
                             routing_rules=load_rules(settings.routing_file) if settings.routing_file else [])
        context = tls_context(settings.tls_cert_file, settings.tls_key_file, settings.client_ca_file)
        if settings.client_ca_file is None:
            log.warning(
                "client_ca_file is not set: anyone who reaches this port can post reviews (set --client-ca-file to the"
                " CA of the apiserver's webhook client certificate)"
            )
        server = build_server(state)
        await server.start(settings.host, settings.port, ssl_context=context)
        stack.push_async_callback(server.close)
        stats_redis = Redis.from_url(settings.redis_url, decode_responses=True)
        stack.push_async_callback(stats_redis.aclose)

        def make_sync() -> LedgerSync:
            return LedgerSync(ledger=ledger, api=api, expire_interval_seconds=settings.expire_interval_seconds,
                              write_timeout_seconds=settings.write_timeout_seconds,
                              audit_interval_seconds=settings.audit_interval_seconds,
                              hoss_scheduler_names=settings.hoss_scheduler_names)

        tasks = [
            asyncio.create_task(sync_while_leading(state, elector, make_sync), name="sync-role"),
            asyncio.create_task(elector.run(), name="leader-election"),
            asyncio.create_task(publish_stats(state, stats_redis, instance=settings.identity), name="publish-stats"),
            asyncio.create_task(
                run_informer("namespaces", client.CoreV1Api(api).list_namespace,
                             InformerHandlers(on_list=state.namespaces.on_list, on_event=state.namespaces.on_event)),
                name="namespace-labels",
            ),
            asyncio.create_task(
                reload_certificates(
                    context, settings.tls_cert_file, settings.tls_key_file, client_ca_file=settings.client_ca_file
                ),
                name="cert-reload",
            ),
        ]

        async def stop() -> None:
            # The sync stops first, then the Lease is handed back so another replica takes over at once.
            tasks[0].cancel()
            await asyncio.gather(tasks[0], return_exceptions=True)
            for task in tasks[1:]:
                task.cancel()
            await asyncio.gather(*tasks[1:], return_exceptions=True)
            await elector.release()

        stack.push_async_callback(stop)
        log.info(
            "hoss-resolver %s serving https://{%s}:%d (enforce=%s); sync elected on Lease %s/%s",
            settings.identity, ",".join(settings.host), settings.port, settings.enforce, settings.lease_namespace,
            settings.lease_name,
        )
        yield tasks[:2]


async def serve(settings: ResolverSettings) -> None:
    """Serve until SIGTERM or SIGINT (then the sync stops and the Lease is handed back, so another replica takes
    over at once). If the ledger sync ever fails, the resolver exits non-zero (fail loudly: a resolver that no
    longer syncs would judge bindings against a stale ledger), to be restarted by its supervisor."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with running_resolver(settings) as fatal:
        stop = asyncio.create_task(stopping.wait(), name="stop")
        done, _ = await asyncio.wait([stop, *fatal], return_when=asyncio.FIRST_COMPLETED)
        if stop in done:
            log.info("hoss-resolver stopping")
            return
        stop.cancel()
        ended = done.pop()
        error = ended.exception() if not ended.cancelled() else None
        raise SystemExit(f"hoss-resolver: {ended.get_name()} stopped: {error!r}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(
            ResolverSettings, argv, prog="hoss-resolver",
            description="hoss conflict resolver: admission webhook on pod bindings, backed by the Redis ledger",
        )
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    problems = settings.file_problems()
    if problems:
        print("hoss-resolver: invalid settings: " + "; ".join(problems), file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
