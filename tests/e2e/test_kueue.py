"""hoss behind Kueue on the real plane: Kueue's controller manager (built from sigs.k8s.io/kueue, dev/local/kueue.py)
queues two tenants' Jobs in one ClusterQueue through their LocalQueues and admits them within its quota; hoss
places the pods of admitted Jobs, on the nodes of the ResourceFlavor Kueue chose (the node selector Kueue injects).
A Job past the quota stays suspended, no pod of it made or placed, until quota frees up; a tenant borrows a
neighbour's idle quota in a cohort and Kueue takes it back by preemption; fair sharing splits a lender's quota
between two borrowing tenants; a Job admitted whole is placed by hoss as
a gang, all or nothing; Kueue's topology-aware scheduling gate holds pods until Kueue pins them to nodes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes_asyncio import client

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.kueue import QUEUE_LABEL
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import NODE_CAPACITY, pods_watched, worker_tries_again, workers
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


async def test_a_tenant_borrows_its_neighbours_idle_quota_and_kueue_takes_it_back_for_the_neighbour(
    plane: LocalPlane, dispatcher: Process, kueue: Process, cluster: Cluster, namespace: str
) -> None:
    """Two ClusterQueues of 2 cpu each in one cohort. Tenant A's Job of 4 x 1 cpu borrows B's idle 2 cpu and
    hoss places all four pods; then tenant B's Job of 2 x 1 cpu needs its own quota back: Kueue preempts A's
    workload (reclaimWithinCohort), A's pods go, and hoss places B's pods; A's Job waits in its queue."""
    tenant_a, tenant_b = namespace, f"{namespace[:50]}-b"
    await cluster.ensure_namespace(tenant_b)
    key = f"kq{next(_sets)}-{namespace}"[:63]
    custom: Any = client.CustomObjectsApi(cluster.api)
    batch: Any = client.BatchV1Api(cluster.api)
    flavor, cohort = f"{key}-flavor"[:63], f"{key}-cohort"[:63]
    queues = {tenant_a: f"{key}-a"[:63], tenant_b: f"{key}-b"[:63]}
    nodes = await cluster.create_nodes(2, prefix=f"kq{next(_sets)}", capacity=NODE_CAPACITY,
                                       labels={"gang-set": key})
    try:
        await cluster.wait_nodes_ready(nodes)
        await create(custom, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": flavor},
                                                 "spec": {"nodeLabels": {"gang-set": key}}})
        for tenant, queue in queues.items():
            await create(custom, "clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": queue}, "spec": {
                "cohortName": cohort, "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": tenant}},
                "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"},
                "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": flavor, "resources": [
                    {"name": "cpu", "nominalQuota": "2"}, {"name": "memory", "nominalQuota": "2Gi"}]}]}]}})
            await create(custom, "localqueues", {"kind": "LocalQueue", "metadata": {"name": "team"},
                                                 "spec": {"clusterQueue": queue}}, namespace=tenant)
        async with workers(plane, [("kq-2", ["default"])]):
            await batch.create_namespaced_job(tenant_a, job("wide", "team", pods=4, cpu="1"))

            async def bound(tenant: str, name: str) -> list[str]:
                return [p["metadata"]["name"] for p in await job_pods(cluster, tenant, name)
                        if p["spec"].get("nodeName") in nodes and not p["metadata"].get("deletionTimestamp")]

            async def a_borrows() -> tuple[bool, str]:
                placed = await bound(tenant_a, "wide")
                return len(placed) == 4, f"A: {placed}"

            await until(a_borrows, timeout=120, what="A's Job to borrow B's idle quota and hoss to place 4 pods")
            await batch.create_namespaced_job(tenant_b, job("mine", "team", pods=2, cpu="1"))

            async def b_takes_back() -> tuple[bool, str]:
                a, b = await bound(tenant_a, "wide"), await bound(tenant_b, "mine")
                stored = await batch.read_namespaced_job("wide", tenant_a)
                return len(b) == 2 and not a and stored.spec.suspend is True, \
                    f"A bound {a} (suspended: {stored.spec.suspend}), B bound {b}"

            await until(b_takes_back, timeout=180,
                        what="Kueue to preempt A's borrowing workload for B and hoss to place B's pods")
            workloads = (await custom.list_namespaced_custom_object(*KUEUE, tenant_a, "workloads"))["items"]
            reasons = [(c["type"], c.get("reason")) for w in workloads
                       for c in (w.get("status") or {}).get("conditions") or []]
            assert ("Preempted", "InCohortReclamation") in reasons or any(t == "Evicted" for t, _ in reasons), \
                reasons
            pods = [p for t in (tenant_a, tenant_b) for p in await cluster.raw_list("list_namespaced_pod", t)]
            assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}
    finally:
        for tenant in (tenant_a, tenant_b):
            plane.kubectl("delete", "jobs", "--all", "-n", tenant, "--wait=false", "--ignore-not-found")
            await cluster.delete_pods(tenant)
        plane.kubectl("delete", "namespace", tenant_b, "--wait=false", "--ignore-not-found")
        for queue in queues.values():
            plane.kubectl("delete", "clusterqueue", queue, "--wait=false", "--ignore-not-found")
        plane.kubectl("delete", "resourceflavor", flavor, "--wait=false", "--ignore-not-found")
        await cluster.delete_nodes(nodes)


async def test_a_job_kueue_admits_as_a_gang_is_placed_by_hoss_all_or_nothing(
    plane: LocalPlane, dispatcher: Process, kueue: Process, cluster: Cluster, namespace: str
) -> None:
    """Kueue admits a Job of 3 x 5 cpu whole (its quota holds all three); its pod template names a gang of 3
    (pod-group labels), so hoss binds none of its pods while only two 8-cpu nodes exist (one member each), and all
    three once a third node comes."""
    key = f"kq{next(_sets)}-{namespace}"[:63]
    custom: Any = client.CustomObjectsApi(cluster.api)
    batch: Any = client.BatchV1Api(cluster.api)
    flavor, queue = f"{key}-flavor"[:63], f"{key}-cq"[:63]
    nodes = await cluster.create_nodes(2, prefix=f"kq{next(_sets)}", capacity=NODE_CAPACITY,
                                       labels={"gang-set": key})
    extra: list[str] = []
    try:
        await cluster.wait_nodes_ready(nodes)
        await create(custom, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": flavor},
                                                 "spec": {"nodeLabels": {"gang-set": key}}})
        await create(custom, "clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": queue}, "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": flavor, "resources": [
                {"name": "cpu", "nominalQuota": "16"}, {"name": "memory", "nominalQuota": "4Gi"}]}]}]}})
        await create(custom, "localqueues", {"kind": "LocalQueue", "metadata": {"name": "team"},
                                             "spec": {"clusterQueue": queue}}, namespace=namespace)
        gang = job("train", "team", pods=3, cpu="5")
        gang["spec"]["template"]["metadata"] = {"labels": {
            "pod-group.scheduling.sigs.k8s.io/name": "train", "pod-group.scheduling.sigs.k8s.io/min-available": "3"}}
        async with workers(plane, [("kq-3", ["default"])]) as [worker]:
            await batch.create_namespaced_job(namespace, gang)

            async def refused() -> tuple[bool, str]:
                pods = await job_pods(cluster, namespace, "train")
                said = [c.get("message", "") for p in pods for c in (p.get("status") or {}).get("conditions") or []
                        if c.get("type") == "PodScheduled" and c.get("status") == "False"]
                return len(pods) == 3 and len(said) == 3 and all("only 2 of 3 members fit" in m for m in said), \
                    str(said)

            await until(refused, timeout=120, what="the admitted Job's gang to be refused whole by hoss")
            await worker_tries_again(worker)
            assert [p for p in await job_pods(cluster, namespace, "train") if p["spec"].get("nodeName")] == []
            extra = await cluster.create_nodes(1, prefix=f"kq{next(_sets)}", capacity=NODE_CAPACITY,
                                               labels={"gang-set": key})
            await cluster.wait_nodes_ready(extra)

            async def whole() -> tuple[bool, str]:
                on = [p["spec"].get("nodeName") for p in await job_pods(cluster, namespace, "train")]
                return len(on) == 3 and all(n in nodes + extra for n in on), str(on)

            await until(whole, timeout=150, what="the gang to bind whole once a third node fits it")
    finally:
        plane.kubectl("delete", "jobs", "--all", "-n", namespace, "--wait=false", "--ignore-not-found")
        await cluster.delete_pods(namespace)
        plane.kubectl("delete", "clusterqueue", queue, "--wait=false", "--ignore-not-found")
        plane.kubectl("delete", "resourceflavor", flavor, "--wait=false", "--ignore-not-found")
        await cluster.delete_nodes(nodes + extra)


async def test_kueue_topology_aware_scheduling_gates_and_node_selectors_are_honoured(
    plane: LocalPlane, dispatcher: Process, kueue: Process, cluster: Cluster, namespace: str
) -> None:
    """Kueue's topology-aware scheduling: a Job of 4 x 2 cpu requires one block (a Topology level). Block a has two
    8-cpu nodes, block b two 2-cpu nodes: only a holds it. Kueue admits it with a topology assignment, its pods are
    created behind the scheduling gate kueue.x-k8s.io/topology (hoss does not place a gated pod), and Kueue's
    ungater then lifts the gate and pins each pod to a node of block a (a kubernetes.io/hostname node selector):
    hoss places every pod on exactly that node."""
    key = f"kq{next(_sets)}-{namespace}"[:63]
    block = "e2e.hoss.io/block"
    custom: Any = client.CustomObjectsApi(cluster.api)
    batch: Any = client.BatchV1Api(cluster.api)
    flavor, queue, topology = f"{key}-flavor"[:63], f"{key}-cq"[:63], f"{key}-topology"[:63]
    big = await cluster.create_nodes(2, prefix=f"kq{next(_sets)}", capacity=NODE_CAPACITY,
                                     labels={"gang-set": key, block: f"{key}-a"[:63]})
    small = await cluster.create_nodes(2, prefix=f"kq{next(_sets)}", capacity={**NODE_CAPACITY, "cpu": "2"},
                                       labels={"gang-set": key, block: f"{key}-b"[:63]})
    try:
        await cluster.wait_nodes_ready(big + small)
        await create(custom, "topologies", {"kind": "Topology", "metadata": {"name": topology}, "spec": {
            "levels": [{"nodeLabel": block}, {"nodeLabel": "kubernetes.io/hostname"}]}})
        await create(custom, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": flavor},
                                                 "spec": {"nodeLabels": {"gang-set": key}, "topologyName": topology}})
        await create(custom, "clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": queue}, "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": flavor, "resources": [
                {"name": "cpu", "nominalQuota": "32"}, {"name": "memory", "nominalQuota": "8Gi"}]}]}]}})
        await create(custom, "localqueues", {"kind": "LocalQueue", "metadata": {"name": "team"},
                                             "spec": {"clusterQueue": queue}}, namespace=namespace)
        body = job("blocky", "team", pods=4, cpu="2")
        body["spec"]["template"]["metadata"] = {"annotations": {"kueue.x-k8s.io/podset-required-topology": block}}
        gated: set[str] = set()
        placed_while_gated: list[str] = []

        def seen(pods: Mapping[str, Json]) -> None:
            for pod in pods.values():
                if (pod["metadata"].get("labels") or {}).get("job-name") != "blocky":
                    continue
                gates = [g.get("name") for g in pod["spec"].get("schedulingGates") or []]
                if "kueue.x-k8s.io/topology" in gates:
                    gated.add(pod["metadata"]["name"])
                    if pod["spec"].get("nodeName"):
                        placed_while_gated.append(pod["metadata"]["name"])

        async with workers(plane, [("kq-4", ["default"])]), pods_watched(cluster, seen, namespace=namespace):
            await batch.create_namespaced_job(namespace, body)

            async def placed() -> tuple[bool, str]:
                pods = await job_pods(cluster, namespace, "blocky")
                on = {p["metadata"]["name"]: (p["spec"].get("nodeName"),
                                              (p["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname"))
                      for p in pods}
                return len(on) == 4 and all(node and node == pinned for node, pinned in on.values()), str(on)

            await until(placed, timeout=150, what="Kueue to ungate the pods onto block a and hoss to place them")
            pods = await job_pods(cluster, namespace, "blocky")
            assert {p["spec"]["nodeName"] for p in pods} <= set(big), "block a only"
            assert len(gated) == 4 and placed_while_gated == [], (gated, placed_while_gated)
            workloads = (await custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads"))["items"]
            assignments = [ps.get("topologyAssignment") for w in workloads
                           for ps in ((w.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []]
            assert any(assignments), workloads
    finally:
        plane.kubectl("delete", "jobs", "--all", "-n", namespace, "--wait=false", "--ignore-not-found")
        await cluster.delete_pods(namespace)
        plane.kubectl("delete", "clusterqueue", queue, "--wait=false", "--ignore-not-found")
        plane.kubectl("delete", "resourceflavor", flavor, "--wait=false", "--ignore-not-found")
        plane.kubectl("delete", "topology", topology, "--wait=false", "--ignore-not-found")
        await cluster.delete_nodes(big + small)


async def test_fair_sharing_splits_a_lenders_quota_between_two_borrowing_tenants(
    plane: LocalPlane, dispatcher: Process, kueue: Process, cluster: Cluster, namespace: str
) -> None:
    """A cohort of three ClusterQueues: a lender with 4 cpu and no tenant, and two tenants' queues with none of
    their own. Tenant A's four 1-cpu Jobs borrow all 4 cpu; then tenant B's two arrive: with fair sharing Kueue
    preempts two of A's so that each tenant holds an equal share (2 and 2), and hoss places the pods of what Kueue
    admits."""
    tenant_a, tenant_b = namespace, f"{namespace[:50]}-b"
    await cluster.ensure_namespace(tenant_b)
    key = f"kq{next(_sets)}-{namespace}"[:63]
    custom: Any = client.CustomObjectsApi(cluster.api)
    batch: Any = client.BatchV1Api(cluster.api)
    flavor, cohort = f"{key}-flavor"[:63], f"{key}-cohort"[:63]
    queues = {"lender": (f"{key}-lend"[:63], "4"), tenant_a: (f"{key}-a"[:63], "0"),
              tenant_b: (f"{key}-b"[:63], "0")}
    nodes = await cluster.create_nodes(1, prefix=f"kq{next(_sets)}", capacity=NODE_CAPACITY,
                                       labels={"gang-set": key})
    try:
        await cluster.wait_nodes_ready(nodes)
        await create(custom, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": flavor},
                                                 "spec": {"nodeLabels": {"gang-set": key}}})
        for owner, (queue, cpu) in queues.items():
            selector = {"matchLabels": {"kubernetes.io/metadata.name": owner}} if owner != "lender" else \
                {"matchLabels": {"e2e.hoss.io/none": "x"}}
            await create(custom, "clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": queue}, "spec": {
                "cohortName": cohort, "namespaceSelector": selector,
                "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"},
                "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": flavor, "resources": [
                    {"name": "cpu", "nominalQuota": cpu},
                    {"name": "memory", "nominalQuota": "4Gi" if cpu != "0" else "0"}]}]}]}})
            if owner != "lender":
                await create(custom, "localqueues", {"kind": "LocalQueue", "metadata": {"name": "team"},
                                                     "spec": {"clusterQueue": queue}}, namespace=owner)

        async def running(tenant: str) -> int:
            return sum(1 for p in await cluster.raw_list("list_namespaced_pod", tenant)
                       if p["spec"].get("nodeName") in nodes and not p["metadata"].get("deletionTimestamp"))

        async with workers(plane, [("kq-5", ["default"])]):
            for i in range(4):
                await batch.create_namespaced_job(tenant_a, job(f"a{i}", "team", pods=1, cpu="1"))

            async def a_takes_all() -> tuple[bool, str]:
                count = await running(tenant_a)
                return count == 4, f"A runs {count}"

            await until(a_takes_all, timeout=120, what="A to borrow all of the lender's 4 cpu")
            for i in range(2):
                await batch.create_namespaced_job(tenant_b, job(f"b{i}", "team", pods=1, cpu="1"))

            async def fair() -> tuple[bool, str]:
                a, b = await running(tenant_a), await running(tenant_b)
                return (a, b) == (2, 2), f"A runs {a}, B runs {b}"

            await until(fair, timeout=180, what="fair sharing to give each tenant an equal share")
            pods = [p for t in (tenant_a, tenant_b) for p in await cluster.raw_list("list_namespaced_pod", t)]
            assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}
    finally:
        for tenant in (tenant_a, tenant_b):
            plane.kubectl("delete", "jobs", "--all", "-n", tenant, "--wait=false", "--ignore-not-found")
            await cluster.delete_pods(tenant)
        plane.kubectl("delete", "namespace", tenant_b, "--wait=false", "--ignore-not-found")
        for queue, _cpu in queues.values():
            plane.kubectl("delete", "clusterqueue", queue, "--wait=false", "--ignore-not-found")
        plane.kubectl("delete", "resourceflavor", flavor, "--wait=false", "--ignore-not-found")
        await cluster.delete_nodes(nodes)
