"""The guarantee, round 2 (issue 33), on the real plane: a pod that grows between admission and binding, and a
binding answered with an error that does not prove it failed.

Item 1: the issue's sequence. A gated pod asking 100m is bound to a node (the webhook admits, the apiserver refuses
for the gate, the admitted room stays held while the write may still happen); the node fills up; the pod, still not
bound, is resized to 64 cpu; the gate goes and the pod is bound again. Before, the resize of a pod without a node
was never judged and the second binding was confirmed by the entry whatever the pod asked, so the node ended with
64 cpu more than it has. A binding without a uid, which the apiserver would apply to whichever pod has the name, is
refused.

Item 5: a hoss worker's binding is answered 503 by something between the worker and the apiserver (here a proxy,
as a load balancer that gives up waiting), while the apiserver goes on with it: the webhook admitted it and a
second webhook holds it back until the test lets it go. Before, any error answer counted as "the write is over": the
sync dropped the admitted room at once, another pod took it, and the held binding then committed on a full node.

Every test ends with the independent oversell check (conftest's no_node_oversold).
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from deploy import pki
from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.kube.client import request_json
from hoss.kube.rest import STRATEGIC_MERGE_PATCH
from hoss.ledger.client import Ledger
from hoss.model.objects import Json
from tests.e2e.guard import apiserver_cpu, create, ledger_agrees, one_node, pod_on, refused
from tests.waiting import until

GATE = "hoss.io/test-hold"
MERGE_PATCH = "application/merge-patch+json"












async def binding(cluster: Cluster, namespace: str, pod: Json, node: str) -> None:
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    await request_json(cluster.core.create_namespaced_pod_binding, pod["metadata"]["name"], namespace, body)








# -- item 1: a pod that grows between admission and binding ------------------------------------------------------


async def test_a_pod_resized_between_an_admitted_binding_and_the_next_cannot_grow_past_its_node(
    cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "g1-grow", "4")
    try:
        await ledger_agrees(cluster, ledger, node)
        gated = pod_on("grower", None, "100m")
        gated["spec"]["schedulingGates"] = [{"name": GATE}]
        grower = await create(cluster, namespace, gated)
        uid = grower["metadata"]["uid"]
        # The webhook admits the binding, the apiserver then refuses it for the gate: the room stays held, since
        # nobody can tell yet whether the write happened.
        error = await refused(binding(cluster, namespace, grower, node))
        assert error.status == 409 and "schedulingGates" in str(error), error
        assert [(e.state, e.node) for e in await ledger.entries() if e.uid == uid] == [("admitted", node)]
        await create(cluster, namespace, pod_on("filler", node, "3900m"))
        # The pod is not bound, but its entry holds room on the node: its growth is judged there.
        resize = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "64"}}}]}}
        error = await refused(request_json(cluster.core.patch_namespaced_pod_resize, "grower", namespace, resize,
                                           _content_type=STRATEGIC_MERGE_PATCH))
        assert f"hoss: node {node} has no room for {namespace}/grower: cpu requested 64, free 100m" in str(error)
        await request_json(cluster.core.patch_namespaced_pod, "grower", namespace, {"spec": {"schedulingGates": None}},
                           _content_type=MERGE_PATCH)
        await binding(cluster, namespace, grower, node)
        await ledger_agrees(cluster, ledger, node)
        assert await apiserver_cpu(cluster, node) == 4000
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


async def test_a_resize_of_a_pod_that_holds_no_room_is_let_through_and_counted_when_it_is_bound(
    cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "g1-unplaced", "4")
    try:
        await ledger_agrees(cluster, ledger, node)
        pending = await create(cluster, namespace, pod_on("pending", None, "100m"))
        await create(cluster, namespace, pod_on("filler", node, "3"))
        resize = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "2"}}}]}}
        await request_json(cluster.core.patch_namespaced_pod_resize, "pending", namespace, resize,
                           _content_type=STRATEGIC_MERGE_PATCH)
        error = await refused(binding(cluster, namespace, pending, node))
        assert f"hoss: node {node} has no room for {namespace}/pending: cpu requested 2, free 1" in str(error)
        await ledger_agrees(cluster, ledger, node)
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


async def test_a_binding_without_uid_is_refused(cluster: Cluster, namespace: str, ledger: Ledger) -> None:
    node = await one_node(cluster, "g1-nouid", "2")
    try:
        await ledger_agrees(cluster, ledger, node)
        pending = await create(cluster, namespace, pod_on("anonymous", None, "500m"))
        no_uid = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "anonymous"},
                  "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        error = await refused(request_json(cluster.core.create_namespaced_pod_binding, "anonymous", namespace,
                                           no_uid))
        assert error.status == 400, error
        assert f"hoss: the binding of {namespace}/anonymous to node {node} has no metadata.uid" in str(error)
        assert pending["metadata"]["uid"] not in {e.uid for e in await ledger.entries()}
        await binding(cluster, namespace, pending, node)  # with its uid, it is judged and bound
        await ledger_agrees(cluster, ledger, node)
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


# -- item 5: an error answer that does not prove the binding failed -----------------------------------------------


def serving_tls(plane: LocalPlane, directory: Path, name: str) -> ssl.SSLContext:
    """A TLS server context for 127.0.0.1 with a certificate from the plane's CA (which the apiserver and the
    plane's kubeconfigs trust)."""
    pair = pki.issue(pki.ensure_ca(plane.pki_dir), directory=directory, name=name, common_name=name,
                     ip_addresses=("127.0.0.1",), server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.cert, pair.key)
    return context


async def serve(app: web.Application, context: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    """`app` served over TLS on a free port of 127.0.0.1: its runner (to clean up) and the port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    return runner, int(runner.addresses[0][1])


@dataclass
class HoldingWebhook:
    """A validating webhook that holds the first binding of pod `pod` until `release` is set (then allows it) and
    allows every other review at once: the apiserver goes on with that binding only then. `probed` is set by a
    dry-run binding, the sign that the apiserver calls the webhook."""

    pod: str
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    probed: asyncio.Event = field(default_factory=asyncio.Event)

    async def review(self, request: web.Request) -> web.Response:
        review = (await request.json())["request"]
        if review.get("dryRun"):
            self.probed.set()
        elif review.get("name") == self.pod and not self.arrived.is_set():
            self.arrived.set()
            await self.release.wait()
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": review["uid"], "allowed": True}})


@dataclass
class AnsweringProxy:
    """Between a hoss worker and the apiserver: forwards every request with the worker's client certificate. The
    worker's first binding of pod `pod` goes on to the apiserver too, but once `answer_now` returns the proxy answers
    the worker 503, as a load balancer that stops waiting does, and leaves the request running; a later one (the
    worker trying again) is answered 503 at once and goes no further, so it neither takes the room nor frees it."""

    apiserver: str
    upstream_tls: ssl.SSLContext
    pod: str
    answer_now: Callable[[], Awaitable[None]]
    session: aiohttp.ClientSession | None = None
    running: set[asyncio.Task[None]] = field(default_factory=set)
    outcomes: list[str] = field(default_factory=list)
    """What the apiserver answered the binding the worker was told 503 about."""

    def _upstream(self, request: web.Request, body: bytes) -> Any:
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.upstream_tls))
        headers = {key: value for key, value in request.headers.items()
                   if key.lower() in ("accept", "content-type", "user-agent")}
        return self.session.request(request.method, f"{self.apiserver}{request.path_qs}", data=body,
                                    headers=headers)

    async def forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.method == "POST" and request.path.endswith(f"/pods/{self.pod}/binding"):
            if not self.running:
                self.running.add(asyncio.create_task(self._discard(self._upstream(request, body))))
                await self.answer_now()
            return web.json_response(
                {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "ServiceUnavailable",
                 "message": "upstream gave up waiting", "code": 503}, status=503)
        async with self._upstream(request, body) as answer:
            return web.Response(status=answer.status, body=await answer.read(),
                                content_type=answer.content_type or "application/json")

    async def _discard(self, call: Any) -> None:
        async with call as answer:
            self.outcomes.append(f"{answer.status}: {(await answer.read())[:300]!r}")

    async def close(self) -> None:
        if self.running:
            await asyncio.wait(self.running, timeout=60)
        if self.session is not None:
            await self.session.close()


def as_worker(plane: LocalPlane) -> ssl.SSLContext:
    """The TLS context that reaches the apiserver as the hoss-worker (its kubeconfig's CA and client certificate)."""
    config = json.loads(plane.kubeconfig("hoss-worker").read_text())
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=config["clusters"][0]["cluster"]["certificate-authority"])
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    return context


def worker_kubeconfig(plane: LocalPlane, directory: Path, port: int) -> Path:
    """The hoss-worker's kubeconfig pointed at the proxy on `port`."""
    config = json.loads(plane.kubeconfig("hoss-worker").read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = directory / "worker-via-proxy.json"
    path.write_text(json.dumps(config))
    return path


def holding_configuration(name: str, namespace: str, port: int, ca: Path) -> Json:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.test.hoss.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 30,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods/binding"], "scope": "*"}],
            "clientConfig": {"url": f"https://127.0.0.1:{port}/hold",
                             "caBundle": base64.b64encode(ca.read_bytes()).decode()},
        }],
    }


@asynccontextmanager
async def holding(plane: LocalPlane, cluster: Cluster, namespace: str, *, pod: str, node: str,
                  directory: Path) -> AsyncIterator[HoldingWebhook]:
    """A `HoldingWebhook` for the first binding of `pod` in `namespace`, registered, and called by the apiserver
    (a dry-run binding of a probe pod to `node` reached it) before the block starts; released and removed after."""
    holder = HoldingWebhook(pod=pod)
    app = web.Application()
    app.router.add_post("/hold", holder.review)
    runner, port = await serve(app, serving_tls(plane, directory, "holder"))
    hooks: Any = client.AdmissionregistrationV1Api(cluster.api)
    name = f"hold-{namespace}"[:63]
    try:
        await hooks.create_validating_webhook_configuration(
            holding_configuration(name, namespace, port, plane.pki_dir / "ca.crt"))
        probe = await create(cluster, namespace, pod_on("probe", None, "100m"))
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "probe", "uid": probe["metadata"]["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}

        async def called() -> tuple[bool, str]:
            await request_json(cluster.core.create_namespaced_pod_binding, "probe", namespace, body, dry_run="All")
            return holder.probed.is_set(), "the holding webhook not called yet"

        await until(called, timeout=30, what="the apiserver to call the holding webhook")
        yield holder
    finally:
        holder.release.set()
        try:
            await hooks.delete_validating_webhook_configuration(name)
        except ApiException as error:
            if error.status != 404:
                raise
        await runner.cleanup()


async def test_a_binding_answered_503_keeps_its_room_until_the_write_is_surely_over(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger, dispatcher: Process, tmp_path: Path
) -> None:
    label = {"hoss.io/test-node": namespace[:63]}
    node = await one_node(cluster, "g5-answered", "2", labels=label)
    pod = pod_on("held", None, "1500m", scheduler="hoss")
    pod["spec"]["nodeSelector"] = label
    raw = aioredis.Redis.from_url(plane.state().redis_url, decode_responses=True)
    uid: list[str] = []
    arrived = asyncio.Event()

    async def admitted() -> None:
        """The proxy answers once the binding is under way past the webhooks: hoss's admitted it, ours holds it."""
        await arrived.wait()

        async def entry_admitted() -> tuple[bool, str]:
            states = [e.state for e in await ledger.entries() if e.uid in uid]
            return states == ["admitted"], f"entry {states}"

        await until(entry_admitted, timeout=20, what="the webhook to admit the held binding")

    proxy_app = web.Application(client_max_size=1 << 22)
    proxy = AnsweringProxy(apiserver=f"https://127.0.0.1:{plane.state().apiserver_port}",
                           upstream_tls=as_worker(plane), pod="held", answer_now=admitted)
    proxy_app.router.add_route("*", "/{tail:.*}", proxy.forward)
    proxy_runner, proxy_port = await serve(proxy_app, serving_tls(plane, tmp_path, "proxy"))
    kubeconfig = worker_kubeconfig(plane, tmp_path, proxy_port)
    worker: Process | None = None
    try:
        await ledger_agrees(cluster, ledger, node)
        async with holding(plane, cluster, namespace, pod="held", node=node, directory=tmp_path) as holder:
            arrived = holder.arrived
            # The worker tries the pod again only when room frees, or long after the test: a retry finds the
            # admitted entry and leaves the pod alone (any write to the pod would fail the held binding's
            # resourceVersion).
            worker = await asyncio.to_thread(plane.start_worker, "g5-answered", extra_args=[
                f"--kubeconfig={kubeconfig}", "--backoff-initial-seconds=600", "--backoff-max-seconds=600"])
            uid.append((await create(cluster, namespace, pod))["metadata"]["uid"])

            async def told() -> tuple[bool, str]:
                events = await cluster.events_for(namespace, "held")
                messages = [str(e.message) for e in events if e.reason == "FailedScheduling"]
                return any("503" in m for m in messages), f"events {messages}"

            # The worker saw the 503 and dealt with its reservation before it said so.
            await until(told, timeout=60, what="the worker to say its binding was refused")
            before = await raw.zscore("{hoss}:verify", uid[0])

            async def checked() -> tuple[bool, str]:
                now = await raw.zscore("{hoss}:verify", uid[0])
                return now is None or before is None or now > before, f"next check at {now} (was {before})"

            # The sync looks at the admitted entry: it may drop it only on proof that the write failed, and a 503
            # is none. The room stays held, for the binding still under way.
            await until(checked, timeout=30, what="the sync to check the admitted entry")
            assert [(e.state, e.node) for e in await ledger.entries() if e.uid == uid[0]] == [("admitted", node)]
            error = await refused(create(cluster, namespace, pod_on("filler", node, "1")))
            assert "has no room" in str(error), error
            holder.release.set()

            async def bound() -> tuple[bool, str]:
                held = await request_json(cluster.core.read_namespaced_pod, "held", namespace)
                return held["spec"].get("nodeName") == node, \
                    f"nodeName {held['spec'].get('nodeName')}, answers {proxy.outcomes}"

            await until(bound, timeout=60, what="the held binding to commit")
        await ledger_agrees(cluster, ledger, node)
        assert await apiserver_cpu(cluster, node) == 1500
    finally:
        if worker is not None:
            await asyncio.to_thread(plane.stop_process, worker.name)
        await proxy.close()
        await proxy_runner.cleanup()
        await raw.aclose()
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


async def test_a_hoss_pod_that_changes_while_its_binding_is_under_way_is_bound_as_it_is_now(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger, dispatcher: Process, tmp_path: Path
) -> None:
    """A worker's Binding names the version of the pod its work item carries. The pod changes while the binding is
    held back in admission: the apiserver refuses it (the version is gone), and the dispatcher sends the pod as it
    is now, which binds."""
    label = {"hoss.io/test-node": namespace[:63]}
    node = await one_node(cluster, "g1-changing", "2", labels=label)
    pod = pod_on("changing", None, "500m", scheduler="hoss")
    pod["spec"]["nodeSelector"] = label
    worker: Process | None = None
    try:
        await ledger_agrees(cluster, ledger, node)
        async with holding(plane, cluster, namespace, pod="changing", node=node, directory=tmp_path) as holder:
            worker = await asyncio.to_thread(plane.start_worker, "g1-changing")
            await create(cluster, namespace, pod)
            await asyncio.wait_for(holder.arrived.wait(), timeout=60)
            await request_json(cluster.core.patch_namespaced_pod, "changing", namespace,
                               {"metadata": {"labels": {"changed": "while-binding"}}}, _content_type=MERGE_PATCH)
            holder.release.set()

            async def bound() -> tuple[bool, str]:
                now = await request_json(cluster.core.read_namespaced_pod, "changing", namespace)
                return now["spec"].get("nodeName") == node, f"nodeName {now['spec'].get('nodeName')}"

            await until(bound, timeout=60, what="the pod's new version to be bound")
        assert await worker_count(worker, "stale") >= 1, "the held binding, of the old version, was refused"
        await ledger_agrees(cluster, ledger, node)
    finally:
        if worker is not None:
            await asyncio.to_thread(plane.stop_process, worker.name)
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


async def worker_count(worker: Process, outcome: str) -> float:
    """The worker's ``hoss_worker_pods_total{outcome}`` (its /metrics)."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{worker.port}/metrics") as answer:
        text = await answer.text()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "hoss_worker_pods_total" and sample.labels.get("outcome") == outcome)
