"""The conflict resolver on the real plane: racing schedulers oversell nodes without it, and never with it."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from deploy import pki
from dev.local.cluster import Cluster, oversold_nodes, pod_manifest
from dev.local.health import http_ok
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.ledger.client import Ledger
from tests.waiting import until

NODES = 4
NODE_CAPACITY = {"cpu": "4", "memory": "16Gi", "pods": "110"}
PODS_PER_SCHEDULER = 12  # 2 x 12 one-cpu pods against 4 x 4 cpu: demand 24, room 16
SCHEDULERS = ("race-a", "race-b")


@asynccontextmanager
async def racing_schedulers(plane: LocalPlane) -> AsyncIterator[list[Process]]:
    """Two real kube-schedulers under different names, ready: each has listed the cluster and watches it."""
    processes = [plane.start_scheduler(scheduler_name=name) for name in SCHEDULERS]
    try:
        async def ready() -> tuple[bool, str]:
            answers = [await asyncio.to_thread(http_ok, f"https://127.0.0.1:{p.port}/readyz", verify=False)
                       for p in processes]
            return all(answers), f"ready: {answers}"

        # kube-scheduler's /readyz holds until its informers' handlers have synced (sched-handler-sync).
        await until(ready, timeout=60, what="both schedulers to be ready")
        yield processes
    finally:
        for process in processes:
            plane.stop_process(process.name)


async def pending_queues(plane: LocalPlane, scheduler: Process) -> dict[str, float]:
    """A kube-scheduler's pods pending per queue (active, backoff, unschedulable, gated), from its /metrics."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its serving certificate is its own, self-signed
    context.load_cert_chain(plane.pki_dir / "client-admin.crt", plane.pki_dir / "client-admin.key")
    async with aiohttp.ClientSession() as session, session.get(
        f"https://127.0.0.1:{scheduler.port}/metrics", ssl=context
    ) as response:
        text = await response.text()
    return {sample.labels["queue"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "scheduler_pending_pods"}


async def resolver_status(plane: LocalPlane) -> dict[str, Any]:
    resolver = plane.running("hoss-resolver")
    assert resolver is not None
    context = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    async with aiohttp.ClientSession() as session, session.get(
        f"https://127.0.0.1:{resolver.port}/status", ssl=context
    ) as response:
        status: dict[str, Any] = await response.json()
        return status


async def foreign_pending_indexed(plane: LocalPlane, at_least: int) -> tuple[bool, str]:
    indexed = int(((await resolver_status(plane))["sync"] or {}).get("foreign_pending_pods", 0))
    return indexed >= at_least, f"{indexed} foreign pending pods indexed"


async def race(plane: LocalPlane, cluster: Cluster, namespace: str, prefix: str) -> list[str]:
    """Both schedulers get their pods at the same instant and place them from the same view of the cluster.

    The schedulers are paused (SIGSTOP) while the pods are created, then resumed together: each sees the nodes
    empty and places all of its pods, which is exactly the case where independent schedulers oversell.
    """
    nodes = await cluster.create_nodes(NODES, prefix=prefix, capacity=NODE_CAPACITY)
    await cluster.wait_nodes_ready(nodes)
    async with racing_schedulers(plane) as schedulers:
        for scheduler in schedulers:
            os.kill(scheduler.pid, signal.SIGSTOP)
        try:
            await cluster.create_pods(
                (
                    pod_manifest(f"{scheduler}-{i:02d}", requests={"cpu": "1", "memory": "1Gi"},
                                 scheduler_name=scheduler)
                    for i in range(PODS_PER_SCHEDULER)
                    for scheduler in SCHEDULERS
                ),
                namespace=namespace,
            )
            # The syncing resolver indexes the pending pods of foreign schedulers: it judges their bindings
            # without reading the pods from the apiserver (checked in the audit log by the caller).
            await until(functools.partial(foreign_pending_indexed, plane, 2 * PODS_PER_SCHEDULER), timeout=30,
                        what="the resolver to index the pending pods")
        finally:
            for scheduler in schedulers:
                os.kill(scheduler.pid, signal.SIGCONT)

        async def settled() -> tuple[bool, str]:
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            bound = sum(1 for p in pods if p["spec"].get("nodeName"))
            return bound >= 16, f"{bound} bound"

        await until(settled, timeout=60, what="the schedulers to fill the nodes")

        async def given_up() -> tuple[bool, str]:
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            seen, done = [], True
            for name, scheduler in zip(SCHEDULERS, schedulers, strict=True):
                unbound = sum(1 for p in pods
                              if p["spec"].get("schedulerName") == name and not p["spec"].get("nodeName"))
                queues = await pending_queues(plane, scheduler)
                done = done and (queues.get("active"), queues.get("backoff"), queues.get("unschedulable")) == (
                    0, 0, unbound)
                seen.append(f"{name}: {unbound} unbound, queues {queues}")
            return done, "; ".join(seen)

        # A losing scheduler retries its pods whose binding was refused; once each has tried every pod left and
        # found no room (all of them in its unschedulable queue, none active or backing off), nothing more may fit.
        await until(given_up, timeout=120, what="both schedulers to have tried every pod left and found no room")
    return nodes


@pytest.mark.oversells
async def test_racing_kube_schedulers_oversell_nodes_without_the_resolver(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    plane.unregister_webhook()
    nodes: list[str] = []
    try:
        # A race is timing: the two schedulers may happen to interleave without overlapping. Up to three races,
        # each on fresh nodes; one must oversell.
        for attempt in range(3):
            if nodes:
                await cluster.delete_pods(namespace)
                await cluster.delete_nodes(nodes)
            nodes = await race(plane, cluster, namespace, f"nores{attempt}")
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            oversold = oversold_nodes(await cluster.raw_list("list_node"), pods)
            print(f"without the resolver, race {attempt + 1}: oversold nodes: {oversold}")
            if oversold:
                break
        assert oversold, "two independent schedulers racing for the same room should oversell a node"
    finally:
        plane.register_webhook()
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)


async def test_with_the_resolver_no_node_is_oversold_and_losers_are_told_why(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    reads_before = (await resolver_status(plane))["pod_reads"]
    nodes = await race(plane, cluster, namespace, "withres")
    try:
        pods = await cluster.raw_list("list_namespaced_pod", namespace)
        assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}
        bound = [p for p in pods if p["spec"].get("nodeName")]
        assert len(bound) == 16, "the nodes are exactly full: every cpu is used, none twice"
        losers = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        assert len(losers) == 2 * PODS_PER_SCHEDULER - 16
        denied_messages = []
        for name in losers:
            for event in await cluster.events_for(namespace, name):
                if "hoss: node" in (event.message or ""):
                    denied_messages.append(event.message)
        assert denied_messages, "some losing pod must carry the resolver's denial in its events"
        assert any("cpu requested 1, free 0" in m for m in denied_messages), denied_messages[:3]
        # Every binding was judged from the resolver's index of foreign pending pods: no pod was read back.
        assert (await resolver_status(plane))["pod_reads"] == reads_before
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)


async def test_resolver_rebuilds_the_ledger_from_the_apiserver_after_redis_loses_its_data(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    nodes = await cluster.create_nodes(2, prefix="rebuild", capacity=NODE_CAPACITY)
    try:
        await cluster.wait_nodes_ready(nodes)
        await cluster.create_pods(
            [pod_manifest(f"keep-{i}", requests={"cpu": "1500m", "memory": "1Gi"}) for i in range(3)],
            namespace=namespace,
        )

        async def all_bound() -> tuple[bool, str]:
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            bound = sum(1 for p in pods if p["spec"].get("nodeName"))
            return bound == 3, f"{bound}/3 bound"

        await until(all_bound, timeout=60, what="3 pods to be bound")
        redis = aioredis.Redis.from_url(plane.state().redis_url, decode_responses=True)
        ledger = Ledger(redis)
        try:
            epoch_before = await ledger.epoch()
            await redis.flushall()
            assert not await ledger.is_ready()

            expected: dict[str, int] = {}
            for pod in await cluster.raw_list("list_namespaced_pod", namespace):
                expected[pod["spec"]["nodeName"]] = expected.get(pod["spec"]["nodeName"], 0) + 1500

            # Every client of the resolver whose write fence finds its writes lost marks the ledger not ready again,
            # so it may be rebuilt more than once: wait for a ready ledger that holds what the apiserver has.
            async def rebuilt() -> tuple[bool, str]:
                usage = await ledger.node_usage(nodes)
                held = {n: usage[n][1].get("cpu", 0) for n in nodes if n in usage and usage[n][1].get("cpu", 0)}
                ready = await ledger.is_ready()
                return ready and held == expected, f"ready {ready}, epoch {await ledger.epoch()}, held {held}"

            await until(rebuilt, timeout=30, what="the resolver to rebuild the ledger as the apiserver has it")
            assert await ledger.epoch() != epoch_before
        finally:
            await redis.aclose()
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)


def forged_review(namespace: str) -> bytes:
    """A binding review as the apiserver would send it, posted by someone else."""
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "forged-1",
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding", "name": "victim", "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:hoss-system:hoss-worker"},
            "object": {"apiVersion": "v1", "kind": "Binding",
                       "metadata": {"name": "victim", "namespace": namespace, "uid": "u-victim"},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": "anywhere"}},
        },
    }).encode()


async def test_only_the_apiserver_may_post_reviews_and_its_own_are_judged(
    plane: LocalPlane, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    resolver = plane.running("hoss-resolver")
    assert resolver is not None
    url = f"https://127.0.0.1:{resolver.port}/validate-binding"
    trust = str(plane.pki_dir / "ca.crt")

    async def post(cert: pki.KeyPair | None) -> tuple[int, str]:
        context = ssl.create_default_context(cafile=trust)
        if cert is not None:
            context.load_cert_chain(cert.cert, cert.key)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session, session.post(
            url, data=forged_review(namespace), headers={"Content-Type": "application/json"}
        ) as response:
            return response.status, await response.text()

    # Nobody's certificate: 401, nothing judged.
    status, text = await post(None)
    assert status == 401, text
    # A hoss component's own certificate (from the cluster CA): the handshake itself fails.
    with pytest.raises(aiohttp.ClientError):
        await post(pki.KeyPair(plane.pki_dir / "client-hoss-worker.crt", plane.pki_dir / "client-hoss-worker.key"))
    # A certificate from the webhook client CA under another name than the apiserver's: 403.
    other = pki.issue(pki.KeyPair(plane.webhook_client_ca, plane.webhook_client_dir / "ca.key"),
                      directory=tmp_path, name="impostor", common_name="impostor")
    status, text = await post(other)
    assert status == 403, text

    # The apiserver's own reviews are still judged: a pod is bound through the webhook.
    nodes = await cluster.create_nodes(1, prefix="authn", capacity=NODE_CAPACITY)
    try:
        await cluster.wait_nodes_ready(nodes)
        await cluster.create_pods([pod_manifest("judged", requests={"cpu": "1"})], namespace=namespace)

        async def bound() -> tuple[bool, str]:
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            return bool(pods and pods[0]["spec"].get("nodeName")), f"{len(pods)} pods"

        await until(bound, timeout=60, what="the pod to be bound through the webhook")
        async with aiohttp.ClientSession() as session, session.get(
            f"https://127.0.0.1:{resolver.port}/metrics", ssl=ssl.create_default_context(cafile=trust)
        ) as response:
            metrics = await response.text()
        assert 'hoss_resolver_refused_reviews_total{code="401"}' in metrics
        assert 'hoss_resolver_refused_reviews_total{code="403"}' in metrics
        assert 'hoss_resolver_verdicts_total{allowed="true",reason="fits"}' in metrics
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)
