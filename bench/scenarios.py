"""The benchmark scenarios: each runs hoss and kube-scheduler on the same plane, nodes and pods.

Every scenario gets a fresh set of kwok nodes and pods and cleans up after itself. Figures are returned as plain
dicts per system; the report turns them into ratios against kube-scheduler.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench.measure import PodWatcher, create_pods, post_bindings
from deploy.local.cluster import Cluster, Json, oversold_nodes, pod_manifest
from deploy.local.plane import LocalPlane, Process
from resolver.resources import gpu_spread, node_allocatable, pod_requests
from workers.framework import decide
from workers.nodes import NodeTable
from workers.pod import parse_pod
from workers.profiles import load_profiles

GPU = "nvidia.com/gpu"
Progress = Callable[[str, int, int], None]
T = TypeVar("T")


@dataclass(frozen=True)
class Size:
    """How big each scenario is; --quick shrinks everything."""

    nodes: int
    pods: int
    worker_counts: tuple[int, ...]
    contention_nodes: int
    contention_pods_per_system: int
    core_nodes: tuple[int, ...]
    core_decisions: int
    gpu_nodes: int


FULL = Size(nodes=500, pods=5000, worker_counts=(1, 2, 4), contention_nodes=40, contention_pods_per_system=120,
            core_nodes=(1000, 5000, 20000), core_decisions=200, gpu_nodes=32)
QUICK = Size(nodes=50, pods=300, worker_counts=(1, 2), contention_nodes=10, contention_pods_per_system=30,
             core_nodes=(1000, 5000), core_decisions=50, gpu_nodes=8)

SMALL_POD = {"cpu": "100m", "memory": "128Mi"}
NODE = {"cpu": "32", "memory": "128Gi", "pods": "110"}
_run_ids = iter(range(1, 10_000))


class Bench:
    """Shared plumbing: the plane, one client, and the hoss processes of the current run."""

    def __init__(self, plane: LocalPlane, cluster: Cluster, *, progress: Progress) -> None:
        self.plane = plane
        self.cluster = cluster
        self.progress = progress
        self.dispatcher: Process | None = None

    async def fresh(self, prefix: str, count: int, capacity: dict[str, str], **labels: str) -> tuple[str, list[str]]:
        run = next(_run_ids)
        namespace = f"bench-{prefix}-{run}"
        await self.cluster.ensure_namespace(namespace)
        nodes = await self.cluster.create_nodes(count, prefix=f"b{run}-{prefix}", capacity=capacity, labels=labels)
        await self.cluster.wait_nodes_ready(nodes, timeout=300)
        return namespace, nodes

    async def cleanup(self, namespace: str, nodes: Sequence[str]) -> None:
        await guarded("deleting the run's pods", self.cluster.delete_pods(namespace), seconds=180)
        await guarded("deleting the run's nodes", self.cluster.delete_nodes(nodes), seconds=180)

    def start_hoss(self, workers: int, *, policies: Sequence[str] = ("default",)) -> list[Process]:
        if self.dispatcher is None:
            self.dispatcher = self.plane.start_dispatcher(name="hoss-dispatcher-bench")
        run = next(_run_ids)
        return [self.plane.start_worker(f"bench{run}-{i}", policies=policies) for i in range(1, workers + 1)]

    def stop(self, processes: Sequence[Process]) -> None:
        for process in processes:
            self.plane.stop_process(process.name)

    def close(self) -> None:
        if self.dispatcher is not None:
            self.plane.stop_process(self.dispatcher.name)
            self.dispatcher = None

    async def timed_run(self, namespace: str, manifests: list[Json], *, timeout: float) -> dict[str, Any]:
        """Create the pods as fast as the apiserver takes them; time until the last one is bound."""
        watcher = PodWatcher(self.cluster, namespace)
        await watcher.start()
        watcher.timeline.started = time.monotonic()
        creating = asyncio.create_task(create_pods(self.cluster, manifests, namespace=namespace))
        waiting = asyncio.create_task(watcher.wait_bound(len(manifests), timeout=timeout))
        while not waiting.done():
            self.progress("", watcher.bound_count, len(manifests))
            await asyncio.sleep(0.5)
        create_failed = await guarded("creating the pods", creating, seconds=120) or 0
        await guarded("stopping the watch", watcher.stop(), seconds=30)
        timeline = watcher.timeline
        return {
            "pods": len(manifests),
            "create_failed": create_failed,
            "bound": len(timeline.bound),
            "pods_per_second": round(timeline.throughput(len(manifests)), 1),
            **timeline.percentiles(),
        }


async def guarded(step: str, work: Awaitable[T], *, seconds: float) -> T | None:
    """``work``, abandoned with a message after ``seconds``: one stuck request must not stall a whole run."""
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        print(f"\n[bench] {step} did not finish within {seconds:.0f}s; going on", file=sys.stderr, flush=True)
        return None


def small_pods(count: int, scheduler: str, prefix: str = "p") -> list[Json]:
    return [pod_manifest(f"{prefix}-{i:05d}", requests=SMALL_POD, scheduler_name=scheduler) for i in range(count)]


# --- 1. throughput -----------------------------------------------------------------------------------------

async def throughput(bench: Bench, size: Size) -> dict[str, Any]:
    results: dict[str, Any] = {}
    timeout = 600.0

    bench.progress("throughput: kube-scheduler", 0, size.pods)
    bench.plane.unregister_webhook()  # kube-scheduler as users run it today: no webhook in the way
    try:
        namespace, nodes = await bench.fresh("tput-kube", size.nodes, NODE)
        results["kube-scheduler"] = await bench.timed_run(namespace, small_pods(size.pods, "default-scheduler"),
                                                          timeout=timeout)
        await bench.cleanup(namespace, nodes)

        bench.progress("throughput: apiserver ceiling (pre-chosen nodes, no webhook)", 0, size.pods)
        results["apiserver-ceiling"] = await ceiling(bench, size)
    finally:
        bench.plane.register_webhook()
    bench.progress("throughput: apiserver ceiling (pre-chosen nodes, with the webhook)", 0, size.pods)
    results["apiserver-ceiling+webhook"] = await ceiling(bench, size)

    for workers in size.worker_counts:
        bench.progress(f"throughput: hoss, {workers} worker(s)", 0, size.pods)
        namespace, nodes = await bench.fresh(f"tput-hoss{workers}", size.nodes, NODE)
        processes = bench.start_hoss(workers)
        try:
            results[f"hoss-{workers}w"] = await bench.timed_run(namespace, small_pods(size.pods, "hoss"),
                                                                timeout=timeout)
        finally:
            bench.stop(processes)
            await bench.cleanup(namespace, nodes)
    return results


async def ceiling(bench: Bench, size: Size) -> dict[str, Any]:
    """Bindings posted straight to round-robin nodes: the most the apiserver (and webhook) can take."""
    namespace, nodes = await bench.fresh("ceiling", size.nodes, NODE)
    try:
        # Pods for a scheduler that does not exist stay pending until we bind them ourselves.
        await create_pods(bench.cluster, small_pods(size.pods, "nobody"), namespace=namespace)
        pods = await bench.cluster.raw_list("list_namespaced_pod", namespace)
        started = time.monotonic()
        refused = await post_bindings(bench.cluster, pods, nodes, namespace=namespace)
        seconds = time.monotonic() - started
        return {"pods": len(pods), "bound": len(pods) - refused,
                "pods_per_second": round((len(pods) - refused) / seconds, 1), "refused": refused}
    finally:
        await bench.cleanup(namespace, nodes)


# --- 2. contention -------------------------------------------------------------------------------------------

async def contention(bench: Bench, size: Size) -> dict[str, Any]:
    capacity = {"cpu": "4", "memory": "16Gi", "pods": "110"}
    per_system = size.contention_pods_per_system
    room = size.contention_nodes * 4
    results: dict[str, Any] = {"capacity_cpu": room, "demand_cpu": 2 * per_system}

    bench.progress("contention: two kube-schedulers, no resolver", 0, 2 * per_system)
    bench.plane.unregister_webhook()
    schedulers = [bench.plane.start_scheduler(scheduler_name=n) for n in ("bench-a", "bench-b")]
    try:
        namespace, nodes = await bench.fresh("cont-kube", size.contention_nodes, capacity)
        manifests = [pod_manifest(f"{s}-{i:04d}", requests={"cpu": "1"}, scheduler_name=s)
                     for i in range(per_system) for s in ("bench-a", "bench-b")]
        results["2x kube-scheduler"] = await _contended(bench, namespace, nodes, manifests)
    finally:
        bench.stop(schedulers)
        bench.plane.register_webhook()
        await bench.cleanup(namespace, nodes)

    bench.progress("contention: hoss (4 workers) + kube-scheduler, with the resolver", 0, 2 * per_system)
    namespace, nodes = await bench.fresh("cont-hoss", size.contention_nodes, capacity)
    processes = bench.start_hoss(4)
    schedulers = [bench.plane.start_scheduler(scheduler_name="bench-c")]
    try:
        manifests = [pod_manifest(f"{s}-{i:04d}", requests={"cpu": "1"}, scheduler_name=s)
                     for i in range(per_system) for s in ("hoss", "bench-c")]
        results["hoss 4w + kube-scheduler, resolver"] = await _contended(bench, namespace, nodes, manifests)
    finally:
        bench.stop(schedulers)
        bench.stop(processes)
        await bench.cleanup(namespace, nodes)
    return results


async def _contended(bench: Bench, namespace: str, nodes: list[str], manifests: list[Json]) -> dict[str, Any]:
    watcher = PodWatcher(bench.cluster, namespace)
    await watcher.start()
    await create_pods(bench.cluster, manifests, namespace=namespace)
    await watcher.wait_bound(len(manifests), timeout=120, quiet_seconds=8)
    await watcher.stop()
    pods = await bench.cluster.raw_list("list_namespaced_pod", namespace)
    node_objects = [n for n in await bench.cluster.raw_list("list_node") if n["metadata"]["name"] in set(nodes)]
    oversold = oversold_nodes(node_objects, pods)
    return {"pods": len(manifests), "placed": sum(1 for p in pods if p["spec"].get("nodeName")),
            "oversold_nodes": len(oversold)}


# --- 3. the worker core at scale ---------------------------------------------------------------------------

def core_scale(size: Size, *, policies_file: Path, progress: Progress) -> dict[str, Any]:
    """Per-pod decision time (filter + score + choose) in process, over synthetic nodes."""
    profiles, default = load_profiles(str(policies_file))
    profile = profiles[default]
    rng = np.random.default_rng(1)
    pod = parse_pod({"metadata": {"name": "probe", "namespace": "bench", "uid": "probe"},
                     "spec": {"schedulerName": "hoss",
                              "containers": [{"name": "c", "resources": {"requests": SMALL_POD}}]}})
    results: dict[str, Any] = {}
    for count in size.core_nodes:
        progress(f"worker core: {count} nodes", 0, size.core_decisions)
        table = NodeTable()
        for i in range(count):
            table.upsert_node({"metadata": {"name": f"n{i}", "labels": {"zone": f"z{i % 4}"}},
                               "spec": {}, "status": {"allocatable": NODE}})
        used_rng = random.Random(count)
        for i in range(count):
            table.set_used(f"n{i}", {"cpu": used_rng.randrange(0, 30000), "memory": used_rng.randrange(0, 100 << 30),
                                     "pods": used_rng.randrange(0, 100)})
        timings = []
        for n in range(size.core_decisions):
            started = time.perf_counter()
            decide(profile, pod, table, rng=rng)
            timings.append((time.perf_counter() - started) * 1000)
            if n % 10 == 0:
                progress(f"worker core: {count} nodes", n, size.core_decisions)
        p50, p99 = np.percentile(timings, [50, 99])
        results[str(count)] = {"decision_p50_ms": round(float(p50), 3), "decision_p99_ms": round(float(p99), 3),
                               "decisions_per_second": round(1000 / float(p50), 1)}
    return results


# --- 4. GPU mix ----------------------------------------------------------------------------------------------

def gpu_pods(count_gpus: int, scheduler: str, policy: str | None, *, seed: int = 11) -> list[Json]:
    """1/2/4/8-GPU pods adding up to about ``count_gpus`` GPUs, in a fixed random order."""
    rng = random.Random(seed)
    pods, total, i = [], 0, 0
    while total < count_gpus:
        gpus = rng.choice([1, 1, 2, 2, 4, 8])
        labels = {"hoss.io/policy": policy} if policy else None
        pod = pod_manifest(f"gpu-{i:04d}", requests={"cpu": "1", "memory": "4Gi", GPU: str(gpus)},
                           scheduler_name=scheduler, labels=labels)
        pod["spec"]["containers"][0]["resources"]["limits"] = {GPU: str(gpus)}
        pods.append(pod)
        total += gpus
        i += 1
    return pods


def gpu_figures(nodes: list[Json], pods: list[Json]) -> dict[str, int]:
    used: dict[str, int] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node:
            used[node] = used.get(node, 0) + pod_requests(pod).get(GPU, 0)
    spread = gpu_spread(
        (node_allocatable(node).get(GPU, 0), used.get(node["metadata"]["name"], 0)) for node in nodes
    )
    placed = sum(1 for p in pods if p["spec"].get("nodeName"))
    return {"pods": len(pods), "placed": placed, "fully_free_gpu_nodes": spread.fully_free_nodes,
            "partly_used_gpu_nodes": spread.partly_used_nodes, "stranded_gpus": spread.stranded_gpus}


async def gpu_mix(bench: Bench, size: Size, *, policy: str) -> dict[str, Any]:
    capacity = {"cpu": "96", "memory": "768Gi", "pods": "110", GPU: "8"}
    demand = size.gpu_nodes * 8 * 6 // 10  # 60% of the GPUs: room to pack, room to fragment
    results: dict[str, Any] = {"gpu_nodes": size.gpu_nodes, "gpus_requested": demand}
    for system, scheduler, pod_policy in (("kube-scheduler", "default-scheduler", None),
                                          (f"hoss ({policy} policy)", "hoss", policy)):
        bench.progress(f"GPU mix: {system}", 0, 1)
        namespace, nodes = await bench.fresh("gpu", size.gpu_nodes, capacity)
        processes = bench.start_hoss(1, policies=[policy]) if scheduler == "hoss" else []
        try:
            manifests = gpu_pods(demand, scheduler, pod_policy)
            watcher = PodWatcher(bench.cluster, namespace)
            await watcher.start()
            # One at a time, as jobs arrive: packing is about the order of decisions, not their speed.
            for manifest in manifests:
                await create_pods(bench.cluster, [manifest], namespace=namespace)
                await watcher.wait_bound(watcher.bound_count + 1, timeout=30, quiet_seconds=5)
            await watcher.stop()
            pods = await bench.cluster.raw_list("list_namespaced_pod", namespace)
            node_objects = [n for n in await bench.cluster.raw_list("list_node") if n["metadata"]["name"] in nodes]
            results[system] = gpu_figures(node_objects, pods)
        finally:
            bench.stop(processes)
            await bench.cleanup(namespace, nodes)
    return results
