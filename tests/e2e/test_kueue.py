"""hoss behind Kueue on the real plane: Kueue's controller manager (built from sigs.k8s.io/kueue, dev/local/kueue.py)
queues two tenants' Jobs in one ClusterQueue through their LocalQueues and admits them within its quota; hoss
places the pods of admitted Jobs, on the nodes of the ResourceFlavor Kueue chose (the node selector Kueue injects).
A Job past the quota stays suspended, no pod of it made or placed, until quota frees up."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.kueue import QUEUE_LABEL
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import NODE_CAPACITY, workers
from tests.waiting import until

KUEUE = ("kueue.x-k8s.io", "v1beta2")
_sets = itertools.count()


@pytest.fixture(scope="module")
def kueue(plane: LocalPlane) -> Iterator[Process]:
    process = plane.start_kueue()
    try:
        yield process
    finally:
        plane.stop_process(process.name)


async def create(custom: Any, plural: str, body: Json, namespace: str | None = None) -> None:
    group, version = KUEUE
    body = {"apiVersion": f"{group}/{version}", **body}
    if namespace is None:
        await custom.create_cluster_custom_object(group, version, plural, body)
    else:
        await custom.create_namespaced_custom_object(group, version, namespace, plural, body)


def job(name: str, queue: str, *, pods: int, cpu: str) -> Json:
    """A Job for Kueue: created suspended with its queue's label (as Kueue's webhook would leave it); its pods are
    hoss's."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {"suspend": True, "parallelism": pods, "completions": pods, "backoffLimit": 0,
                 "template": {"spec": {"schedulerName": "hoss", "restartPolicy": "Never", "containers": [{
                     "name": "main", "image": "registry.k8s.io/pause:3.10",
                     "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}},
    }


async def job_pods(cluster: Cluster, namespace: str, name: str) -> list[Json]:
    return [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
            if (p["metadata"].get("labels") or {}).get("job-name") == name]


async def test_kueue_admits_two_tenants_jobs_within_the_quota_and_hoss_places_their_pods(
    plane: LocalPlane, dispatcher: Process, kueue: Process, cluster: Cluster, namespace: str
) -> None:
    tenant_a, tenant_b = namespace, f"{namespace[:50]}-b"
    await cluster.ensure_namespace(tenant_b)
    key = f"kq{next(_sets)}-{namespace}"[:63]
    custom: Any = client.CustomObjectsApi(cluster.api)
    batch: Any = client.BatchV1Api(cluster.api)
    flavor, queue = f"{key}-flavor"[:63], f"{key}-cq"[:63]
    nodes = await cluster.create_nodes(2, prefix=f"kq{next(_sets)}", capacity=NODE_CAPACITY,
                                       labels={"gang-set": key})
    try:
        await cluster.wait_nodes_ready(nodes)
        # The flavor's node labels are what Kueue injects into admitted pods: hoss must honour them.
        await create(custom, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": flavor},
                                                 "spec": {"nodeLabels": {"gang-set": key}}})
        await create(custom, "clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": queue}, "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": flavor, "resources": [
                {"name": "cpu", "nominalQuota": "4"}, {"name": "memory", "nominalQuota": "4Gi"}]}]}]}})
        for tenant in (tenant_a, tenant_b):
            await create(custom, "localqueues", {"kind": "LocalQueue", "metadata": {"name": "team"},
                                                 "spec": {"clusterQueue": queue}}, namespace=tenant)
        async with workers(plane, [("kq-1", ["default"])]):
            await batch.create_namespaced_job(tenant_a, job("first", "team", pods=2, cpu="1"))
            await batch.create_namespaced_job(tenant_b, job("other", "team", pods=2, cpu="1"))

            async def placed(tenant: str, name: str, count: int) -> tuple[bool, str]:
                pods = await job_pods(cluster, tenant, name)
                on = sorted(p["spec"].get("nodeName") or "-" for p in pods)
                return len(pods) == count and all(n in nodes for n in on), f"{name}: {on}"

            await until(lambda: placed(tenant_a, "first", 2), timeout=120,
                        what="Kueue to admit tenant A's Job and hoss to place its pods on the flavor's nodes")
            await until(lambda: placed(tenant_b, "other", 2), timeout=120,
                        what="Kueue to admit tenant B's Job and hoss to place its pods")
            for pod in await job_pods(cluster, tenant_a, "first"):
                assert pod["spec"]["schedulerName"] == "hoss"
                assert pod["spec"].get("nodeSelector", {}).get("gang-set") == key, "Kueue's flavor selector"

            # The ClusterQueue's 4 cpu are taken: a third Job waits in its queue, suspended, no pod made.
            await batch.create_namespaced_job(tenant_a, job("second", "team", pods=2, cpu="1"))

            async def queued() -> tuple[bool, str]:
                workloads = (await custom.list_namespaced_custom_object(*KUEUE, tenant_a, "workloads"))["items"]
                mine = [w for w in workloads if any(r.get("name") == "second"
                                                    for r in w["metadata"].get("ownerReferences") or [])]
                conditions = {c["type"]: c for w in mine for c in (w.get("status") or {}).get("conditions") or []}
                pending = conditions.get("QuotaReserved", {}).get("status") == "False"
                return pending, str({t: (c.get("status"), c.get("message")) for t, c in conditions.items()})

            await until(queued, timeout=60, what="Kueue to keep the third Job queued past the quota")
            stored = await batch.read_namespaced_job("second", tenant_a)
            assert stored.spec.suspend is True and await job_pods(cluster, tenant_a, "second") == []

            # Quota frees up: the first Job goes; the third is admitted and hoss places it.
            await batch.delete_namespaced_job("first", tenant_a, propagation_policy="Foreground")
            await until(lambda: placed(tenant_a, "second", 2), timeout=150,
                        what="the queued Job to be admitted once quota frees up and its pods to be placed")
            pods = [p for t in (tenant_a, tenant_b) for p in await cluster.raw_list("list_namespaced_pod", t)]
            assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}
    finally:
        for tenant in (tenant_a, tenant_b):
            plane.kubectl("delete", "jobs", "--all", "-n", tenant, "--wait=false", "--ignore-not-found")
            await cluster.delete_pods(tenant)
        plane.kubectl("delete", "namespace", tenant_b, "--wait=false", "--ignore-not-found")
        plane.kubectl("delete", "clusterqueue", queue, "--wait=false", "--ignore-not-found")
        plane.kubectl("delete", "resourceflavor", flavor, "--wait=false", "--ignore-not-found")
        await cluster.delete_nodes(nodes)
