"""The webhook's HTTP endpoints, as an aiohttp application (served by `resolver.server`).

- ``POST /validate-binding`` (and its lanes' paths, ``/validate-binding/lane-N``) and ``/validate-system``: an
  AdmissionReview of a binding, a pod created on a node or a resize, judged by `resolver.judge` and answered with
  HTTP 200 and the verdict; a malformed review gets HTTP 400 naming the field; a body over ``max_body_bytes`` gets
  HTTP 400 and the connection is closed. The bodies being read at once hold at most ``max_pending_body_bytes``
  (`resolver.server.BodyBudget`): a review waits for its share before its body is read.
- ``POST /mutate-pod``: the router (`resolver.router`).
- ``GET /healthz``, ``/readyz`` (ready when the ledger is, on followers too), ``/metrics`` (Prometheus) and
  ``/status`` (JSON); the last two behind `hoss.kube.access` with ``--access=kubernetes``.

Only the apiserver may post reviews (``--client-ca-file``): the review paths answer 401 on a connection without a
verified client certificate and 403 when its names are not in ``--client-names``, and never read the body: the
connection closes after the answer (`unread_bodies_dropped`). The certificate was verified once, at the
connection's handshake (`resolver.tls`); a review only reads its names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from hoss.errors import LedgerUnavailable
from hoss.kube.access import middleware
from hoss.model import admission
from resolver.claims import MalformedClaimReview, judge_claim, parse_claim_review
from resolver.judge import LEDGER_CALL_TIMEOUT_SECONDS, judge, judge_pod_write, system_verdict
from resolver.metrics import LEDGER_COUNTERS
from resolver.router import mutation_response, route
from resolver.server import IDLE_TIMEOUT_SECONDS, BodyBudget, ConnectionLimits, WebhookServer
from resolver.state import Denial, WebhookState
from resolver.tls import client_names

log = logging.getLogger(__name__)

JSON = "application/json"
ReviewHandler = Callable[[WebhookState, bytes], Awaitable[web.Response]]
"""A review path's handler: the state and the review's body (its client already checked)."""


def _json(body: object, *, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type=JSON)


def refusal(names: tuple[str, ...] | None, *, allowed: frozenset[str]) -> tuple[int, str] | None:
    """401 or 403 and why, when a client whose verified certificate carries ``names`` (None: it presented none) may
    not post reviews; None when it may. An empty ``allowed`` lets any certificate of the client CA post. Pure."""
    if names is None:
        return 401, "a client certificate signed by the webhook's client CA is required"
    if allowed and allowed.isdisjoint(names):
        shown = ", ".join(names) or "no names"
        return 403, f"client certificate ({shown}) is not allowed to post reviews"
    return None


class _TooLarge(Exception):
    """The body is longer than max_body_bytes."""


async def _read_body(request: web.Request, *, budget: BodyBudget, limit: int, timeout_seconds: float) -> bytes:
    """The whole body, read once ``budget`` has room for it (its Content-Length, else ``limit``); a body still on its
    way, or waiting for room, gets ``timeout_seconds`` (TimeoutError)."""
    try:
        async with asyncio.timeout(timeout_seconds):
            taken = await budget.take(request.content_length if request.content_length is not None else limit)
        try:
            if request.content.is_eof():  # the usual review: it came with its headers, nothing to wait for
                return await request.read()
            async with asyncio.timeout(timeout_seconds):
                return await request.read()
        finally:
            budget.give(taken)
    except web.HTTPRequestEntityTooLarge as error:  # a chunked body: its length was not known up front
        raise _TooLarge from error


def review_endpoint(state: WebhookState, handler: ReviewHandler, *, body_timeout_seconds: float) -> Handler:
    """``handler`` behind the review paths' checks: the client's certificate, the body's size (before it is read),
    then the body within ``body_timeout_seconds``, once the state's body budget has room for it."""
    limit = state.settings.max_body_bytes
    budget = state.body_budget

    def too_large() -> web.Response:
        # Answered before the body is read; the server reads and drops the rest for a while, so that a client still
        # sending it reads this answer rather than a reset connection, then closes the connection.
        response = _json({"error": f"AdmissionReview larger than {limit} bytes"}, status=400)
        response.force_close()
        return response

    async def endpoint(request: web.Request) -> web.StreamResponse:
        if state.authenticate:
            refused = refusal(verified_names(request), allowed=state.client_names)
            if refused is not None:
                code, message = refused
                state.metrics.count_refusal(code)
                return _json({"error": message}, status=code)  # its body is never read (`unread_bodies_dropped`)
        length = request.content_length
        if length is not None and length > limit:
            return too_large()
        try:
            body = await _read_body(request, budget=budget, limit=limit, timeout_seconds=body_timeout_seconds)
        except _TooLarge:
            return too_large()
        except TimeoutError:
            response = _json({"error": f"the body did not arrive within {body_timeout_seconds:.0f}s"}, status=408)
            response.force_close()
            return response
        return await handler(state, body)

    return endpoint


def verified_names(request: web.Request) -> tuple[str, ...] | None:
    """The names in the client certificate the connection's handshake verified; None without one."""
    transport = request.transport
    return client_names(transport.get_extra_info("peercert")) if transport is not None else None


def unread_bodies_dropped() -> Middleware:
    """On a connection without a verified client certificate, a body its handler did not read (a review refused
    401, a path that takes none) is not read on: aiohttp would read and drop it for up to a few seconds after the
    answer, holding the connection and its buffers past any limit; the connection closes after the answer instead."""

    def drop(request: web.Request, response: web.StreamResponse) -> None:
        if not request.content.is_eof() and verified_names(request) is None:
            request.content.feed_eof()
            response.force_close()

    @web.middleware
    async def dropping(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as error:  # aiohttp's own answers (404, 405), raised
            drop(request, error)
            raise
        drop(request, response)
        return response

    return dropping


async def mutate_pod(state: WebhookState, body: bytes) -> web.Response:
    """The router (`resolver.router`): route a pod being created to hoss when its namespace or a rule says so."""
    try:
        review = orjson.loads(body)
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
    return web.Response(body=mutation_response(uid, patch), content_type=JSON)


async def validate_binding(state: WebhookState, body: bytes, *, fail_open: bool = False) -> web.Response:
    """Judge a review and answer its verdict; ``fail_open``: the system entry's (`resolver.judge.system_verdict`)."""
    started = time.perf_counter()
    try:
        parsed = admission.parse_review(body)
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
        if fail_open and (opened := system_verdict(verdict)) is not verdict:
            log.warning("allowed %s of %s to %s unjudged (system namespace, fail open): %s",
                        "binding" if isinstance(parsed, admission.BindingRequest) else parsed.operation,
                        parsed.pod_key, parsed.node, verdict.message)
            verdict = opened
        if not verdict.allowed:
            state.denials.append(
                Denial(time.time(), parsed.pod_key, parsed.node, parsed.username, verdict.reason, verdict.message)
            )
            log.info("denied binding of %s to %s by %s: %s", parsed.pod_key, parsed.node, parsed.username,
                     verdict.message)
    state.count_verdict(verdict)
    response = web.Response(body=admission.review_response_bytes(parsed.review_uid, verdict), content_type=JSON)
    state.record_review(time.perf_counter() - started)
    return response


async def validate_system(state: WebhookState, body: bytes) -> web.Response:
    """The entry for the system namespaces (kube-system, hoss-system): judged as any other, but a write the ledger
    cannot judge is allowed (see FAIL_OPEN_REASONS); the webhook entry also has failurePolicy Ignore."""
    return await validate_binding(state, body, fail_open=True)


async def validate_claim(state: WebhookState, body: bytes) -> web.Response:
    """Judge a ResourceClaim allocation (`resolver.claims`) and answer its verdict."""
    started = time.perf_counter()
    try:
        write = parse_claim_review(body)
    except MalformedClaimReview as error:
        state.verdict_counts["malformed"] += 1
        return _json({"error": f"malformed AdmissionReview: {error}"}, status=400)
    verdict = await judge_claim(state, write)
    if not verdict.allowed:
        state.denials.append(Denial(time.time(), write.claim, "", write.username, verdict.reason, verdict.message))
        log.info("denied the allocation of ResourceClaim %s by %s: %s", write.claim, write.username,
                 verdict.message)
    state.count_verdict(verdict)
    response = web.Response(body=admission.review_response_bytes(write.review_uid, verdict), content_type=JSON)
    state.record_review(time.perf_counter() - started)
    return response


async def readyz(state: WebhookState) -> web.Response:
    """Ready when the ledger is (its ready key is set): a replica that does not sync judges bindings too."""
    try:
        async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
            ready = await state.ledger.is_ready()
    except (LedgerUnavailable, TimeoutError) as error:
        return web.Response(status=503, text=f"ledger unavailable: {error or 'no answer'}")
    return web.Response(text="ok") if ready else web.Response(status=503, text="ledger not ready")


async def status(state: WebhookState) -> web.Response:
    try:
        async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
            ready: bool | str = await state.ledger.is_ready()
            epoch = await state.ledger.epoch()
    except (LedgerUnavailable, TimeoutError) as error:
        ready, epoch = f"unavailable: {error or 'no answer'}", None
    sync = state.sync
    elector = state.elector
    server = state.server
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
            "http": None if server is None else {
                "connections_accepted": server.accepted, "connections_open": server.open_connections,
                "requests": server.requests,
            },
            "recent_denials": [d.__dict__ for d in reversed(state.denials)],
            "routed": dict(state.routed),
            "routing_file": None if state.routing_file is None else state.routing_file.status(),
            "quotas": [] if state.quota_report is None else [
                {"namespace": use.quota.namespace, "min": use.quota.min, "max": use.quota.max, "used": use.used,
                 "borrowed": use.borrowed} for use in state.quota_report.quotas
            ],
        }
    )


def build_app(state: WebhookState, *, body_timeout_seconds: float = IDLE_TIMEOUT_SECONDS) -> web.Application:
    """The routes: the review paths (`review_endpoint`), the probes (open), /metrics and /status
    (``state.access``)."""
    guards = [unread_bodies_dropped()] if state.authenticate else []
    if state.access is not None:
        guards.append(middleware(state.access))
    app = web.Application(middlewares=guards, client_max_size=state.settings.max_body_bytes)

    def reviews(handler: ReviewHandler) -> Handler:
        return review_endpoint(state, handler, body_timeout_seconds=body_timeout_seconds)

    binding = reviews(validate_binding)
    for lane in range(admission.SERVED_LANES):
        app.router.add_post(admission.lane_path(lane), binding)
    app.router.add_post("/validate-system", reviews(validate_system))
    app.router.add_post("/validate-claim", reviews(validate_claim))
    app.router.add_post("/mutate-pod", reviews(mutate_pod))

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def ready(_request: web.Request) -> web.Response:
        return await readyz(state)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(state.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def state_status(_request: web.Request) -> web.Response:
        return await status(state)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", state_status)
    return app


def build_server(state: WebhookState, *, idle_timeout_seconds: float = IDLE_TIMEOUT_SECONDS) -> WebhookServer:
    """The webhook's server for ``state`` (which then shows its counts in /status); `WebhookServer.start` serves
    it."""
    settings = state.settings
    limits = ConnectionLimits(clients=settings.max_connections, anonymous=settings.max_anonymous_connections)
    server = WebhookServer(build_app(state, body_timeout_seconds=idle_timeout_seconds),
                           idle_timeout_seconds=idle_timeout_seconds, limits=limits, authenticate=state.authenticate)
    state.server = server
    return server
