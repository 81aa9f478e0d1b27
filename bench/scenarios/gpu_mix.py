"""Scenario 4, GPU mix: 1/2/4/8-GPU pods created one at a time, as jobs arrive, on 8-GPU nodes; kube-scheduler as
configured by default and configured for packing, hoss under its policies: GPUs stranded on partly used nodes,
whole free nodes, pods placed."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from bench.measure import PodWatcher, create_pods
from bench.scenarios.harness import GPU, Bench
from bench.scenarios.sizes import Size
from dev.local.cluster import oversold_nodes, pod_manifest
from hoss.model.objects import Json
from hoss.model.resources import gpu_spread, node_allocatable, pod_requests

GPU_NODE = {"cpu": "96", "memory": "768Gi", "pods": "110", GPU: "8"}
# kube-scheduler configured for GPU packing the way its documentation shows: NodeResourcesFit with the
# MostAllocated scoring strategy and the extended resource weighted 3 against cpu and memory at 1
# (https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/, "Enabling bin packing using
# MostAllocated strategy", with intel.com/foo replaced by nvidia.com/gpu).
GPU_PACKING_PLUGIN_CONFIG: list[dict[str, Any]] = [{
    "name": "NodeResourcesFit",
    "args": {"scoringStrategy": {"type": "MostAllocated", "resources": [
        {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": GPU, "weight": 3}]}},
}]
GPU_PACKING_SCHEDULER = "bench-gpu-packing"


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


def gpu_header(size: Size) -> dict[str, Any]:
    # 60% of the GPUs: room to pack, room to fragment.
    return {"gpu_nodes": size.gpu_nodes, "gpus_requested": size.gpu_nodes * 8 * 6 // 10}


async def gpu_mix_kube(bench: Bench, size: Size) -> dict[str, Any]:
    """kube-scheduler's default profile, and one configured for GPU packing (call with ``kube_alone``)."""
    results = {"kube-scheduler": await _gpu_run(bench, size, "kube-scheduler", "default-scheduler", None)}
    packing = bench.plane.start_scheduler(scheduler_name=GPU_PACKING_SCHEDULER,
                                          plugin_config=GPU_PACKING_PLUGIN_CONFIG)
    try:
        results["kube-scheduler MostAllocated"] = await _gpu_run(
            bench, size, "kube-scheduler MostAllocated", GPU_PACKING_SCHEDULER, None)
    finally:
        bench.stop([packing])
    return results


async def gpu_mix_hoss(bench: Bench, size: Size, *, policies: Sequence[str]) -> dict[str, Any]:
    """hoss with each of ``policies`` (e.g. gpu and binpack), one worker (call with ``hoss_alone``)."""
    results = {}
    for policy in policies:
        system = f"hoss ({policy} policy)"
        processes = bench.start_hoss(1, policies=[policy])
        try:
            results[system] = await _gpu_run(bench, size, system, "hoss", policy)
        finally:
            bench.stop(processes)
    return results


async def _gpu_run(bench: Bench, size: Size, system: str, scheduler: str, policy: str | None) -> dict[str, Any]:
    bench.progress(f"GPU mix: {system}", 0, 1)
    namespace, nodes = await bench.fresh("gpu", size.gpu_nodes, GPU_NODE)
    try:
        manifests = gpu_pods(gpu_header(size)["gpus_requested"], scheduler, policy)
        watcher = PodWatcher(bench.cluster, namespace)
        await watcher.start()
        # One at a time, as jobs arrive: packing is about the order of decisions, not their speed.
        for n, manifest in enumerate(manifests):
            await create_pods(bench.cluster, [manifest], namespace=namespace)
            await watcher.wait_bound(watcher.bound_count + 1, timeout=30, quiet_seconds=5)
            bench.progress("", n + 1, len(manifests))
        await watcher.stop()
        pods = await bench.cluster.raw_list("list_namespaced_pod", namespace)
        node_objects = [n for n in await bench.cluster.raw_list("list_node") if n["metadata"]["name"] in nodes]
        return {**gpu_figures(node_objects, pods), "oversold_nodes": len(oversold_nodes(node_objects, pods))}
    finally:
        await bench.cleanup(namespace, nodes)
