"""The conflict resolver: a validating admission webhook that judges every pod binding against the ledger.

``POST /validate-binding`` takes an AdmissionReview v1 for ``pods/binding`` or ``bindings``. The hot path is one
Redis call (``Ledger.confirm``) and no apiserver call: the pod's request comes from the sync's pod index. A
binding is allowed when the pod's reservation is for that node, or (a foreign scheduler's binding) when the pod
still fits, in which case the same call records it. Otherwise it is denied with HTTP 200, ``allowed: false``,
status code 409 and a message naming node, resource, requested and free. A ledger that is unreachable or not
ready denies (fail closed): nothing is oversold, scheduling pauses and resumes by itself.

Also serves /healthz, /readyz (ready once the ledger is synced), /metrics (Prometheus) and /status (JSON).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from redis.asyncio import Redis
from redis.exceptions import RedisError

from resolver import admission
from resolver.errors import LedgerUnavailable, ResolverError
from resolver.kube import KubeError, api_client, request_json
from resolver.ledger import Confirmed, Conflict, HeldElsewhere, Ledger, LedgerNotReady, UnknownNode
from resolver.resources import format_quantity
from resolver.settings import ResolverSettings, SettingsError, load_settings
from resolver.sync import LedgerSync, PodIndex, PodInfo, parse_pod

log = logging.getLogger(__name__)

ConfirmResult = Confirmed | Conflict | UnknownNode | LedgerNotReady | HeldElsewhere


def verdict_for(result: ConfirmResult, *, binding: admission.BindingRequest) -> admission.Verdict:
    """Turn the ledger's answer into the webhook's verdict. Pure."""
    who = f"pod {binding.pod_key} on node {binding.node}"
    match result:
        case Confirmed(foreign=False):
            return admission.Verdict(allowed=True, reason="reserved")
        case Confirmed(foreign=True):
            return admission.Verdict(allowed=True, reason="fits")
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
    raise AssertionError(f"unhandled ledger result {result!r}")


@dataclass
class Denial:
    at: float
    pod: str
    node: str
    username: str
    reason: str
    message: str


@dataclass
class WebhookState:
    """Everything the handlers share: settings, ledger, sync, metrics and recent denials."""

    settings: ResolverSettings
    ledger: Ledger
    pods: PodIndex
    sync: LedgerSync | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    denials: collections.deque[Denial] = field(default_factory=lambda: collections.deque(maxlen=50))
    verdict_counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def __post_init__(self) -> None:
        self.verdicts = Counter(
            "hoss_resolver_verdicts", "Binding verdicts by outcome and reason",
            ["allowed", "reason"], registry=self.registry,
        )
        self.latency = Histogram(
            "hoss_resolver_review_duration_seconds", "Time to judge one AdmissionReview",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0), registry=self.registry,
        )


STATE_KEY = web.AppKey("state", WebhookState)


async def _pod_info(state: WebhookState, binding: admission.BindingRequest) -> PodInfo | None:
    """The pod from the sync's index; on a miss (a pod newer than the watch), one GET from the apiserver."""
    found = state.pods.find(uid=binding.pod_uid, key=binding.pod_key)
    if found is not None or state.sync is None:
        return found
    try:
        info = parse_pod(await request_json(state.sync.core.read_namespaced_pod, binding.pod, binding.namespace))
    except (KubeError, aiohttp.ClientError, OSError, json.JSONDecodeError) as error:
        log.warning("cannot read pod %s: %s", binding.pod_key, error)
        return None
    if binding.pod_uid and info.uid != binding.pod_uid:
        return None
    return info


async def judge(state: WebhookState, binding: admission.BindingRequest) -> admission.Verdict:
    settings = state.settings
    if settings.enforce == "hoss-only" and binding.username not in settings.hoss_usernames:
        return admission.Verdict(allowed=True, reason="not-enforced")
    try:
        pod = await _pod_info(state, binding)
    except ResolverError as error:
        return admission.Verdict(allowed=False, reason="malformed-pod", code=400, message=f"hoss: {error}")
    if pod is None:
        return admission.Verdict(
            allowed=False, reason="unknown-pod", code=409,
            message=f"hoss: pod {binding.pod_key} is not known to the resolver yet; retry",
        )
    foreign = binding.username not in settings.hoss_usernames
    try:
        result = await state.ledger.confirm(
            uid=pod.uid,
            pod=pod.key,
            node=binding.node,
            request=pod.request,
            owner=f"foreign:{binding.username}" if foreign else binding.username,
            ttl_seconds=settings.foreign_ttl_seconds,
        )
    except LedgerUnavailable as error:
        return admission.Verdict(
            allowed=False, reason="ledger-unavailable", code=503,
            message=f"hoss: the ledger is unreachable ({error}); binding denied, retry later",
        )
    return verdict_for(result, binding=binding)


async def _read_at_most(request: web.Request, limit: int) -> bytes:
    """The body, or its first ``limit`` bytes when it is longer (a stream may arrive in many chunks)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await request.content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def validate_binding(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    started = time.perf_counter()
    body = await _read_at_most(request, state.settings.max_body_bytes + 1)
    if len(body) > state.settings.max_body_bytes:
        return web.json_response(
            {"error": f"AdmissionReview larger than {state.settings.max_body_bytes} bytes"}, status=400
        )
    try:
        parsed = admission.parse_review(body)
    except admission.MalformedReview as error:
        state.verdict_counts["malformed"] += 1
        return web.json_response({"error": f"malformed AdmissionReview: {error}"}, status=400)
    if isinstance(parsed, admission.OtherRequest):
        verdict = admission.Verdict(allowed=True, reason="not-a-binding")
    else:
        verdict = await judge(state, parsed)
        if not verdict.allowed:
            state.denials.append(
                Denial(time.time(), parsed.pod_key, parsed.node, parsed.username, verdict.reason, verdict.message)
            )
            log.info("denied binding of %s to %s by %s: %s", parsed.pod_key, parsed.node, parsed.username,
                     verdict.message)
    state.verdict_counts[verdict.reason] += 1
    state.verdicts.labels(str(verdict.allowed).lower(), verdict.reason).inc()
    state.latency.observe(time.perf_counter() - started)
    return web.json_response(admission.review_response(parsed.review_uid, verdict))


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        ready = (state.sync is None or state.sync.synced.is_set()) and await state.ledger.is_ready()
    except LedgerUnavailable as error:
        return web.Response(status=503, text=f"ledger unavailable: {error}")
    return web.Response(text="ok") if ready else web.Response(status=503, text="ledger not synced")


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def status(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        ready: bool | str = await state.ledger.is_ready()
        epoch = await state.ledger.epoch()
    except LedgerUnavailable as error:
        ready, epoch = f"unavailable: {error}", None
    sync = state.sync
    return web.json_response(
        {
            "ledger": {"ready": ready, "epoch": epoch},
            "sync": None if sync is None else {
                "synced": sync.synced.is_set(), "nodes": len(sync.nodes), "pods": len(sync.pods.by_uid),
                **sync.stats.__dict__,
            },
            "enforce": state.settings.enforce,
            "verdicts": dict(state.verdict_counts),
            "recent_denials": [d.__dict__ for d in reversed(state.denials)],
        }
    )


def build_app(state: WebhookState) -> web.Application:
    # The body limit is enforced in the handler (HTTP 400 with the reason); aiohttp's own limit sits above it.
    app = web.Application(client_max_size=state.settings.max_body_bytes * 2)
    app[STATE_KEY] = state
    app.router.add_post("/validate-binding", validate_binding)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)
    return app


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


async def reload_certificates(context: ssl.SSLContext, cert_file: str, key_file: str, interval: float = 5.0) -> None:
    """Load the serving certificate again whenever its files change (new handshakes use the new one)."""

    def stamp() -> tuple[float, float]:
        return os.stat(cert_file).st_mtime, os.stat(key_file).st_mtime

    seen = stamp()
    while True:
        await asyncio.sleep(interval)
        try:
            current = stamp()
            if current != seen:
                context.load_cert_chain(cert_file, key_file)
                seen = current
                log.info("reloaded serving certificate from %s", cert_file)
        except (OSError, ssl.SSLError) as error:
            log.warning("cannot reload serving certificate (keeping the old one): %s", error)


async def publish_stats(state: WebhookState, redis: Redis, *, instance: str, interval: float = 2.0) -> None:
    """Publish verdict counts and recent denials for the dispatcher's /status (one key per resolver replica)."""
    key = f"{{hoss}}:resolver:{instance}"
    while True:
        try:
            pipe = redis.pipeline(transaction=True)
            pipe.hset(key, mapping={
                "verdicts": json.dumps(dict(state.verdict_counts)),
                "recent_denials": json.dumps([d.__dict__ for d in reversed(state.denials)]),
                "updated_unix": f"{time.time():.3f}",
            })
            pipe.expire(key, int(interval * 10))
            await pipe.execute()
        except RedisError as error:
            log.warning("cannot publish resolver stats: %s", error)
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def running_resolver(settings: ResolverSettings) -> AsyncIterator[asyncio.Task[None]]:
    """Start sync, webhook server and timers; stop them on exit."""
    ledger = Ledger.from_url(settings.redis_url)
    api = await api_client(settings.kubeconfig)
    sync = LedgerSync(ledger=ledger, api=api, expire_interval_seconds=settings.expire_interval_seconds)
    state = WebhookState(settings=settings, ledger=ledger, pods=sync.pods, sync=sync)
    context = tls_context(settings.tls_cert_file, settings.tls_key_file)
    runner = web.AppRunner(build_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=context)
    await site.start()
    stats_redis = Redis.from_url(settings.redis_url, decode_responses=True)
    instance = f"{socket.gethostname()}-{os.getpid()}"
    tasks = [
        asyncio.create_task(sync.run(), name="ledger-sync"),
        asyncio.create_task(publish_stats(state, stats_redis, instance=instance), name="publish-stats"),
        asyncio.create_task(
            reload_certificates(context, settings.tls_cert_file, settings.tls_key_file), name="cert-reload"
        ),
    ]
    log.info("hoss-resolver serving https://%s:%d (enforce=%s)", settings.host, settings.port, settings.enforce)
    try:
        yield tasks[0]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.cleanup()
        await stats_redis.aclose()
        await api.close()
        await ledger.close()


async def serve(settings: ResolverSettings) -> None:
    """Serve until stopped. If the ledger sync ever ends, the resolver exits non-zero (fail loudly: a resolver
    that no longer syncs would judge bindings against a stale ledger), to be restarted by its supervisor."""
    async with running_resolver(settings) as sync_task:
        await asyncio.wait([sync_task])
        error = sync_task.exception() if not sync_task.cancelled() else None
        raise SystemExit(f"hoss-resolver: the ledger sync stopped: {error!r}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(
            ResolverSettings, argv, prog="hoss-resolver",
            description="hoss conflict resolver: admission webhook on pod bindings, backed by the Redis ledger",
        )
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
