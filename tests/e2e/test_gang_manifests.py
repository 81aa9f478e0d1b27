"""Gang manifests as their ecosystems' users write them, tried on the real plane the way an outside tester would:
an Indexed Job for which Kubernetes 1.36's Job controller makes the Workload and the gang PodGroup (kube-scheduler
the control); members of a scheduler-plugins PodGroup and of a Kubernetes PodGroup arriving in waves, never bound
in part, and a gang whose minCount exceeds the members that exist, told so in ``kubectl describe pod``; and a
Volcano PodGroup made first, as Volcano's job controller makes it, that goes Inqueue so that the job's pods can be
made, then Running."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import (
    hoss_had_its_turn,
    hoss_pods,
    pinned,
    pods_watched,
    scheduled_condition,
    wait_all_bound,
    workers,
)
from tests.e2e.test_workload_gangs import (
    PLUGINS,
    VOLCANO,
    WORKLOAD,
    check_not_oversold,
    create_group,
    gang_pods,
    nodes,
    pods_named,
    read_group,
)
from tests.waiting import until


def indexed_job(name: str, count: int, *, cpu: str, scheduler: str, key: str) -> Json:
    """An Indexed Job of ``count`` pods at once (completions = parallelism), as a 1.36 user writes a gang job."""
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed", "completions": count, "parallelism": count, "backoffLimit": 0,
            "template": {"spec": {
                "schedulerName": scheduler, "restartPolicy": "Never", "nodeSelector": {"gang-set": key},
                "containers": [{"name": "train", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {"cpu": cpu, "memory": "512Mi"}}}],
            }},
        },
    }


async def test_an_indexed_job_binds_whole_or_not_at_all_through_the_podgroup_its_job_controller_makes(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """An Indexed Job of 3 x 5 cpu on two 8-cpu nodes: the Job controller (WorkloadWithJob) makes a Workload and a
    PodGroup of minCount 3 and names it in each pod's spec.schedulingGroup; two members would fit, none binds;
    with a third node all three bind. kube-scheduler 1.36 and hoss end alike."""
    batch: Any = client.BatchV1Api(cluster.api)
    outcomes: dict[str, Any] = {}
    async with workers(plane, [("gm-1", ["default"])]):
        for scheduler, prefix in (("default-scheduler", "k"), ("hoss", "h")):
            key = f"{namespace}-job-{prefix}"[:63]
            async with nodes(cluster, 2, key):
                await batch.create_namespaced_job(namespace, indexed_job(f"{prefix}-train", 3, cpu="5",
                                                                         scheduler=scheduler, key=key))

                async def made(prefix: str = prefix) -> tuple[bool, str]:
                    pods = await pods_named(cluster, namespace, f"{prefix}-train")
                    groups = [p["spec"].get("schedulingGroup") for p in pods]
                    return len(pods) == 3 and all(groups), f"{len(pods)} pods, their groups {groups}"

                await until(made, timeout=60, what="the Job controller to make its pods in a PodGroup")
                [group_name] = {p["spec"]["schedulingGroup"]["podGroupName"]
                                for p in await pods_named(cluster, namespace, f"{prefix}-train")}
                group = await read_group(cluster, WORKLOAD, namespace, group_name)
                assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}, group["spec"]

                async def refused(prefix: str = prefix, group_name: str = group_name) -> tuple[bool, str]:
                    conditions = (await read_group(cluster, WORKLOAD, namespace, group_name)).get("status", {})
                    said = [c for c in conditions.get("conditions") or [] if c.get("type") == "PodGroupScheduled"]
                    return bool(said) and said[0].get("status") == "False", str(said)

                await until(refused, timeout=120, what=f"{scheduler} to say the gang does not fit")
                outcome: dict[str, Any] = {"bound on two nodes": sum(
                    bool(p["spec"].get("nodeName")) for p in await pods_named(cluster, namespace, f"{prefix}-train"))}
                async with nodes(cluster, 1, key):
                    async def whole(prefix: str = prefix) -> tuple[bool, str]:
                        pods = await pods_named(cluster, namespace, f"{prefix}-train")
                        bound = sum(bool(p["spec"].get("nodeName")) for p in pods)
                        return bound == 3, f"{bound} of 3 bound"

                    await until(whole, timeout=120, what=f"{scheduler} to bind the Job's gang once it fits")
                    outcome["bound on three nodes"] = 3
                    outcomes[scheduler] = outcome
                    await check_not_oversold(cluster, namespace)
                    await batch.delete_namespaced_job(f"{prefix}-train", namespace, propagation_policy="Background")
                    await cluster.delete_pods(namespace)
    expected = {"bound on two nodes": 0, "bound on three nodes": 3}
    assert outcomes == {"default-scheduler": expected, "hoss": expected}, outcomes


async def test_gang_members_arriving_in_waves_never_bind_in_part_and_a_gang_short_of_members_says_so(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A scheduler-plugins PodGroup (minMember 4) and a Kubernetes PodGroup (minCount 4) each get two members, then
    two more after hoss had its turn; a Kubernetes PodGroup of minCount 5 gets four, all there is. No member is
    ever bound before its gang is whole; the first two gangs then bind whole; the third never binds, and
    ``kubectl describe pod`` says why (4 of 5). A scheduler-plugins PodGroup carrying a field of Volcano's
    (minTaskMember) is refused, its member told the field, and so are two pods with the lightweight name label
    but no min-available."""
    key = f"{namespace}-waves"[:63]
    early: list[str] = []
    complete: set[str] = set()
    """Gangs whose last member was created: their members may bind from then on."""

    def seen(pods: Mapping[str, Json]) -> None:
        for pod in pods.values():
            name = pod["metadata"]["name"]
            if pod["spec"].get("nodeName") and name.split("-")[0] not in complete:
                early.append(name)

    def plugins(first: int, count: int) -> list[Json]:
        pods = pinned(hoss_pods("sp", first + count, labels={"scheduling.x-k8s.io/pod-group": "sp"}), "gang-set", key)
        return pods[first:]

    def workload(prefix: str, first: int, count: int) -> list[Json]:
        return gang_pods(prefix, first + count, cpu="500m", scheduler="hoss", key=key, group=prefix)[first:]

    async with nodes(cluster, 2, key), workers(plane, [("gm-2", ["default"])]), \
            pods_watched(cluster, seen, namespace=namespace):
        await create_group(cluster, PLUGINS, namespace, "sp", {"minMember": 4})
        await create_group(cluster, WORKLOAD, namespace, "kw", {"schedulingPolicy": {"gang": {"minCount": 4}}})
        await create_group(cluster, WORKLOAD, namespace, "short", {"schedulingPolicy": {"gang": {"minCount": 5}}})
        await create_group(cluster, PLUGINS, namespace, "odd", {"minMember": 1, "minTaskMember": {"worker": 1}})
        odd = pinned(hoss_pods("odd", 1, labels={"scheduling.x-k8s.io/pod-group": "odd"}), "gang-set", key)
        odd += pinned(hoss_pods("lite", 2, labels={"pod-group.scheduling.sigs.k8s.io/name": "lite"}), "gang-set", key)
        await cluster.create_pods(plugins(0, 2) + workload("kw", 0, 2) + workload("short", 0, 4) + odd,
                                  namespace=namespace)
        await hoss_had_its_turn(plane, dispatcher, [p["metadata"]["uid"] for p in
                                                    await cluster.raw_list("list_namespaced_pod", namespace)])
        await hoss_had_its_turn(plane, dispatcher, [])
        assert early == [], f"members bound before their gang was whole: {early}"
        complete.update({"sp", "kw"})
        await cluster.create_pods(plugins(2, 2) + workload("kw", 2, 2), namespace=namespace)

        async def whole() -> tuple[bool, str]:
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            bound = sorted(p["metadata"]["name"] for p in pods if p["spec"].get("nodeName"))
            return len(bound) == 8, f"bound: {bound}"

        await until(whole, timeout=120, what="the two complete gangs to bind whole")
        await hoss_had_its_turn(plane, dispatcher, [p["metadata"]["uid"] for p in
                                                    await pods_named(cluster, namespace, "short")])
        assert early == [], f"members bound before their gang was whole: {early}"
        described = plane.kubectl("describe", "pod", "short-0000", "-n", namespace)
        assert "4 of 5 required members are pending" in described, described
        reason, message = await scheduled_condition(cluster, namespace, "odd-0000")
        assert reason == "PodGroupRefused" and "spec.minTaskMember" in message, (reason, message)
        reason, message = await scheduled_condition(cluster, namespace, "lite-0000")
        assert reason == "PodGroupRefused" and "min-available is missing" in message, (reason, message)
        await check_not_oversold(cluster, namespace)


async def test_a_volcano_podgroup_made_first_goes_inqueue_so_its_job_can_make_the_pods_then_runs(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Volcano's job controller makes the PodGroup, waits until it leaves Pending (the scheduler's enqueue), and
    only then makes the job's pods. Done here by hand: the PodGroup (minMember 3) goes Inqueue with no member yet;
    the three pods made then bind whole and the group says Running with 3 running. A PodGroup on a queue hoss
    does not have stays Pending. A member of a group whose minResources asks more than its members request waits,
    the field named (hoss holds no room beyond the members' requests)."""
    key = f"{namespace}-inqueue"[:63]
    async with nodes(cluster, 1, key), workers(plane, [("gm-3", ["default"])]):
        await create_group(cluster, VOLCANO, namespace, "job-1", {"minMember": 3, "minTaskMember": {"worker": 3}})
        await create_group(cluster, VOLCANO, namespace, "job-2", {"minMember": 1, "queue": "research"})

        async def phase(name: str, wanted: str, **counts: int) -> tuple[bool, str]:
            status = (await read_group(cluster, VOLCANO, namespace, name)).get("status") or {}
            return (status.get("phase") == wanted and all(status.get(k) == v for k, v in counts.items()),
                    str(status))

        await until(lambda: phase("job-1", "Inqueue"), timeout=60, what="the accepted PodGroup to go Inqueue")
        await until(lambda: phase("job-2", "Pending"), timeout=60, what="the refused PodGroup to stay Pending")
        pods = pinned(hoss_pods("job-1-worker", 3), "gang-set", key)
        for pod in pods:
            pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "job-1", "volcano.sh/task-spec": "worker"}
        await cluster.create_pods(pods, namespace=namespace)
        await wait_all_bound(cluster, namespace, 3, timeout=90)
        await until(lambda: phase("job-1", "Running", running=3), timeout=60, what="the PodGroup to say Running")
        await create_group(cluster, VOLCANO, namespace, "job-3", {"minMember": 1, "minResources": {"cpu": "4"}})
        [lean] = pinned(hoss_pods("job-3-worker", 1), "gang-set", key)
        lean["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "job-3"}
        await cluster.create_pods([lean], namespace=namespace)

        async def lean_waits() -> tuple[bool, str]:
            reason, message = await scheduled_condition(cluster, namespace, "job-3-worker-0000")
            return reason == "PodGroupRefused" and "spec.minResources asks cpu 4" in message, f"{reason}: {message}"

        await until(lean_waits, timeout=60, what="the member short of minResources to wait, the field named")
        assert not (await cluster.core.read_namespaced_pod("job-3-worker-0000", namespace)).spec.node_name
        await check_not_oversold(cluster, namespace)


async def test_a_pending_gang_preempts_for_all_its_members_or_none_and_a_disruption_budget_holds_it_back(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Two 8-cpu nodes, each running one low-priority 6-cpu pod; the pod on one of them is under a
    PodDisruptionBudget that allows no disruption. A high-priority gang of two 6-cpu pods (scheduler-plugins
    PodGroup, minMember 2) needs both nodes: it evicts nothing while the budget stands -- evicting the free victim
    alone would help no one -- and, once the budget is deleted, evicts both and binds whole."""
    key = f"{namespace}-gangpre"[:63]
    scheduling: Any = client.SchedulingV1Api(cluster.api)
    policy: Any = client.PolicyV1Api(cluster.api)
    classes = {f"{namespace}-glow"[:63]: 10, f"{namespace}-ghigh"[:63]: 1000}
    for name, value in classes.items():
        await scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
    low, high = classes
    try:
        async with nodes(cluster, 2, key), workers(plane, [("gm-4", ["default"])]):
            victims = pinned(hoss_pods("low", 2, cpu="6"), "gang-set", key)
            for index, pod in enumerate(victims):
                pod["spec"]["priorityClassName"] = low
                pod["metadata"]["labels"] = {"app": f"low-{index}"}
            await cluster.create_pods(victims, namespace=namespace)
            placed = await wait_all_bound(cluster, namespace, 2, timeout=90)
            assert len({p["spec"]["nodeName"] for p in placed}) == 2
            await policy.create_namespaced_pod_disruption_budget(namespace, {
                "metadata": {"name": "keep-low-1"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "low-1"}}}})

            async def counted() -> tuple[bool, str]:
                budget = await policy.read_namespaced_pod_disruption_budget("keep-low-1", namespace)
                status = budget.status
                return (status is not None and status.current_healthy == 1 and status.disruptions_allowed == 0,
                        str(status))

            await until(counted, timeout=60, what="the disruption controller to count the budget")
            gang = pinned(hoss_pods("train", 2, cpu="6", labels={"scheduling.x-k8s.io/pod-group": "train"}),
                          "gang-set", key)
            for pod in gang:
                pod["spec"]["priorityClassName"] = high
            await create_group(cluster, PLUGINS, namespace, "train", {"minMember": 2})
            await cluster.create_pods(gang, namespace=namespace)

            async def held_back() -> tuple[bool, str]:
                said = [await scheduled_condition(cluster, namespace, f"train-{i:04d}") for i in range(2)]
                return all("eviction refused" in message and "nothing was" in message
                           for _reason, message in said), str(said)

            await until(held_back, timeout=120, what="the gang to say the budget refused its preemption")
            pods = {p["metadata"]["name"]: p for p in await cluster.raw_list("list_namespaced_pod", namespace)}
            assert all(not pods[n]["metadata"].get("deletionTimestamp") for n in ("low-0000", "low-0001")), \
                "a victim was evicted for a gang that could not be placed whole"
            assert not any(pods[n]["spec"].get("nodeName") for n in ("train-0000", "train-0001"))
            await policy.delete_namespaced_pod_disruption_budget("keep-low-1", namespace)

            async def whole() -> tuple[bool, str]:
                pods = {p["metadata"]["name"]: p for p in await cluster.raw_list("list_namespaced_pod", namespace)}
                low_left = [n for n in ("low-0000", "low-0001") if n in pods
                            and not pods[n]["metadata"].get("deletionTimestamp")]
                bound = [n for n in ("train-0000", "train-0001") if pods.get(n, {}).get("spec", {}).get("nodeName")]
                return not low_left and len(bound) == 2, f"low left {low_left}, gang bound {bound}"

            await until(whole, timeout=180, what="the gang to evict both victims and bind whole")
            await check_not_oversold(cluster, namespace)
    finally:
        for name in classes:
            await scheduling.delete_priority_class(name)
