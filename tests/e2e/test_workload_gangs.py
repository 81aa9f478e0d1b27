"""Gangs as the ecosystem writes them, on the real plane (its apiserver serves Kubernetes 1.36's Workload API and
its kube-scheduler runs GangScheduling): a scheduling.k8s.io/v1alpha2 PodGroup placed by kube-scheduler (the
control) and by hoss on nodes of their own with the same outcome, all-or-nothing; PodGroup fields hoss does not
honour refused by name; a Volcano job whose pods arrive in waves, before and after its PodGroup, bound whole or
not at all; and a scheduler-plugins PodGroup whose status follows its members to Finished, so that a pod that
depends on it starts then."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio import client

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import (
    NODE_CAPACITY,
    hoss_had_its_turn,
    hoss_pods,
    pinned,
    pods_watched,
    scheduled_condition,
    wait_all_bound,
    workers,
)
from tests.e2e.test_quota import GPU, elastic_quota, used_status
from tests.waiting import until

WORKLOAD = ("scheduling.k8s.io", "v1alpha2", "podgroups")
VOLCANO = ("scheduling.volcano.sh", "v1beta1", "podgroups")
PLUGINS = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
_sets = itertools.count()


@asynccontextmanager
async def nodes(cluster: Cluster, count: int, key: str, **labels: str) -> AsyncIterator[list[str]]:
    """``count`` 8-cpu nodes labelled gang-set=``key`` (their own, for one scheduler) and ``labels``."""
    names = await cluster.create_nodes(count, prefix=f"wg{next(_sets)}", capacity=NODE_CAPACITY,
                                       labels={"gang-set": key, **labels})
    try:
        await cluster.wait_nodes_ready(names)
        yield names
    finally:
        await cluster.delete_nodes(names)


def custom(cluster: Cluster) -> Any:
    return client.CustomObjectsApi(cluster.api)


async def create_group(cluster: Cluster, api: tuple[str, str, str], namespace: str, name: str, spec: Json) -> None:
    group, version, plural = api
    body = {"apiVersion": f"{group}/{version}", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    await custom(cluster).create_namespaced_custom_object(group, version, namespace, plural, body)


async def read_group(cluster: Cluster, api: tuple[str, str, str], namespace: str, name: str) -> Json:
    group, version, plural = api
    found: Json = await custom(cluster).get_namespaced_custom_object(group, version, namespace, plural, name)
    return found


def gang_pods(prefix: str, count: int, *, cpu: str, scheduler: str, key: str, group: str) -> list[Json]:
    """Pods of a Kubernetes gang: spec.schedulingGroup names the PodGroup ``group``; kept on gang-set=``key``."""
    pods = pinned(hoss_pods(prefix, count, cpu=cpu), "gang-set", key)
    for pod in pods:
        pod["spec"]["schedulerName"] = scheduler
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pods


async def pods_named(cluster: Cluster, namespace: str, prefix: str) -> list[Json]:
    return [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
            if p["metadata"]["name"].startswith(prefix)]


async def check_not_oversold(cluster: Cluster, namespace: str) -> None:
    pods = await cluster.raw_list("list_namespaced_pod", namespace)
    assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}


def scheduled_condition_of(group: Json) -> Mapping[str, Any]:
    for condition in (group.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodGroupScheduled":
            return dict(condition)
    return {}


async def test_a_kubernetes_podgroup_gang_binds_whole_or_not_at_all_under_kube_scheduler_and_under_hoss(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """On three 8-cpu nodes each: a gang of 3 x 2 cpu (minCount 3) fits and binds whole; a gang of 4 x 5 cpu
    (minCount 4) fits only 3 members (one per node) and binds none, its PodGroup saying PodGroupScheduled=False;
    with a fourth node it binds whole. kube-scheduler 1.36 (GangScheduling) and hoss end alike."""
    outcomes: dict[str, Any] = {}
    async with workers(plane, [("wg-1", ["default"])]):
        for scheduler, prefix in (("default-scheduler", "k"), ("hoss", "h")):
            key = f"{namespace}-{prefix}"[:63]
            async with nodes(cluster, 3, key):
                await create_group(cluster, WORKLOAD, namespace, f"{prefix}-fits",
                                   {"schedulingPolicy": {"gang": {"minCount": 3}}})
                await create_group(cluster, WORKLOAD, namespace, f"{prefix}-big",
                                   {"schedulingPolicy": {"gang": {"minCount": 4}}})
                await cluster.create_pods(
                    gang_pods(f"{prefix}-fits", 3, cpu="2", scheduler=scheduler, key=key, group=f"{prefix}-fits")
                    + gang_pods(f"{prefix}-big", 4, cpu="5", scheduler=scheduler, key=key, group=f"{prefix}-big"),
                    namespace=namespace)

                async def settled(prefix: str = prefix) -> tuple[bool, str]:
                    fits = await pods_named(cluster, namespace, f"{prefix}-fits")
                    big = await pods_named(cluster, namespace, f"{prefix}-big")
                    bound = sum(bool(p["spec"].get("nodeName")) for p in fits)
                    told = [(await scheduled_condition(cluster, namespace, p["metadata"]["name"]))[0] for p in big]
                    group = scheduled_condition_of(await read_group(cluster, WORKLOAD, namespace, f"{prefix}-big"))
                    fits_group = scheduled_condition_of(
                        await read_group(cluster, WORKLOAD, namespace, f"{prefix}-fits"))
                    return (bound == 3 and all(told) and group.get("status") == "False" and bool(fits_group),
                            f"{bound} of the fitting gang bound, its group {fits_group}; the big one's reasons "
                            f"{told}, its group {group}")

                await until(settled, timeout=120, what=f"{scheduler} to place the fitting gang and refuse the big one")
                big = await pods_named(cluster, namespace, f"{prefix}-big")
                fits_group = await read_group(cluster, WORKLOAD, namespace, f"{prefix}-fits")
                big_group = await read_group(cluster, WORKLOAD, namespace, f"{prefix}-big")
                outcome: dict[str, Any] = {
                    "big bound": sum(bool(p["spec"].get("nodeName")) for p in big),
                    "fits group": {k: scheduled_condition_of(fits_group).get(k) for k in ("status", "reason")},
                    "big group": {k: scheduled_condition_of(big_group).get(k) for k in ("status", "reason")},
                }
                async with nodes(cluster, 1, key):
                    async def whole(prefix: str = prefix) -> tuple[bool, str]:
                        big = await pods_named(cluster, namespace, f"{prefix}-big")
                        bound = sum(bool(p["spec"].get("nodeName")) for p in big)
                        return bound == 4, f"{bound} of the big gang bound"

                    await until(whole, timeout=120, what=f"{scheduler} to bind the big gang once it fits")
                    big = await pods_named(cluster, namespace, f"{prefix}-big")
                    outcome["big bound with a fourth node"] = sum(bool(p["spec"].get("nodeName")) for p in big)
                    outcomes[scheduler] = outcome
                    await check_not_oversold(cluster, namespace)
                    await cluster.delete_pods(namespace)
    expected = {"big bound": 0, "fits group": {"status": "True", "reason": "Scheduled"},
                "big group": {"status": "False", "reason": "Unschedulable"}, "big bound with a fourth node": 4}
    assert outcomes == {"default-scheduler": expected, "hoss": expected}, outcomes



ZONE = "topology.kubernetes.io/zone"


async def test_a_topology_constraint_keeps_a_gang_within_one_domain_under_kube_scheduler_and_under_hoss(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Two zones of two 8-cpu nodes each; PodGroups with schedulingConstraints.topology on the zone label. A gang
    of 4 x 4 cpu fits one zone and binds there, whole; then a gang of 4 x 5 cpu fits four nodes but no single
    zone (one member per node) and binds nothing, though the two zones together would hold it. kube-scheduler 1.36
    (TopologyAwareWorkloadScheduling) and hoss end alike."""
    outcomes: dict[str, Any] = {}
    constraint = {"topology": [{"key": ZONE}]}
    async with workers(plane, [("wg-6", ["default"])]):
        for scheduler, prefix in (("default-scheduler", "k"), ("hoss", "h")):
            key = f"{namespace}-{prefix}"[:63]
            async with nodes(cluster, 2, key, **{ZONE: f"{key}-a"[:63]}), \
                    nodes(cluster, 2, key, **{ZONE: f"{key}-b"[:63]}):
                await create_group(cluster, WORKLOAD, namespace, f"{prefix}-one", {
                    "schedulingPolicy": {"gang": {"minCount": 4}}, "schedulingConstraints": constraint})
                await cluster.create_pods(
                    gang_pods(f"{prefix}-one", 4, cpu="4", scheduler=scheduler, key=key, group=f"{prefix}-one"),
                    namespace=namespace)

                async def one_bound(prefix: str = prefix) -> tuple[bool, str]:
                    pods = await pods_named(cluster, namespace, f"{prefix}-one")
                    bound = [p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")]
                    return len(bound) == 4, f"{len(bound)} bound"

                await until(one_bound, timeout=120, what=f"{scheduler} to bind the gang that fits one zone")
                zone_of = {n["metadata"]["name"]: n["metadata"]["labels"].get(ZONE)
                           for n in await cluster.raw_list("list_node")}
                zones_used = {zone_of[p["spec"]["nodeName"]]
                              for p in await pods_named(cluster, namespace, f"{prefix}-one")}
                await cluster.delete_pods(namespace)

                async def gone(prefix: str = prefix) -> tuple[bool, str]:
                    left = await pods_named(cluster, namespace, f"{prefix}-one")
                    return not left, f"{len(left)} left"

                await until(gone, timeout=60, what="the first gang's pods to be deleted")
                await create_group(cluster, WORKLOAD, namespace, f"{prefix}-wide", {
                    "schedulingPolicy": {"gang": {"minCount": 4}}, "schedulingConstraints": constraint})
                await cluster.create_pods(
                    gang_pods(f"{prefix}-wide", 4, cpu="5", scheduler=scheduler, key=key, group=f"{prefix}-wide"),
                    namespace=namespace)

                async def refused(prefix: str = prefix) -> tuple[bool, str]:
                    pods = await pods_named(cluster, namespace, f"{prefix}-wide")
                    told = [(await scheduled_condition(cluster, namespace, p["metadata"]["name"]))[0] for p in pods]
                    group = scheduled_condition_of(await read_group(cluster, WORKLOAD, namespace, f"{prefix}-wide"))
                    return all(told) and group.get("status") == "False", f"reasons {told}, group {group}"

                await until(refused, timeout=120, what=f"{scheduler} to refuse the gang no single zone holds")
                wide = await pods_named(cluster, namespace, f"{prefix}-wide")
                outcomes[scheduler] = {"zones the first gang used": len(zones_used),
                                       "wide gang bound": sum(bool(p["spec"].get("nodeName")) for p in wide)}
                await check_not_oversold(cluster, namespace)
                await cluster.delete_pods(namespace)
    expected = {"zones the first gang used": 1, "wide gang bound": 0}
    assert outcomes == {"default-scheduler": expected, "hoss": expected}, outcomes


async def test_podgroup_fields_hoss_does_not_honour_are_refused_by_name_on_the_members_and_the_group(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A Volcano PodGroup with a networkTopology and one on a queue other than default: their members wait, never
    placed, their PodScheduled=False condition naming the field; the groups stay Pending. (Every field a Kubernetes
    PodGroup may carry on this plane is honoured: its refusals are unit-tested.)"""
    key = f"{namespace}-refused"[:63]
    async with nodes(cluster, 2, key), workers(plane, [("wg-2", ["default"])]):
        await create_group(cluster, VOLCANO, namespace, "topo", {
            "minMember": 2, "networkTopology": {"mode": "hard", "highestTierAllowed": 1}})
        await create_group(cluster, VOLCANO, namespace, "queued", {"minMember": 2, "queue": "research"})
        pods = []
        for group in ("topo", "queued"):
            members = pinned(hoss_pods(group, 2), "gang-set", key)
            for pod in members:
                pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": group}
            pods += members
        await cluster.create_pods(pods, namespace=namespace)
        expected = {"topo-0000": "spec.networkTopology", "topo-0001": "spec.networkTopology",
                    "queued-0000": "spec.queue 'research'", "queued-0001": "spec.queue 'research'"}

        async def refused() -> tuple[bool, str]:
            seen = {pod: await scheduled_condition(cluster, namespace, pod) for pod in expected}
            phases = [((await read_group(cluster, VOLCANO, namespace, g)).get("status") or {}).get("phase")
                      for g in ("topo", "queued")]
            return (all(reason == "PodGroupRefused" and expected[pod] in message
                        for pod, (reason, message) in seen.items())
                    and phases == ["Pending", "Pending"]), f"{seen}; {phases}"

        await until(refused, timeout=90, what="each refused PodGroup field to be named on its members")
        await hoss_had_its_turn(plane, dispatcher, [p["metadata"]["uid"] for p in
                                                    await cluster.raw_list("list_namespaced_pod", namespace)])
        assert [p for p in await cluster.raw_list("list_namespaced_pod", namespace) if p["spec"].get("nodeName")] == []


async def test_a_volcano_job_arriving_in_waves_binds_all_or_nothing_once_its_podgroup_and_every_task_are_there(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Three workers of a Volcano job come before its PodGroup: they wait for it (the annotation alone no longer
    makes a gang of whoever is pending). The PodGroup (minMember 4, minTaskMember ps 1, worker 3) comes: they wait
    for the ps. The ps comes: all four bind at once. No member is ever bound before that, and the PodGroup then
    reports phase Running with 4 running."""
    key = f"{namespace}-volcano"[:63]
    bound_early: list[str] = []
    whole = False
    """Set once the last member is created: from then on the gang may bind (its bindings are one call each)."""

    def seen(pods: Mapping[str, Json]) -> None:
        if not whole:
            bound_early.extend(p["metadata"]["name"] for p in pods.values() if p["spec"].get("nodeName"))

    def job_pods(task: str, count: int) -> list[Json]:
        pods = pinned(hoss_pods(f"{task}", count, cpu="1"), "gang-set", key)
        for pod in pods:
            pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "job",
                                              "volcano.sh/task-spec": task}
        return pods

    async def reasons(prefix: str) -> list[tuple[str, str]]:
        return [await scheduled_condition(cluster, namespace, p["metadata"]["name"])
                for p in await pods_named(cluster, namespace, prefix)]

    async with nodes(cluster, 2, key), workers(plane, [("wg-3", ["default"])]), \
            pods_watched(cluster, seen, namespace=namespace):
        await cluster.create_pods(job_pods("worker", 3), namespace=namespace)

        async def waits_for_group() -> tuple[bool, str]:
            found = await reasons("worker")
            return all("waiting for Volcano PodGroup" in message for _, message in found), str(found)

        await until(waits_for_group, timeout=60, what="the workers to wait for their Volcano PodGroup")
        await create_group(cluster, VOLCANO, namespace, "job",
                           {"minMember": 4, "minTaskMember": {"ps": 1, "worker": 3}, "queue": "default",
                            "minResources": {"cpu": "4"}})

        async def waits_for_ps() -> tuple[bool, str]:
            found = await reasons("worker")
            return all("task ps: 0 of 1" in message for _, message in found), str(found)

        await until(waits_for_ps, timeout=60, what="the workers to wait for the ps task")
        await hoss_had_its_turn(plane, dispatcher, [p["metadata"]["uid"] for p in
                                                    await cluster.raw_list("list_namespaced_pod", namespace)])
        whole = True
        assert bound_early == [], f"members bound before the gang was whole: {bound_early}"
        await cluster.create_pods(job_pods("ps", 1), namespace=namespace)
        pods = await wait_all_bound(cluster, namespace, 4, timeout=90)
        assert {p["metadata"]["name"] for p in pods} == {"ps-0000", "worker-0000", "worker-0001", "worker-0002"}

        async def running() -> tuple[bool, str]:
            status = (await read_group(cluster, VOLCANO, namespace, "job")).get("status") or {}
            return status.get("phase") == "Running" and status.get("running") == 4, str(status)

        await until(running, timeout=60, what="the Volcano PodGroup to report its members running")


async def test_a_podgroup_status_follows_its_members_to_finished_and_a_pod_that_depends_on_it_then_starts(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A scheduler-plugins PodGroup of two: Running with 2 running (scheduleStartTime set), then --
    its members finished long after they were bound -- Finished with 2 succeeded and occupiedBy naming their owner,
    each step an event on the group. A pod with hoss.io/depends-on: podgroup/train:Complete waits until then."""
    key = f"{namespace}-status"[:63]
    await create_group(cluster, PLUGINS, namespace, "train", {"minMember": 2})
    async with nodes(cluster, 1, key), workers(plane, [("wg-4", ["default"])]):
        members = pinned(hoss_pods("train", 2, labels={"scheduling.x-k8s.io/pod-group": "train"}), "gang-set", key)
        owner = await cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "trainer"}})
        for pod in members:  # an owner that exists (the garbage collector deletes pods whose owner does not)
            pod["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "trainer",
                                                   "uid": owner.metadata.uid}]
        after = pinned(hoss_pods("after", 1), "gang-set", key)[0]
        after["metadata"]["annotations"] = {"hoss.io/depends-on": "podgroup/train:Complete"}
        await cluster.create_pods([*members, after], namespace=namespace)

        async def status(phase: str, **counts: int) -> tuple[bool, str]:
            found = (await read_group(cluster, PLUGINS, namespace, "train")).get("status") or {}
            return (found.get("phase") == phase and all(found.get(k) == v for k, v in counts.items())
                    and bool(found.get("scheduleStartTime"))), str(found)

        await until(lambda: status("Running", running=2), timeout=90, what="the PodGroup to be Running")

        async def waits() -> tuple[bool, str]:
            reason, message = await scheduled_condition(cluster, namespace, "after-0000")
            return reason == "WaitingForDependency" and "podgroup train" in message, f"{reason}: {message}"

        await until(waits, timeout=60, what="the dependent pod to say it waits for the PodGroup")
        assert not (await cluster.core.read_namespaced_pod("after-0000", namespace)).spec.node_name
        for pod in members:  # the members finish (kwok runs pods forever: their end is written here)
            await cluster.core.patch_namespaced_pod_status(pod["metadata"]["name"], namespace,
                                                           {"status": {"phase": "Succeeded"}})
        await until(lambda: status("Finished", succeeded=2, running=0), timeout=60,
                    what="the PodGroup to be Finished")
        group = await read_group(cluster, PLUGINS, namespace, "train")
        assert group["status"]["occupiedBy"] == f"{namespace}/trainer"

        async def after_bound() -> tuple[bool, str]:
            pod = await cluster.core.read_namespaced_pod("after-0000", namespace)
            return bool(pod.spec.node_name), str(pod.status.conditions)

        await until(after_bound, timeout=60, what="the dependent pod to be placed once its PodGroup finished")
        events = await cluster.core.list_namespaced_event(
            namespace, field_selector="involvedObject.kind=PodGroup,involvedObject.name=train")
        assert {"Running", "Finished"} <= {e.reason for e in events.items}, \
            [e.reason for e in events.items]


async def test_a_running_gang_is_preempted_whole_never_in_part(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A low-priority gang of two (disruptionMode PodGroup; one member per 8-cpu node, 6 cpu each) runs; a
    high-priority pod of 6 cpu needs one node: preemption evicts both members, not the one on the chosen node alone,
    which would leave the other running without its gang. The preemptor then binds."""
    key = f"{namespace}-preempt"[:63]
    scheduling: Any = client.SchedulingV1Api(cluster.api)
    classes = {f"{namespace}-low"[:63]: 10, f"{namespace}-high"[:63]: 1000}
    for name, value in classes.items():
        await scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
    low, high = classes
    try:
        async with nodes(cluster, 2, key), workers(plane, [("wg-5", ["default"])]):
            await create_group(cluster, WORKLOAD, namespace, "low", {"schedulingPolicy": {"gang": {"minCount": 2}},
                                                                     "disruptionMode": "PodGroup"})
            members = gang_pods("low", 2, cpu="6", scheduler="hoss", key=key, group="low")
            for pod in members:
                pod["spec"]["priorityClassName"] = low
            await cluster.create_pods(members, namespace=namespace)
            await wait_all_bound(cluster, namespace, 2, timeout=90)
            urgent = pinned(hoss_pods("urgent", 1, cpu="6"), "gang-set", key)[0]
            urgent["spec"]["priorityClassName"] = high
            await cluster.create_pods([urgent], namespace=namespace)

            async def preempted() -> tuple[bool, str]:
                pods = {p["metadata"]["name"]: p for p in await cluster.raw_list("list_namespaced_pod", namespace)}
                left = [n for n in ("low-0000", "low-0001") if n in pods and not pods[n]["metadata"].get(
                    "deletionTimestamp")]
                bound = bool(pods.get("urgent-0000", {}).get("spec", {}).get("nodeName"))
                return not left and bound, f"gang members left running: {left}; urgent bound: {bound}"

            await until(preempted, timeout=120, what="the whole gang to be preempted and the urgent pod to bind")
            for member in ("low-0000", "low-0001"):
                events = await cluster.events_for(namespace, member)
                assert any(e.reason == "Preempted" for e in events), [e.reason for e in events]
            await check_not_oversold(cluster, namespace)
    finally:
        for name in classes:
            await scheduling.delete_priority_class(name)


async def test_a_gang_within_its_quota_min_reclaims_for_all_its_members_at_once(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Six GPUs (three nodes of two); tenant A (min 2, max 6) runs six 1-GPU pods, borrowing four; tenant B (min 4)
    sends a gang of four 1-GPU pods. No node has room: the gang reclaims A's four borrowed pods at once, all or
    nothing, and binds whole; A keeps its min."""
    tenant_a, tenant_b = namespace, f"{namespace[:50]}-b"
    await cluster.ensure_namespace(tenant_b)
    key = f"{namespace}-reclaim"[:63]
    gpu_node = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "2"}
    names = await cluster.create_nodes(3, prefix=f"wg{next(_sets)}", capacity=gpu_node, labels={"gang-set": key})
    try:
        await cluster.wait_nodes_ready(names)
        await elastic_quota(cluster, tenant_a, {GPU: "2"}, {GPU: "6"})
        await elastic_quota(cluster, tenant_b, {GPU: "4"}, {GPU: "6"})

        async def quotas_synced() -> tuple[bool, str]:
            return (await used_status(cluster, tenant_a) == {GPU: "0"}
                    and await used_status(cluster, tenant_b) == {GPU: "0"}), "status.used of both quotas"

        async with workers(plane, [("wg-7", ["default"])]):
            await until(quotas_synced, timeout=60, what="the resolver to pick up both ElasticQuotas")
            await cluster.create_pods(pinned(hoss_pods("a", 6, cpu="100m", extra={GPU: "1"}), "gang-set", key),
                                      namespace=tenant_a)
            await wait_all_bound(cluster, tenant_a, 6, timeout=120)
            labels = {"pod-group.scheduling.sigs.k8s.io/name": "train",
                      "pod-group.scheduling.sigs.k8s.io/min-available": "4"}
            await cluster.create_pods(
                pinned(hoss_pods("b", 4, cpu="100m", extra={GPU: "1"}, labels=labels), "gang-set", key),
                namespace=tenant_b)

            async def reclaimed() -> tuple[bool, str]:
                a = [p for p in await cluster.raw_list("list_namespaced_pod", tenant_a)
                     if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]
                b = [p for p in await cluster.raw_list("list_namespaced_pod", tenant_b) if p["spec"].get("nodeName")]
                return (len(a), len(b)) == (2, 4), f"A {len(a)} bound, B {len(b)} bound"

            await until(reclaimed, timeout=180, what="B's gang to reclaim A's borrowed GPUs and bind whole")
            said = [e.message or "" for i in range(4) for e in await cluster.events_for(tenant_b, f"b-{i:04d}")]
            assert any("reclaim: in progress for the gang" in m for m in said), said
            preempted = [e for i in range(6) for e in await cluster.events_for(tenant_a, f"a-{i:04d}")
                         if e.reason == "Preempted"]
            assert len(preempted) == 4, [e.message for e in preempted]
            await check_not_oversold(cluster, tenant_b)
    finally:
        await cluster.delete_pods(tenant_a)
        await cluster.delete_pods(tenant_b)
        plane.kubectl("delete", "namespace", tenant_b, "--wait=false", "--ignore-not-found")
        await cluster.delete_nodes(names)
