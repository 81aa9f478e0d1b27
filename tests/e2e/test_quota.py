"""Elastic quota end to end on the real plane: two hoss workers, scheduler-plugins ElasticQuotas, kube-scheduler.

- The A/B example: on 10 GPUs (5 kwok nodes of 2), tenant A has min 4 / max 6, tenant B min 6 / max 8. A runs 6
  (borrowing 2 of B's idle guarantee) and its 7th pod is refused by its max; then B asks for 6: 4 fit, and B's
  other 2 reclaim A's 2 borrowed pods through the Eviction API, so that in the end A keeps 4 and B runs 6, and
  each ElasticQuota's status.used says so.
- A kube-scheduler binding that would take a tenant past its max is denied by the resolver webhook.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import hoss_pods, started_workers
from tests.waiting import until

GPU = "nvidia.com/gpu"
GPU_NODE = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "2"}
GROUP, VERSION, PLURAL = "scheduling.x-k8s.io", "v1alpha1", "elasticquotas"


@pytest.fixture(scope="module")
def quota_workers(plane: LocalPlane, dispatcher: Process) -> Iterator[list[Process]]:
    yield from started_workers(plane, "quota", 2)


@pytest.fixture
async def tenant_b(cluster: Cluster, plane: LocalPlane, namespace: str) -> AsyncIterator[str]:
    name = f"{namespace[:50]}-b"
    await cluster.ensure_namespace(name)
    yield name
    await cluster.delete_pods(name)
    plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


async def elastic_quota(cluster: Cluster, namespace: str, min_: dict[str, str], max_: dict[str, str]) -> None:
    custom: Any = client.CustomObjectsApi(cluster.api)
    await custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticQuota",
         "metadata": {"name": "quota", "namespace": namespace}, "spec": {"min": min_, "max": max_}})


async def used_status(cluster: Cluster, namespace: str) -> dict[str, str]:
    custom: Any = client.CustomObjectsApi(cluster.api)
    quota = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "quota")
    return dict((quota.get("status") or {}).get("used") or {})


async def bound(cluster: Cluster, namespace: str) -> list[Json]:
    pods = await cluster.raw_list("list_namespaced_pod", namespace)
    return [p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]


async def messages(cluster: Cluster, namespace: str, pod: str) -> list[str]:
    return [e.message or "" for e in await cluster.events_for(namespace, pod)]


def gpu_pods(prefix: str, count: int) -> list[Json]:
    return hoss_pods(prefix, count, cpu="100m", extra={GPU: "1"})


async def test_the_a_b_example_borrow_then_reclaim(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, tenant_b: str,
    quota_workers: list[Process],
) -> None:
    tenant_a = namespace
    nodes = await cluster.create_nodes(5, prefix=f"{namespace[:40]}-g", capacity=GPU_NODE)
    try:
        await cluster.wait_nodes_ready(nodes)
        await elastic_quota(cluster, tenant_a, {GPU: "4"}, {GPU: "6"})
        await elastic_quota(cluster, tenant_b, {GPU: "6"}, {GPU: "8"})

        async def quotas_synced() -> tuple[bool, str]:
            return (await used_status(cluster, tenant_a) == {GPU: "0"}
                    and await used_status(cluster, tenant_b) == {GPU: "0"}), "status.used of both quotas"

        await until(quotas_synced, timeout=60, what="the resolver to pick up both ElasticQuotas")

        # A runs 6 of its 7 pods: it borrows 2 of B's idle guarantee, and its max stops the 7th.
        await cluster.create_pods(gpu_pods("a", 6), namespace=tenant_a)

        async def a_runs_six() -> tuple[bool, str]:
            count = len(await bound(cluster, tenant_a))
            return count == 6, f"{count}/6 of A bound"

        await until(a_runs_six, timeout=120, what="A's 6 pods to be bound")
        await cluster.create_pods(gpu_pods("a-extra", 1), namespace=tenant_a)

        async def seventh_refused() -> tuple[bool, str]:
            found = await messages(cluster, tenant_a, "a-extra-0000")
            return any(f"quota {tenant_a}: {GPU} 6 used + 1 requested > max 6" in m for m in found), str(found)

        await until(seventh_refused, timeout=60, what="A's 7th pod to be refused by A's max")

        # B asks for 6: 4 fit in what is free, 2 reclaim A's borrowed pods.
        await cluster.create_pods(gpu_pods("b", 6), namespace=tenant_b)

        async def final_counts() -> tuple[bool, str]:
            a, b = await bound(cluster, tenant_a), await bound(cluster, tenant_b)
            names = sorted(p["metadata"]["name"] for p in a + b)
            waiting = [f"{p['metadata']['name']}: {(await messages(cluster, ns, p['metadata']['name']))[-1:]}"
                       for ns in (tenant_a, tenant_b) for p in await cluster.raw_list("list_namespaced_pod", ns)
                       if not p["spec"].get("nodeName")]
            return (len(a), len(b)) == (4, 6), f"A {len(a)} bound, B {len(b)} bound: {names}; waiting: {waiting}"

        await until(final_counts, timeout=180, what="B to get its 6 by reclaiming A's 2 borrowed pods")
        # A's borrowed pods were evicted (which ones depends on the race with A's 7th pod, which may borrow a
        # freed GPU for a moment and then be reclaimed itself); whatever of A is left unbound waits on the quota.
        left_a = await cluster.raw_list("list_namespaced_pod", tenant_a)
        assert len(left_a) <= 5, [p["metadata"]["name"] for p in left_a]
        for pod in left_a:
            if not pod["spec"].get("nodeName"):
                said = await messages(cluster, tenant_a, pod["metadata"]["name"])
                assert any(f"quota {tenant_a}" in m for m in said), said
        reclaimed = [m for p in ("b-0000", "b-0001", "b-0002", "b-0003", "b-0004", "b-0005")
                     for m in await messages(cluster, tenant_b, p) if "reclaim: in progress" in m]
        assert reclaimed, "a B pod must say it reclaims"
        preempted = [e for p in [*(f"a-{i:04d}" for i in range(6)), "a-extra-0000"]
                     for e in await cluster.events_for(tenant_a, p) if e.reason == "Preempted"]
        assert len(preempted) >= 2, [e.message for e in preempted]

        async def status_written() -> tuple[bool, str]:
            a, b = await used_status(cluster, tenant_a), await used_status(cluster, tenant_b)
            return (a.get(GPU), b.get(GPU)) == ("4", "6"), f"A {a}, B {b}"

        await until(status_written, timeout=30, what="status.used to show A 4 and B 6")

        # The dispatcher's /status (the dashboard's source) shows use and borrowing per tenant.
        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{dispatcher.port}/status") as response:
            quotas = {q["namespace"]: q for q in (await response.json())["quotas"]}
        assert quotas[tenant_a]["used"][GPU] == 4 and quotas[tenant_a]["borrowed"] == {}
        assert quotas[tenant_b]["used"][GPU] == 6 and quotas[tenant_b]["min"] == {GPU: 6}
    finally:
        await cluster.delete_pods(tenant_a)
        await cluster.delete_pods(tenant_b)
        await cluster.delete_nodes(nodes)


async def test_a_kube_scheduler_binding_past_a_max_is_denied(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    nodes = await cluster.create_nodes(1, prefix=f"{namespace[:40]}-g", capacity=GPU_NODE)
    try:
        await cluster.wait_nodes_ready(nodes)
        await elastic_quota(cluster, namespace, {GPU: "1"}, {GPU: "1"})

        async def synced() -> tuple[bool, str]:
            used = await used_status(cluster, namespace)
            return used == {GPU: "0"}, str(used)

        await until(synced, timeout=60, what="the resolver to pick up the ElasticQuota")
        foreign = []
        for i in range(2):
            pod = pod_manifest(f"ks-{i}", requests={"cpu": "100m", GPU: "1"})  # default-scheduler
            pod["spec"]["containers"][0]["resources"]["limits"] = {GPU: "1"}
            foreign.append(pod)
        await cluster.create_pods(foreign[:1], namespace=namespace)

        async def first_bound() -> tuple[bool, str]:
            count = len(await bound(cluster, namespace))
            return count == 1, f"{count}/1 bound"

        await until(first_bound, timeout=60, what="kube-scheduler to bind the first pod")
        # The node has a GPU left, so kube-scheduler binds the second; the resolver denies it by the quota.
        await cluster.create_pods(foreign[1:], namespace=namespace)

        async def denied() -> tuple[bool, str]:
            found = await messages(cluster, namespace, "ks-1")
            return any(f"quota {namespace}: {GPU} 1 used + 1 requested > max 1" in m for m in found), str(found)

        await until(denied, timeout=60, what="the resolver to deny kube-scheduler's binding by the quota")
        assert len(await bound(cluster, namespace)) == 1
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)


async def test_a_burst_from_racing_workers_and_kube_scheduler_never_exceeds_the_max(
    plane: LocalPlane, cluster: Cluster, namespace: str, quota_workers: list[Process]
) -> None:
    """12 one-GPU pods for hoss (two workers) and 4 for kube-scheduler, created at once on 10 free GPUs, in a
    namespace whose max is 5: exactly 5 are bound, whoever binds them; the others say the quota stops them."""
    nodes = await cluster.create_nodes(5, prefix=f"{namespace[:40]}-g", capacity=GPU_NODE)
    try:
        await cluster.wait_nodes_ready(nodes)
        await elastic_quota(cluster, namespace, {GPU: "10"}, {GPU: "5"})

        async def synced() -> tuple[bool, str]:
            used = await used_status(cluster, namespace)
            return used == {GPU: "0"}, str(used)

        await until(synced, timeout=60, what="the resolver to pick up the ElasticQuota")
        foreign = []
        for i in range(4):
            pod = pod_manifest(f"ks-{i}", requests={"cpu": "100m", GPU: "1"})
            pod["spec"]["containers"][0]["resources"]["limits"] = {GPU: "1"}
            foreign.append(pod)
        await cluster.create_pods([*gpu_pods("burst", 12), *foreign], namespace=namespace)

        async def settled() -> tuple[bool, str]:
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            placed = [p for p in pods if p["spec"].get("nodeName")]
            told = 0
            for p in pods:
                if not p["spec"].get("nodeName"):
                    said = await messages(cluster, namespace, p["metadata"]["name"])
                    told += any(f"quota {namespace}" in m for m in said)
            return len(placed) >= 5 and len(placed) + told == 16, f"{len(placed)} bound, {told} told by the quota"

        await until(settled, timeout=120, what="5 pods bound and the other 11 refused by the quota")
        assert len(await bound(cluster, namespace)) == 5
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)
