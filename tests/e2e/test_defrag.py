"""The GPU defragmenting rescheduler on the real plane: the example of issue 15, with a dry run first.

node1 runs ReplicaSet A's pod (4 GPUs) and B's (3 GPUs) of 8; node2 is empty; ReplicaSet C's pod (4 GPUs) is
created with the hoss.io/defragment scheduling gate. `hoss reschedule --dry-run` prints the plan (B to node2, C on
node1) and changes nothing. hoss-rescheduler then holds node2's room for B's replacement and node1's for C, evicts
B, releases C's gate: node1 ends full (A and C), node2 holds B's replacement, every ReplicaSet has its pod, and the
independent oversell check (the apiserver's pods against the nodes' allocatable) is polled the whole time.

Without the gate, C is placed on node2 at once (1 + 4 GPUs stranded); the periodic pass then consolidates with its
smallest plan (A moves beside C), the dry run printing that plan first.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

import aiohttp
import pytest

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.browser import Page
from tests.e2e.devices import allocated, device_objects, gpu, request
from tests.e2e.hoss import hoss_had_its_turn, pods_watched
from tests.waiting import until

GPU = "nvidia.com/gpu"
NODE = {"cpu": "32", "memory": "128Gi", "pods": "110", GPU: "8"}
_sets = itertools.count()


@pytest.fixture(scope="module")
def gpu_worker(plane: LocalPlane, dispatcher: Process) -> Iterator[None]:
    process = plane.start_worker("defrag-1", policies=["gpu"])
    try:
        yield
    finally:
        plane.stop_process(process.name)


def replicaset(name: str, gpus: int, key: str, *, gated: bool = False) -> Json:
    spec: Json = {
        "schedulerName": "hoss", "terminationGracePeriodSeconds": 0,
        "tolerations": [{"key": key, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi", GPU: str(gpus)},
                                      "limits": {GPU: str(gpus)}}}],
    }
    if gated:
        spec["schedulingGates"] = [{"name": "hoss.io/defragment"}]
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, "hoss.io/policy": "gpu"}}, "spec": spec}}}


def apply(plane: LocalPlane, namespace: str, items: list[Json]) -> None:
    manifest = plane.directory / f"{namespace}-defrag.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    plane.kubectl("apply", "-n", namespace, "-f", str(manifest))


async def placement(cluster: Cluster, namespace: str) -> dict[str, tuple[str, str]]:
    """app -> (node, uid) of each pod not being deleted."""
    return {p["metadata"]["labels"]["app"]: (p["spec"].get("nodeName") or "", p["metadata"]["uid"])
            for p in await cluster.raw_list("list_namespaced_pod", namespace)
            if not p["metadata"].get("deletionTimestamp")}


def placed(cluster: Cluster, namespace: str, **where: str) -> Callable[[], Awaitable[tuple[bool, str]]]:
    """An until check: exactly these apps have a pod (not being deleted), each on the node given."""
    async def check() -> tuple[bool, str]:
        seen = await placement(cluster, namespace)
        return {app: node for app, (node, _uid) in seen.items()} == where, str(seen)
    return check


async def status_of(port: int) -> Json:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/status") as response:
        body: Json = await response.json()
    return body


def plan_completed(port: int) -> Callable[[], Awaitable[tuple[bool, str]]]:
    """An until check: the last plan in the rescheduler's /status completed."""
    async def check() -> tuple[bool, str]:
        plans = (await status_of(port)).get("plans") or []
        return bool(plans) and plans[0]["outcome"] == "completed", str(plans[:1])
    return check


@contextlib.asynccontextmanager
async def oversell_watch(cluster: Cluster) -> AsyncIterator[list[int]]:
    """The independent oversell check on every state the pods pass through while the body runs (a watch of every
    pod, from a first list before anything moves), and once more from fresh lists once all is over; yields the list
    of checks made (the number of oversold nodes each found: the test fails at the end if one found any)."""
    checks: list[int] = []
    found: list[dict[str, str]] = []

    dra = await cluster.dra_resources()  # extended resources DeviceClasses serve: their devices are claims'

    def check(nodes: Iterable[Json], pods: Iterable[Json]) -> None:
        oversold = oversold_nodes(nodes, pods, dra=dra)
        checks.append(len(oversold))
        if oversold:
            found.append(oversold)

    nodes = await cluster.raw_list("list_node")  # the test's nodes are all there before anything moves
    async with pods_watched(cluster, lambda pods: check(nodes, pods.values())):
        yield checks
    check(await cluster.raw_list("list_node"), await cluster.raw_list("list_pod_for_all_namespaces"))
    assert not found, f"oversold during the move: {found}"


@dataclass
class Example:
    """The issue's example, built: node1 runs A (4 GPUs) and B (3), node2 is empty (both tainted for this test)."""

    key: str
    label: str
    node1: str
    node2: str = ""
    rescheduler: Process | None = None

    def start_rescheduler(self, plane: LocalPlane, namespace: str, *args: str) -> Process:
        self.rescheduler = plane.start_rescheduler(extra_args=[
            f"--node-selector={self.label}", "--interval-seconds=1", f"--lease-name=defrag-{namespace}"[:60],
            "--lease-namespace=hoss-system", *args])
        return self.rescheduler


@contextlib.asynccontextmanager
async def issue_example(plane: LocalPlane, cluster: Cluster, namespace: str) -> AsyncIterator[Example]:
    """node1 with A and B bound, then node2 (so that A and B cannot go there); everything removed afterwards."""
    key = f"defrag.hoss.io/set-{next(_sets)}"
    taint = {"key": key, "value": namespace[:63], "effect": "NoSchedule"}
    prefix = f"defrag-{namespace}"[:40]
    (node1,) = await cluster.create_nodes(1, prefix=prefix + "-1", capacity=NODE, labels={key: namespace[:63]},
                                          taints=[taint])
    example = Example(key=key, label=f"{key}={namespace[:63]}", node1=node1)
    try:
        await cluster.wait_nodes_ready([node1])
        apply(plane, namespace, [replicaset("a", 4, key), replicaset("b", 3, key)])
        await until(placed(cluster, namespace, a=node1, b=node1), timeout=90, what="A and B bound on node1")
        (example.node2,) = await cluster.create_nodes(1, prefix=prefix + "-2", capacity=NODE,
                                                      labels={key: namespace[:63]}, taints=[taint])
        await cluster.wait_nodes_ready([example.node2])
        yield example
    finally:
        if example.rescheduler is not None:
            plane.stop_process(example.rescheduler.name)
        for name in ("a", "b", "c"):
            plane.kubectl("delete", "replicaset", name, "-n", namespace, "--ignore-not-found", "--wait=false")
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([n for n in (node1, example.node2) if n])


async def test_rescheduler_moves_b_so_that_c_joins_a_and_the_dry_run_changes_nothing(
    plane: LocalPlane, cluster: Cluster, namespace: str, gpu_worker: None, dispatcher: Process
) -> None:
    async with issue_example(plane, cluster, namespace) as example:
        key, label, node1, node2 = example.key, example.label, example.node1, example.node2
        apply(plane, namespace, [replicaset("c", 4, key, gated=True)])

        async def c_gated() -> tuple[bool, str]:
            seen = await placement(cluster, namespace)
            return "c" in seen, str(seen)

        await until(c_gated, timeout=60, what="C's pod created (gated)")
        before = await placement(cluster, namespace)
        b_name = next(p["metadata"]["name"] for p in await cluster.raw_list("list_namespaced_pod", namespace)
                      if p["metadata"]["labels"]["app"] == "b")

        # The dry run: the plan, and nothing changed.
        dry = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "dev", "reschedule", "--dir",
                             str(plane.directory), "--dry-run", "--node-selector", label],
            capture_output=True, text=True, timeout=120, check=False)
        assert dry.returncode == 0, dry.stderr
        assert f"for pending pod {namespace}/c-" in dry.stdout and f"(4 GPUs) on {node1}:" in dry.stdout, dry.stdout
        assert f"move {namespace}/{b_name} (3 GPUs) from {node1} to {node2}" in dry.stdout, dry.stdout
        assert "dry run: nothing was changed" in dry.stdout
        # Had the dry run released C's gate, hoss would have placed it; had it evicted B, B would be gone.
        await hoss_had_its_turn(plane, dispatcher, [before["c"][1]])
        assert await placement(cluster, namespace) == before
        assert before["c"][0] == ""

        # The move, the oversell check polled all along.
        async with oversell_watch(cluster) as checks:
            rescheduler = example.start_rescheduler(plane, namespace, "--min-stranded-gpus=0")
            await until(placed(cluster, namespace, a=node1, b=node2, c=node1), timeout=180,
                        what="B moved to node2 and C beside A on node1")
        after = await placement(cluster, namespace)
        assert after["a"] == before["a"]  # A never moved
        assert after["b"][1] != before["b"][1]  # B is a replacement, created by its ReplicaSet
        assert after["c"][1] == before["c"][1]  # C is the pod that was pending
        assert len(checks) >= 2

        # Events on the moved pod and the nodes, and the outcome in the rescheduler's /status.
        async def events_posted() -> tuple[bool, str]:
            events = await cluster.events_for(namespace, b_name)
            moved_event = any(e.reason == "Rescheduled" and f"from node {node1} to node {node2}" in e.message
                              for e in events)
            node_events = await cluster.core.list_namespaced_event("default", field_selector="reason=Defragmenting")
            on_nodes = {e.involved_object.name for e in node_events.items}
            return moved_event and on_nodes >= {node1, node2}, f"{[e.reason for e in events]}, nodes {on_nodes}"

        await until(events_posted, timeout=60, what="Rescheduled on B and Defragmenting on both nodes")

        await until(plan_completed(rescheduler.port), timeout=60, what="the plan reported completed in /status")

        # ... and in the dispatcher's /status (the dashboard's source), which reads what the leader published.
        async def in_dispatcher_status() -> tuple[bool, str]:
            plans = ((await status_of(dispatcher.port)).get("rescheduler") or {}).get("plans") or []
            moves = plans[0]["moves"] if plans else []
            return bool(plans) and plans[0]["outcome"] == "completed" and moves[0]["to"] == node2, str(plans[:1])

        await until(in_dispatcher_status, timeout=60, what="the plan in the dispatcher's /status")


async def test_periodic_pass_consolidates_c_placed_without_a_gate(
    plane: LocalPlane, cluster: Cluster, namespace: str, gpu_worker: None, dispatcher: Process, browser: Page
) -> None:
    # node1 runs A (4) and B (3), node2 is empty; C (4) has no gate, so hoss places it on node2 at once: two partly
    # used nodes, 1 + 4 GPUs stranded. The periodic pass (default threshold, 4 stranded GPUs) finds the smallest
    # plan: one move, A to node2 beside C (node2 full, node1 with 5 GPUs free in one piece).
    async with issue_example(plane, cluster, namespace) as example:
        key, label, node1, node2 = example.key, example.label, example.node1, example.node2
        apply(plane, namespace, [replicaset("c", 4, key)])
        await until(placed(cluster, namespace, a=node1, b=node1, c=node2), timeout=60,
                    what="C placed on node2 at once (no gate)")
        before = await placement(cluster, namespace)
        a_name = next(p["metadata"]["name"] for p in await cluster.raw_list("list_namespaced_pod", namespace)
                      if p["metadata"]["labels"]["app"] == "a")

        # The dry run prints the periodic plan under the default threshold (under a threshold of 8 it finds none).
        def dry_run(threshold: int | None) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "dev", "reschedule", "--dir", str(plane.directory), "--dry-run",
                 "--node-selector", label, *([] if threshold is None else [f"--min-stranded-gpus={threshold}"])],
                capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            return done.stdout

        quiet = await asyncio.to_thread(dry_run, 8)
        assert "no plan" in quiet, quiet
        dry = await asyncio.to_thread(dry_run, None)
        assert "to defragment GPUs:" in dry, dry
        assert f"move {namespace}/{a_name} (4 GPUs) from {node1} to {node2}" in dry, dry
        assert "after:  0 whole free, 1 partly used, 1 full GPU nodes; 5 GPUs stranded; largest free piece 5" in dry
        assert await placement(cluster, namespace) == before

        async with oversell_watch(cluster) as checks:
            rescheduler = example.start_rescheduler(plane, namespace)  # the default threshold
            await until(placed(cluster, namespace, a=node2, b=node1, c=node2), timeout=120,
                        what="A moved beside C on node2, B alone on node1")
            await until(plan_completed(rescheduler.port), timeout=60,
                        what="the periodic plan reported completed in /status")
        after = await placement(cluster, namespace)
        assert after["a"][1] != before["a"][1]  # A is a replacement, created by its ReplicaSet, in the held room
        assert after["b"] == before["b"] and after["c"] == before["c"]  # nothing else moved
        assert len(checks) >= 2
        plans = (await status_of(rescheduler.port))["plans"]
        assert len(plans) == 1, plans  # one plan, and no further one once consolidated
        assert plans[0]["reason"] == "fragmentation" and plans[0]["pending"] is None
        assert [(m["from"], m["to"], m["gpus"]) for m in plans[0]["moves"]] == [(node1, node2, 4)]
        events = await cluster.events_for(namespace, a_name)
        assert any(e.reason == "Rescheduled" and "to defragment GPUs" in e.message for e in events), events

        # The dashboard's rescheduler panel shows the plan and its outcome, as /status does.
        await browser.open(f"http://127.0.0.1:{dispatcher.port}/", width=1280, height=900)

        async def panel_shows_the_plan() -> tuple[bool, str]:
            text = await browser.evaluate(
                "(() => { const t = document.querySelector('[data-testid=rescheduler]');"
                " return t && !t.closest('.panel').hidden ? t.innerText : 'hidden'; })()")
            return (a_name in str(text) and f"{node1} \u2192 {node2}" in str(text) and "completed" in str(text),
                    str(text))

        await until(panel_shows_the_plan, timeout=30, what="the dashboard's rescheduler panel to show the plan")
        assert browser.errors == [], browser.errors


def claiming(replicas: Json, template: str) -> Json:
    """The ReplicaSet `replicas` with its GPUs asked through a ResourceClaimTemplate `template` instead (each pod gets
    a claim of its own, made by the resourceclaim controller, gone with the pod)."""
    spec = replicas["spec"]["template"]["spec"]
    for part in ("requests", "limits"):
        spec["containers"][0]["resources"][part].pop(GPU)
    spec["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    return replicas


async def test_periodic_pass_moves_pods_whose_gpus_are_dra_devices(
    plane: LocalPlane, cluster: Cluster, namespace: str, gpu_worker: None, dispatcher: Process
) -> None:
    """The periodic example with GPUs published as DRA devices (8 per node, no GPU in allocatable; the DeviceClass
    serving nvidia.com/gpu selects them): A (4) and B (3) ask theirs through ResourceClaimTemplates, C (4) asks
    nvidia.com/gpu, which the class serves. C lands on node2 (1 + 4 GPUs stranded); the rescheduler counts the
    devices the claims hold and moves A beside C, whose replacement gets a new claim on node2's free devices."""
    key = f"defrag.hoss.io/set-{next(_sets)}"
    taint = {"key": key, "value": namespace[:63], "effect": "NoSchedule"}
    capacity = {resource: amount for resource, amount in NODE.items() if resource != GPU}
    prefix = f"dradefrag-{namespace}"[:40]
    nodes: list[str] = []
    rescheduler: Process | None = None
    async with device_objects(cluster) as devices:
        try:
            await devices.device_class(f"{namespace}-gpu", extended=GPU)
            await devices.template(namespace, "four", [request("gpu", f"{namespace}-gpu", count=4)])
            await devices.template(namespace, "three", [request("gpu", f"{namespace}-gpu", count=3)])
            nodes += await cluster.create_nodes(1, prefix=prefix + "-1", capacity=capacity,
                                                labels={key: namespace[:63]}, taints=[taint])
            await cluster.wait_nodes_ready(nodes)
            await devices.publish(nodes[0], [gpu(f"gpu-{i}") for i in range(8)])
            apply(plane, namespace, [claiming(replicaset("a", 4, key), "four"),
                                     claiming(replicaset("b", 3, key), "three")])
            await until(placed(cluster, namespace, a=nodes[0], b=nodes[0]), timeout=90, what="A and B on node1")
            nodes += await cluster.create_nodes(1, prefix=prefix + "-2", capacity=capacity,
                                                labels={key: namespace[:63]}, taints=[taint])
            await cluster.wait_nodes_ready(nodes[1:])
            await devices.publish(nodes[1], [gpu(f"gpu-{i}") for i in range(8)])
            apply(plane, namespace, [replicaset("c", 4, key)])
            await until(placed(cluster, namespace, a=nodes[0], b=nodes[0], c=nodes[1]), timeout=60,
                        what="C placed on node2 at once")
            before = await placement(cluster, namespace)
            async with oversell_watch(cluster):
                rescheduler = plane.start_rescheduler(extra_args=[
                    f"--node-selector={key}={namespace[:63]}", "--interval-seconds=1",
                    f"--lease-name=dradefrag-{namespace}"[:60], "--lease-namespace=hoss-system"])
                await until(placed(cluster, namespace, a=nodes[1], b=nodes[0], c=nodes[1]), timeout=120,
                            what="A moved beside C on node2, B alone on node1")
                await until(plan_completed(rescheduler.port), timeout=60, what="the plan reported completed")
            after = await placement(cluster, namespace)
            assert after["a"][1] != before["a"][1] and after["b"] == before["b"] and after["c"] == before["c"]
            plans = (await status_of(rescheduler.port))["plans"]
            assert [(m["from"], m["to"], m["gpus"]) for m in plans[0]["moves"]] == [(nodes[0], nodes[1], 4)], plans
            held = allocated(await devices.claims(namespace))
            assert len(held) == len(set(held)) == 4 + 3 + 4, held
            assert sorted(pool for _driver, pool, _device in held) == sorted([nodes[0]] * 3 + [nodes[1]] * 8)
        finally:
            if rescheduler is not None:
                plane.stop_process(rescheduler.name)
            for name in ("a", "b", "c"):
                plane.kubectl("delete", "replicaset", name, "-n", namespace, "--ignore-not-found", "--wait=false")
            await cluster.delete_pods(namespace)
            await cluster.delete_nodes(nodes)
