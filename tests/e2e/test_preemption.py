"""Preemption end to end: four hoss workers on the real plane, ReplicaSets of low priority filling the nodes, the
plane's kube-controller-manager recreating evicted pods and keeping PodDisruptionBudgets' status.

Layout of every test (three nodes of 4 cpu, each filled by one pinned ReplicaSet):
  node a: ReplicaSet low-a, 4 pods of 1 cpu, priority 100
  node b: ReplicaSet mid-b, 4 pods of 1 cpu, priority 500
  node c: ReplicaSet low-c, 2 pods of 2 cpu, priority 100
A pod of priority 10000 wanting 2 cpu fits nowhere. By kube-scheduler's order: no budget is violated anywhere;
the lowest highest-victim priority is 100 (a and c); the smallest priority sum is c's (one victim), so c loses one
pod. With a budget protecting low-c, c would violate it, so a loses two pods instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.kube.client import list_objects, watch_objects
from hoss.model.objects import Json
from hoss.model.resources import node_allocatable, pod_requests
from tests.e2e.hoss import started_workers
from tests.waiting import until

NODE = {"cpu": "4", "memory": "16Gi", "pods": "110"}
LOW, MID, HIGH = 100, 500, 10000
_sets = itertools.count()


@pytest.fixture(scope="module")
def hoss_workers(plane: LocalPlane, dispatcher: Process) -> Iterator[list[Process]]:
    yield from started_workers(plane, "preempt", 4)


@pytest.fixture
async def layout(plane: LocalPlane, cluster: Cluster, namespace: str,
                 hoss_workers: list[Process]) -> AsyncIterator[dict[str, str]]:
    """Three nodes filled as the module docstring says; yields role (a, b, c) -> node name."""
    prefix = f"pre-{next(_sets)}"
    names = await cluster.create_nodes(3, prefix=prefix, capacity=NODE)
    await cluster.wait_nodes_ready(names)
    nodes = dict(zip("abc", names, strict=True))
    classes = {f"{namespace}-{role}": value for role, value in (("low", LOW), ("mid", MID), ("high", HIGH))}
    items: list[Json] = [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}
        for name, value in classes.items()
    ]
    items.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                  "metadata": {"name": f"{namespace}-never"}, "value": HIGH, "preemptionPolicy": "Never"})
    items += [replicaset(namespace, "low-a", nodes["a"], 4, "1", f"{namespace}-low"),
              replicaset(namespace, "mid-b", nodes["b"], 4, "1", f"{namespace}-mid"),
              replicaset(namespace, "low-c", nodes["c"], 2, "2", f"{namespace}-low")]
    apply(plane, namespace, "layout", items)
    try:
        await wait_bound(cluster, namespace, 10)
        yield nodes
    finally:
        for kind, name in (("replicaset", "low-a"), ("replicaset", "mid-b"), ("replicaset", "low-c")):
            plane.kubectl("delete", kind, name, "-n", namespace, "--ignore-not-found", "--wait=false")
        for name in [*classes, f"{namespace}-never"]:
            plane.kubectl("delete", "priorityclass", name, "--ignore-not-found", "--wait=false")
        await cluster.delete_nodes(names)


def replicaset(namespace: str, name: str, node: str, replicas: int, cpu: str, priority_class: str) -> Json:
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {**pinned_spec(node, cpu), "priorityClassName": priority_class}}},
    }


def pinned_spec(node: str | None, cpu: str) -> Json:
    spec: Json = {"schedulerName": "hoss", "terminationGracePeriodSeconds": 0,
                  "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                  "resources": {"requests": {"cpu": cpu, "memory": "100Mi"}}}]}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


def pod(name: str, *, cpu: str, node: str | None = None, priority_class: str | None = None) -> Json:
    spec = pinned_spec(node, cpu)
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}}, "spec": spec}


def apply(plane: LocalPlane, namespace: str, name: str, items: list[Json]) -> None:
    manifest = plane.directory / f"{namespace}-{name}.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    plane.kubectl("apply", "-n", namespace, "-f", str(manifest))


async def pods_by_app(cluster: Cluster, namespace: str) -> dict[str, list[Json]]:
    result: dict[str, list[Json]] = {}
    for item in await cluster.raw_list("list_namespaced_pod", namespace):
        result.setdefault(item["metadata"]["labels"].get("app", ""), []).append(item)
    return result


async def wait_bound(cluster: Cluster, namespace: str, count: int) -> None:
    async def bound() -> tuple[bool, str]:
        pods = await cluster.raw_list("list_namespaced_pod", namespace)
        done = sum(1 for p in pods if p["spec"].get("nodeName"))
        return done >= count, f"{done}/{count} bound"

    await until(bound, timeout=120, what=f"{count} pods bound")


async def reasons(cluster: Cluster, namespace: str, reason: str) -> list[Any]:
    events = await cluster.core.list_namespaced_event(namespace, field_selector=f"reason={reason}")
    return list(events.items)


async def event_for(cluster: Cluster, namespace: str, name: str, reason: str, text: str) -> str:
    async def seen() -> tuple[bool, str]:
        messages = [e.message for e in await cluster.events_for(namespace, name) if e.reason == reason]
        return any(text in m for m in messages), f"{reason} events of {name}: {messages}"

    return await until(seen, timeout=60, what=f"a {reason} event of {name} saying {text!r}")


async def record_nominations(cluster: Cluster, namespace: str, name: str, seen: list[str]) -> None:
    """Append every status.nominatedNodeName the pod shows (the apiserver clears it when the pod binds)."""
    selector = f"metadata.name={name}"
    _items, version = await list_objects(cluster.core.list_namespaced_pod, namespace=namespace,
                                         field_selector=selector)
    async for _kind, obj in watch_objects(cluster.core.list_namespaced_pod, resource_version=version,
                                          namespace=namespace, field_selector=selector):
        node = (obj.get("status") or {}).get("nominatedNodeName")
        if node and (not seen or seen[-1] != node):
            seen.append(node)


async def assert_nothing_oversold_and_nothing_schedulable_pending(cluster: Cluster, namespace: str) -> None:
    """The independent check from apiserver objects: no node oversold, and every pod still Pending has a
    FailedScheduling event and truly fits on none of the nodes its nodeSelector allows."""
    nodes = await cluster.raw_list("list_node")
    pods = await cluster.raw_list("list_pod_for_all_namespaces")
    assert oversold_nodes(nodes, pods) == {}
    used: dict[str, dict[str, int]] = {}
    for item in pods:
        node = item["spec"].get("nodeName")
        if node and item["status"].get("phase") not in ("Succeeded", "Failed"):
            for resource, amount in pod_requests(item).items():
                used.setdefault(node, {})[resource] = used.setdefault(node, {}).get(resource, 0) + amount
    for item in pods:
        if item["metadata"]["namespace"] != namespace or item["spec"].get("nodeName"):
            continue
        name = item["metadata"]["name"]
        selector = item["spec"].get("nodeSelector") or {}
        allowed = [n for n in nodes if all(n["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        request = pod_requests(item)
        fits = [n["metadata"]["name"] for n in allowed
                if all(amount <= node_allocatable(n).get(r, 0) - used.get(n["metadata"]["name"], {}).get(r, 0)
                       for r, amount in request.items())]
        assert fits == [], f"pending pod {name} fits on {fits}"
        await event_for(cluster, namespace, name, "FailedScheduling", "nodes are available")


async def test_a_high_priority_pod_preempts_the_fewest_lowest_priority_pods_holds_the_room_and_binds(
    plane: LocalPlane, cluster: Cluster, namespace: str, layout: dict[str, str]
) -> None:
    before = await pods_by_app(cluster, namespace)
    # Two pods of priority 0 that want c's room too: they must not take the room freed for the preemptor.
    await cluster.create_pods([pod(f"rival-{i}", cpu="2", node=layout["c"]) for i in range(2)], namespace=namespace)
    await event_for(cluster, namespace, "rival-0", "FailedScheduling", "nodes are available")
    nominated: list[str] = []
    watching = asyncio.create_task(record_nominations(cluster, namespace, "urgent", nominated))
    await cluster.create_pods([pod("urgent", cpu="2", priority_class=f"{namespace}-high")], namespace=namespace)

    async def urgent_bound() -> tuple[bool, str]:
        urgent = await cluster.core.read_namespaced_pod("urgent", namespace)
        seen = f"node={urgent.spec.node_name} nominated={urgent.status.nominated_node_name}"
        return bool(urgent.spec.node_name), seen

    try:
        await until(urgent_bound, timeout=90, what="the preemptor to be bound")
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    urgent = await cluster.core.read_namespaced_pod("urgent", namespace)
    assert urgent.spec.priority == HIGH  # the Priority admission plugin resolved the class
    assert urgent.spec.node_name == layout["c"]
    assert nominated == [layout["c"]]  # set while its victim left (cleared by the apiserver at binding)
    await event_for(cluster, namespace, "urgent", "FailedScheduling", f"preemption: in progress on node {layout['c']}")

    preempted = await reasons(cluster, namespace, "Preempted")
    assert [e.message for e in preempted] == [f"Preempted by {namespace}/urgent on node {layout['c']}"]
    victim = preempted[0].involved_object.name
    assert victim in {p["metadata"]["name"] for p in before["low-c"]}

    after = await pods_by_app(cluster, namespace)
    uids = {app: {p["metadata"]["uid"] for p in pods} for app, pods in after.items()}
    assert uids["low-a"] == {p["metadata"]["uid"] for p in before["low-a"]}
    assert uids["mid-b"] == {p["metadata"]["uid"] for p in before["mid-b"]}

    async def recreated() -> tuple[bool, str]:
        pods = (await pods_by_app(cluster, namespace)).get("low-c", [])
        names = {p["metadata"]["name"] for p in pods}
        return len(pods) == 2 and victim not in names, f"low-c pods {sorted(names)}"

    await until(recreated, timeout=60, what="the ReplicaSet to recreate its evicted pod")
    replacement = next(p for p in (await pods_by_app(cluster, namespace))["low-c"]
                       if p["metadata"]["name"] not in {q["metadata"]["name"] for q in before["low-c"]})
    assert not replacement["spec"].get("nodeName")
    await event_for(cluster, namespace, replacement["metadata"]["name"], "FailedScheduling", "nodes are available")
    rivals = [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
              if p["metadata"]["name"].startswith("rival-")]
    assert [p["spec"].get("nodeName") for p in rivals] == [None, None]
    await assert_nothing_oversold_and_nothing_schedulable_pending(cluster, namespace)


async def test_a_disruption_budget_sends_the_preemptor_to_a_node_where_no_budget_is_violated(
    plane: LocalPlane, cluster: Cluster, namespace: str, layout: dict[str, str]
) -> None:
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "low-c"},
              "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "low-c"}}}}
    apply(plane, namespace, "budget", [budget])

    async def counted() -> tuple[bool, str]:
        status = json.loads(plane.kubectl("get", "pdb", "low-c", "-n", namespace, "-o", "json")).get("status") or {}
        return status.get("currentHealthy") == 2 and status.get("disruptionsAllowed") == 0, str(status)

    await until(counted, timeout=60, what="the disruption controller to count low-c's budget")
    before = await pods_by_app(cluster, namespace)
    await cluster.create_pods([pod("urgent", cpu="2", priority_class=f"{namespace}-high")], namespace=namespace)

    async def urgent_bound() -> tuple[bool, str]:
        urgent = await cluster.core.read_namespaced_pod("urgent", namespace)
        return bool(urgent.spec.node_name), f"node={urgent.spec.node_name}"

    await until(urgent_bound, timeout=90, what="the preemptor to be bound")
    urgent = await cluster.core.read_namespaced_pod("urgent", namespace)
    assert urgent.spec.node_name == layout["a"]
    preempted = await reasons(cluster, namespace, "Preempted")
    victims = {e.involved_object.name for e in preempted}
    assert len(victims) == 2 and victims <= {p["metadata"]["name"] for p in before["low-a"]}
    after = await pods_by_app(cluster, namespace)
    assert {p["metadata"]["uid"] for p in after["low-c"]} == {p["metadata"]["uid"] for p in before["low-c"]}
    await assert_nothing_oversold_and_nothing_schedulable_pending(cluster, namespace)


async def test_a_pod_whose_preemption_policy_is_never_waits_and_evicts_nothing(
    plane: LocalPlane, cluster: Cluster, namespace: str, layout: dict[str, str]
) -> None:
    before = await pods_by_app(cluster, namespace)
    await cluster.create_pods([pod("patient", cpu="2", priority_class=f"{namespace}-never")], namespace=namespace)
    await event_for(cluster, namespace, "patient", "FailedScheduling", "preemptionPolicy=Never")
    patient = await cluster.core.read_namespaced_pod("patient", namespace)
    assert patient.spec.preemption_policy == "Never" and patient.spec.priority == HIGH
    assert not patient.spec.node_name and not patient.status.nominated_node_name
    assert await reasons(cluster, namespace, "Preempted") == []
    after = await pods_by_app(cluster, namespace)
    assert {a: {p["metadata"]["uid"] for p in ps} for a, ps in after.items() if a != "patient"} == \
        {a: {p["metadata"]["uid"] for p in ps} for a, ps in before.items()}
    await assert_nothing_oversold_and_nothing_schedulable_pending(cluster, namespace)


async def test_when_every_choice_would_break_a_budget_the_eviction_is_refused_and_the_preemptor_waits(
    plane: LocalPlane, cluster: Cluster, namespace: str, layout: dict[str, str]
) -> None:
    budgets = [{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": app},
                "spec": {"minAvailable": count, "selector": {"matchLabels": {"app": app}}}}
               for app, count in (("low-a", 4), ("mid-b", 4), ("low-c", 2))]
    apply(plane, namespace, "budgets", budgets)

    async def counted() -> tuple[bool, str]:
        listed = json.loads(plane.kubectl("get", "pdb", "-n", namespace, "-o", "json"))["items"]
        statuses = {item["metadata"]["name"]: item.get("status") or {} for item in listed}
        done = len(statuses) == 3 and all(s.get("currentHealthy") == s.get("desiredHealthy")
                                          and s.get("disruptionsAllowed") == 0 for s in statuses.values())
        return done, str(statuses)

    await until(counted, timeout=60, what="the disruption controller to count the three budgets")
    before = await pods_by_app(cluster, namespace)
    await cluster.create_pods([pod("urgent", cpu="2", priority_class=f"{namespace}-high")], namespace=namespace)
    # Fewest violations: c (one victim, one violation); the Eviction API refuses it (429), so nothing is evicted.
    await event_for(cluster, namespace, "urgent", "FailedScheduling",
                    f"preemption: eviction on node {layout['c']} refused")
    urgent = await cluster.core.read_namespaced_pod("urgent", namespace)
    assert not urgent.spec.node_name and not urgent.status.nominated_node_name
    assert await reasons(cluster, namespace, "Preempted") == []
    after = await pods_by_app(cluster, namespace)
    assert {a: {p["metadata"]["uid"] for p in ps} for a, ps in after.items() if a != "urgent"} == \
        {a: {p["metadata"]["uid"] for p in ps} for a, ps in before.items()}
    await assert_nothing_oversold_and_nothing_schedulable_pending(cluster, namespace)
