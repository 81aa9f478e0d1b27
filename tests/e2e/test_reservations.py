"""Reservations and job dependencies on the real plane (issue 15): the node reservation annotation takes room
from hoss and kube-scheduler pods alike; a Reservation holds room a foreign kube-scheduler pod cannot take and its
owner consumes; a Job that depends on another starts only after it completes.

One hoss worker for the module; every test has nodes of its own, selected by a label, so other tests' nodes and
pods do not interfere."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from hoss.model.resources import NODE_RESERVATION_ANNOTATION, pod_requests
from tests.e2e.hoss import grows, hoss_had_its_turn, kube_scheduler_attempts, worker_tries_again
from tests.waiting import until

_names = itertools.count()


@pytest.fixture(scope="module")
def hoss_worker(plane: LocalPlane, dispatcher: Process) -> Iterator[Process]:
    process = plane.start_worker("reserve-0")
    try:
        yield process
    finally:
        plane.stop_process(process.name)


def pinned(name: str, pool: str, *, cpu: str, scheduler: str = "hoss", extra: dict[str, str] | None = None) -> Json:
    pod = pod_manifest(name, requests={"cpu": cpu, "memory": "100Mi", **(extra or {})}, scheduler_name=scheduler)
    if extra:
        pod["spec"]["containers"][0]["resources"]["limits"] = dict(extra)
    pod["spec"]["nodeSelector"] = {"e2e.hoss.io/pool": pool}
    return pod


async def bound_cpu(cluster: Cluster, namespace: str) -> tuple[int, list[str]]:
    pods = await cluster.raw_list("list_namespaced_pod", namespace)
    on = [p for p in pods if p["spec"].get("nodeName")]
    return sum(pod_requests(p).get("cpu", 0) for p in on), sorted(p["metadata"]["name"] for p in on)


async def test_a_node_reservation_annotation_takes_room_from_hoss_and_kube_scheduler_pods(
    plane: LocalPlane, cluster: Cluster, namespace: str, hoss_worker: Process
) -> None:
    pool = f"nres-{next(_names)}-{namespace}"[:60]
    [node] = await cluster.create_nodes(1, prefix=pool[:50], capacity={"cpu": "8", "memory": "16Gi", "pods": "110"},
                                        labels={"e2e.hoss.io/pool": pool})
    try:
        await cluster.wait_nodes_ready([node])
        await asyncio.to_thread(plane.kubectl, "annotate", "node", node,
                                f'{NODE_RESERVATION_ANNOTATION}={{"resources":{{"cpu":"5"}}}}')
        # 8 cpu, 5 kept back: a 4-cpu kube-scheduler pod is refused by the webhook (kube-scheduler does not know
        # the annotation, the ledger does), and hoss binds three of four 1-cpu pods.
        await cluster.create_pods([pinned("kube-4cpu", pool, cpu="4", scheduler="default-scheduler")],
                                  namespace=namespace)

        async def denied() -> tuple[bool, str]:
            messages = [e.message or "" for e in await cluster.events_for(namespace, "kube-4cpu")]
            return any("hoss: node" in m and "free 3" in m for m in messages), str(messages[-2:])

        await until(denied, timeout=90, what="the webhook to refuse the kube-scheduler pod")
        await cluster.create_pods([pinned(f"hoss-{i}", pool, cpu="1") for i in range(4)], namespace=namespace)

        # Which hoss pod waits depends on order; three are bound and the fourth is told why.
        async def three_any() -> tuple[bool, str]:
            cpu, names = await bound_cpu(cluster, namespace)
            return cpu == 3000 and len(names) == 3 and "kube-4cpu" not in names, f"{cpu} {names}"

        await until(three_any, timeout=90, what="three hoss pods bound in the 3 cpu left")
        # Both schedulers try again: the worker the fourth hoss pod (it finds no room), kube-scheduler the 4-cpu pod
        # (it sees 5 cpu free, not knowing the annotation, and the webhook refuses the binding).
        await asyncio.gather(worker_tries_again(hoss_worker),
                             grows(lambda: kube_scheduler_attempts(plane), 1,
                                   what="kube-scheduler to try its pod again"))
        assert (await bound_cpu(cluster, namespace))[0] == 3000, "nothing more fits beside the reservation"

        # A malformed value: a Warning event on the node names it, the annotation is ignored, the room comes back.
        await asyncio.to_thread(plane.kubectl, "annotate", "--overwrite", "node", node,
                                f"{NODE_RESERVATION_ANNOTATION}=cpu=5")

        async def warned() -> tuple[bool, str]:
            events = await cluster.raw_list("list_namespaced_event", "default",
                                            field_selector=f"involvedObject.name={node}")
            found = [e["message"] for e in events if e.get("reason") == "InvalidNodeReservation"]
            return bool(found) and "'cpu=5'" in found[0], str(found)

        await until(warned, timeout=60, what="a Warning event naming the malformed annotation")

        async def all_bound() -> tuple[bool, str]:
            cpu, names = await bound_cpu(cluster, namespace)
            return cpu == 8000, f"{cpu} {names}"

        await until(all_bound, timeout=120, what="the kube-scheduler pod and the fourth hoss pod to bind")
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


def reservation(name: str, pool: str, *, gpus: str, owner_label: str, ttl: str = "10m", cpu: str = "1",
                allocate_once: bool = True) -> Json:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation", "metadata": {"name": name},
        "spec": {
            "template": {"metadata": {"namespace": "default"}, "spec": {
                "nodeSelector": {"e2e.hoss.io/pool": pool},
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {
                    "requests": {"cpu": cpu, "nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}}]}},
            "owners": [{"labelSelector": {"matchLabels": {"app": owner_label}}}],
            "ttl": ttl,
            "allocateOnce": allocate_once,
        },
    }


async def reservation_status(cluster: Cluster, name: str) -> Json:
    custom: Any = client.CustomObjectsApi(cluster.api)
    found = await custom.get_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations", name)
    return dict(found.get("status") or {})


@contextlib.asynccontextmanager
async def reserved_gpu_node(cluster: Cluster, namespace: str, prefix: str, name: str, ttl: str = "10m",
                            **options: Any) -> AsyncIterator[tuple[str, str, Any]]:
    """A 4-GPU node of a pool of its own and a Reservation `name` of its 4 GPUs for pods labelled app=`name`;
    yields (pool, node, CustomObjectsApi). Afterwards the namespace's pods, the Reservations named `name` and
    `name`-big, and the node are deleted."""
    pool = f"{prefix}-{next(_names)}-{namespace}"[:60]
    [node] = await cluster.create_nodes(1, prefix=pool[:50], capacity={"cpu": "8", "memory": "16Gi", "pods": "110",
                                                                       "nvidia.com/gpu": "4"},
                                        labels={"e2e.hoss.io/pool": pool})
    custom: Any = client.CustomObjectsApi(cluster.api)
    try:
        await cluster.wait_nodes_ready([node])
        await custom.create_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations",
                                                  reservation(name, pool, gpus="4", owner_label=name, ttl=ttl,
                                                              **options))
        yield pool, node, custom
    finally:
        await cluster.delete_pods(namespace)
        for each in (name, f"{name}-big"[:60]):
            with contextlib.suppress(Exception):
                await custom.delete_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations",
                                                          each)
        await cluster.delete_nodes([node])


async def test_a_reservation_holds_room_a_kube_scheduler_pod_cannot_take_and_its_owner_uses(
    plane: LocalPlane, cluster: Cluster, namespace: str, hoss_worker: Process
) -> None:
    name = f"train-{namespace}"[:60]
    async with reserved_gpu_node(cluster, namespace, "rsv", name) as (pool, node, _custom):
        async def available() -> tuple[bool, str]:
            status = await reservation_status(cluster, name)
            return status.get("phase") == "Available" and status.get("nodeName") == node, str(status)

        await until(available, timeout=90, what="hoss to place the Reservation")
        # kube-scheduler sees 4 free GPUs (it knows no Reservation); the resolver refuses its binding.
        await cluster.create_pods([pinned("kube-gpu", pool, cpu="1", scheduler="default-scheduler",
                                          extra={"nvidia.com/gpu": "2"})], namespace=namespace)

        async def refused() -> tuple[bool, str]:
            messages = [e.message or "" for e in await cluster.events_for(namespace, "kube-gpu")]
            return any("hoss: node" in m and "nvidia.com/gpu" in m for m in messages), str(messages[-2:])

        await until(refused, timeout=90, what="the resolver to refuse the kube-scheduler pod")
        owner = pinned("owner", pool, cpu="1", extra={"nvidia.com/gpu": "4"})
        owner["metadata"]["labels"] = {"app": name}
        await cluster.create_pods([owner], namespace=namespace)

        async def used() -> tuple[bool, str]:
            status = await reservation_status(cluster, name)
            _cpu, names = await bound_cpu(cluster, namespace)
            owners = [o.get("name") for o in status.get("currentOwners") or []]
            return status.get("phase") == "Succeeded" and owners == ["owner"] and names == ["owner"], \
                f"{status.get('phase')} {owners} bound {names}"

        await until(used, timeout=90, what="the owner pod to take the Reservation's room")
        pods = {p["metadata"]["name"]: p for p in await cluster.raw_list("list_namespaced_pod", namespace)}
        assert pods["owner"]["spec"]["nodeName"] == node
        assert not pods["kube-gpu"]["spec"].get("nodeName"), "the GPUs went to the owner, none is left"


def owner_pod(name: str, pool: str, reservation_name: str, *, gpus: str) -> Json:
    pod = pinned(name, pool, cpu="1", extra={"nvidia.com/gpu": gpus})
    pod["metadata"]["labels"] = {"app": reservation_name}
    return pod


async def test_a_shared_reservation_serves_owners_while_they_fit_and_takes_back_what_one_leaves(
    plane: LocalPlane, cluster: Cluster, namespace: str, hoss_worker: Process
) -> None:
    """allocateOnce false: a Reservation of 4 GPUs (and 2 cpu) on a 4-GPU node; two 2-GPU owners both land on its
    node and its status lists both with 4 GPUs allocated; a third owner finds no room (the node has no GPU beyond
    the Reservation's) and waits, saying why; once an owner is deleted its share is the Reservation's again and
    the waiting owner takes it."""
    name = f"shared-{namespace}"[:60]
    async with reserved_gpu_node(cluster, namespace, "rss", name, cpu="2", allocate_once=False) as (pool, node, _):
        async def available() -> tuple[bool, str]:
            status = await reservation_status(cluster, name)
            return status.get("phase") == "Available" and status.get("nodeName") == node, str(status)

        await until(available, timeout=90, what="hoss to place the Reservation")
        await cluster.create_pods([owner_pod(each, pool, name, gpus="2") for each in ("a", "b")],
                                  namespace=namespace)

        async def owned_by(names: list[str]) -> tuple[bool, str]:
            status = await reservation_status(cluster, name)
            owners = sorted(o.get("name") for o in status.get("currentOwners") or [])
            allocated = status.get("allocated") or {}
            _cpu, bound = await bound_cpu(cluster, namespace)
            return (status.get("phase") == "Available" and owners == names and bound == names
                    and allocated.get("nvidia.com/gpu") == str(2 * len(names))
                    and allocated.get("cpu") == str(len(names))), f"{status} bound {bound}"

        await until(lambda: owned_by(["a", "b"]), timeout=90, what="both owners to share the Reservation")
        pods = {p["metadata"]["name"]: p for p in await cluster.raw_list("list_namespaced_pod", namespace)}
        assert pods["a"]["spec"]["nodeName"] == node and pods["b"]["spec"]["nodeName"] == node
        assert (await reservation_status(cluster, name))["allocatable"]["nvidia.com/gpu"] == "4"
        await cluster.create_pods([owner_pod("c", pool, name, gpus="2")], namespace=namespace)

        async def told() -> tuple[bool, str]:
            messages = [e.message or "" for e in await cluster.events_for(namespace, "c")]
            return any("Insufficient nvidia.com/gpu" in m for m in messages), str(messages[-2:])

        await until(told, timeout=90, what="the third owner to wait for GPUs")
        assert "c" not in (await bound_cpu(cluster, namespace))[1]
        await client.CoreV1Api(cluster.api).delete_namespaced_pod("a", namespace, grace_period_seconds=0)
        await until(lambda: owned_by(["b", "c"]), timeout=90,
                    what="the deleted owner's share to go back to the Reservation and to the waiting owner")


async def test_a_reservation_no_worker_serves_says_so(plane: LocalPlane, cluster: Cluster, namespace: str,
                                                      dispatcher: Process) -> None:
    """Its template's policy has no live worker: a Warning event NoWorkerForPolicy on the Reservation and a
    Scheduled=False condition saying so, as a pod gets (kubectl get events -n default)."""
    name = f"orphan-{namespace}"[:60]
    body = reservation(name, "nowhere", gpus="1", owner_label=name)
    body["spec"]["template"]["metadata"]["labels"] = {"hoss.io/policy": "nobody-serves-this"}
    custom: Any = client.CustomObjectsApi(cluster.api)
    await custom.create_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations", body)
    try:
        async def told() -> tuple[bool, str]:
            status = await reservation_status(cluster, name)
            conditions = [c for c in status.get("conditions") or [] if c.get("reason") == "NoWorkerForPolicy"]
            events = await cluster.core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={name},involvedObject.kind=Reservation")
            reasons = [(e.type, e.reason) for e in events.items]
            return (status.get("phase") == "Pending" and bool(conditions)
                    and "no live hoss worker serves policy 'nobody-serves-this'" in conditions[0]["message"]
                    and ("Warning", "NoWorkerForPolicy") in reasons), f"{status} {reasons}"

        await until(told, timeout=60, what="the Reservation to be told no worker serves its policy")
    finally:
        await custom.delete_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations", name)


async def test_an_expired_reservation_fails_and_frees_its_room_and_one_that_fits_nowhere_says_why(
    plane: LocalPlane, cluster: Cluster, namespace: str, hoss_worker: Process
) -> None:
    name = f"brief-{namespace}"[:60]
    async with reserved_gpu_node(cluster, namespace, "rsx", name, ttl="5s") as (pool, _node, custom):
        async def phase(wanted: str) -> tuple[bool, str]:
            status = await reservation_status(cluster, name)
            return status.get("phase") == wanted, str(status)

        await until(lambda: phase("Available"), timeout=60, what="hoss to place the Reservation")
        # One that fits nowhere stays Pending and says why, as a pod would.
        await custom.create_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations",
                                                  reservation(f"{name}-big"[:60], pool, gpus="8", owner_label=name))

        async def told() -> tuple[bool, str]:
            status = await reservation_status(cluster, f"{name}-big"[:60])
            conditions = [c for c in status.get("conditions") or [] if c.get("type") == "Scheduled"]
            return (status.get("phase") == "Pending" and bool(conditions) and conditions[0]["status"] == "False"
                    and "Insufficient nvidia.com/gpu" in conditions[0]["message"]), str(status)

        await until(told, timeout=60, what="the oversized Reservation to say why it is not placed")
        await until(lambda: phase("Failed"), timeout=60, what="the Reservation to expire")
        reasons = [c.get("reason") for c in (await reservation_status(cluster, name)).get("conditions") or []]
        assert "Expired" in reasons
        # Its room is free again: a kube-scheduler pod takes all 4 GPUs.
        await cluster.create_pods([pinned("kube-gpu", pool, cpu="1", scheduler="default-scheduler",
                                          extra={"nvidia.com/gpu": "4"})], namespace=namespace)
        await until(lambda: _bound(cluster, namespace, "kube-gpu"), timeout=90,
                    what="the kube-scheduler pod to bind in the freed room")


async def _bound(cluster: Cluster, namespace: str, name: str) -> tuple[bool, str]:
    _cpu, names = await bound_cpu(cluster, namespace)
    return name in names, str(names)


def job(name: str, pool: str, *, depends_on: str | None = None) -> Json:
    template = pinned(name, pool, cpu="1")
    template["metadata"] = {"labels": {"e2e.hoss.io/job": name}}
    if depends_on is not None:
        template["metadata"]["annotations"] = {"hoss.io/depends-on": depends_on}
    template["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completions": 1, "parallelism": 1, "backoffLimit": 0, "template": template}}


async def job_pods(cluster: Cluster, namespace: str, name: str) -> list[Json]:
    return await cluster.raw_list("list_namespaced_pod", namespace, label_selector=f"e2e.hoss.io/job={name}")


async def finish_job_pod(cluster: Cluster, namespace: str, name: str, *, exit_code: int) -> None:
    """No kubelet here: end the Job's (only) pod by hand, as its container exiting with `exit_code` would."""
    [pod] = await job_pods(cluster, namespace, name)
    await cluster.call(cluster.core.patch_namespaced_pod_status, pod["metadata"]["name"], namespace,
                       {"status": {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": [{
                           "name": "main", "image": "registry.k8s.io/pause:3.10", "imageID": "", "ready": False,
                           "restartCount": 0, "state": {"terminated": {
                               "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}}}]}})


@contextlib.asynccontextmanager
async def job_pool(cluster: Cluster, namespace: str, pool: str, *jobs: Json) -> AsyncIterator[Any]:
    """A node of `pool`, and `jobs` (pinned to the pool) created; yields the BatchV1Api; all removed afterwards."""
    [node] = await cluster.create_nodes(1, prefix=pool[:50], capacity={"cpu": "8", "memory": "16Gi", "pods": "110"},
                                        labels={"e2e.hoss.io/pool": pool})
    batch: Any = client.BatchV1Api(cluster.api)
    try:
        await cluster.wait_nodes_ready([node])
        for manifest in jobs:
            await batch.create_namespaced_job(namespace, manifest)
        yield batch
    finally:
        for manifest in jobs:
            with contextlib.suppress(Exception):
                await batch.delete_namespaced_job(manifest["metadata"]["name"], namespace,
                                                  propagation_policy="Background")
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


async def test_a_job_that_depends_on_another_starts_only_after_it_completes(
    plane: LocalPlane, cluster: Cluster, namespace: str, dispatcher: Process, hoss_worker: Process
) -> None:
    pool = f"dep-{next(_names)}-{namespace}"[:60]
    async with job_pool(cluster, namespace, pool, job("step1", pool), job("step2", pool, depends_on="step1:Complete"),
                        job("loop-a", pool, depends_on="loop-b"),
                        job("loop-b", pool, depends_on="loop-a:Running")) as batch:

        async def waiting() -> tuple[bool, str]:
            first = [p for p in await job_pods(cluster, namespace, "step1") if p["spec"].get("nodeName")]
            second = await job_pods(cluster, namespace, "step2")
            if not first or not second:
                return False, f"step1 bound {len(first)}, step2 pods {len(second)}"
            conditions = [c for c in (second[0].get("status") or {}).get("conditions") or []
                          if c.get("type") == "PodScheduled"]
            events = [e.message or "" for e in await cluster.events_for(namespace, second[0]["metadata"]["name"])]
            ok = (not second[0]["spec"].get("nodeName") and bool(conditions)
                  and conditions[0].get("reason") == "WaitingForDependency"
                  and any("waiting for job step1 to be Complete" in m for m in events))
            return ok, f"{conditions} {events[-1:]}"

        await until(waiting, timeout=90, what="step1 to run and step2 to wait for it, saying so")

        async def cycle_refused() -> tuple[bool, str]:
            messages = [e.message or "" for name in ("loop-a", "loop-b")
                        for pod in await job_pods(cluster, namespace, name)
                        for e in await cluster.events_for(namespace, pod["metadata"]["name"])]
            return (sum("dependency cycle: job loop-" in m for m in messages) >= 2), str(messages[-2:])

        await until(cycle_refused, timeout=60, what="both pods of the cycle to be told about it")
        step2 = [p["metadata"]["uid"] for p in await job_pods(cluster, namespace, "step2")]
        await hoss_had_its_turn(plane, dispatcher, step2)
        assert not [p for p in await job_pods(cluster, namespace, "step2") if p["spec"].get("nodeName")]

        await finish_job_pod(cluster, namespace, "step1", exit_code=0)

        async def second_runs() -> tuple[bool, str]:
            done = await batch.read_namespaced_job_status("step1", namespace)
            complete = any(c.type == "Complete" and c.status == "True" for c in done.status.conditions or [])
            second = [p for p in await job_pods(cluster, namespace, "step2") if p["spec"].get("nodeName")]
            return complete and bool(second), f"step1 complete {complete}, step2 bound {len(second)}"

        await until(second_runs, timeout=120, what="step2 to be scheduled once step1 completed")
        loops = [p for name in ("loop-a", "loop-b") for p in await job_pods(cluster, namespace, name)]
        assert loops and not any(p["spec"].get("nodeName") for p in loops)


async def test_a_job_whose_dependency_failed_fails_and_its_job_counts_it(
    plane: LocalPlane, cluster: Cluster, namespace: str, hoss_worker: Process
) -> None:
    pool = f"dep-{next(_names)}-{namespace}"[:60]
    async with job_pool(cluster, namespace, pool, job("first", pool),
                        job("second", pool, depends_on="first:Complete")) as batch:

        async def first_bound() -> tuple[bool, str]:
            first = [p for p in await job_pods(cluster, namespace, "first") if p["spec"].get("nodeName")]
            second = await job_pods(cluster, namespace, "second")
            return bool(first) and bool(second), f"first bound {len(first)}, second pods {len(second)}"

        await until(first_bound, timeout=90, what="job first's pod bound, job second's pod created")
        await finish_job_pod(cluster, namespace, "first", exit_code=1)  # backoffLimit 0: the Job fails

        async def second_failed() -> tuple[bool, str]:
            pods = await job_pods(cluster, namespace, "second")
            status = (pods[0].get("status") or {}) if pods else {}
            events = [e for e in await cluster.events_for(namespace, pods[0]["metadata"]["name"])] if pods else []
            told = [e for e in events if e.reason == "DependencyFailed" and e.type == "Warning"]
            done = await batch.read_namespaced_job_status("second", namespace)
            job_failed = [c for c in done.status.conditions or [] if c.type == "Failed" and c.status == "True"]
            ok = (status.get("phase") == "Failed" and status.get("reason") == "DependencyFailed"
                  and "job first failed (condition Failed: BackoffLimitExceeded" in (status.get("message") or "")
                  and bool(told) and bool(job_failed) and (done.status.failed or 0) >= 1)
            return ok, f"{status.get('phase')} {status.get('reason')} {status.get('message')}; events " \
                       f"{[e.reason for e in events]}; job second failed {done.status.failed}, {job_failed}"

        await until(second_failed, timeout=120, what="second's pod Failed (DependencyFailed), its Job failed")
        pods = await job_pods(cluster, namespace, "second")
        assert len(pods) == 1 and not pods[0]["spec"].get("nodeName")  # backoffLimit 0: no new pod, never bound
        assert "so first:Complete can never hold" in pods[0]["status"]["message"]
