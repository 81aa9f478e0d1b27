"""Scenario 2, contention: two schedulers on too few nodes at once, first two kube-schedulers with nothing guarding
the bindings, then hoss and a kube-scheduler with the resolver guarding every binding: how many pods were placed
and how many nodes oversold."""

from __future__ import annotations

from typing import Any

from bench.measure import PodWatcher, create_pods
from bench.scenarios.harness import Bench
from bench.scenarios.sizes import Size
from dev.local.cluster import pod_manifest
from hoss.model.objects import Json

CONTENTION_NODE = {"cpu": "4", "memory": "16Gi", "pods": "110"}


async def contention_kube(bench: Bench, size: Size) -> dict[str, Any]:
    """Two kube-schedulers on too few nodes, nothing guarding the bindings (call with ``kube_alone``)."""
    per_system = size.contention_pods_per_system
    bench.progress("contention: two kube-schedulers, no resolver", 0, 2 * per_system)
    schedulers = [bench.plane.start_scheduler(scheduler_name=n) for n in ("bench-a", "bench-b")]
    namespace, nodes = await bench.fresh("cont-kube", size.contention_nodes, CONTENTION_NODE)
    try:
        manifests = [pod_manifest(f"{s}-{i:04d}", requests={"cpu": "1"}, scheduler_name=s)
                     for i in range(per_system) for s in ("bench-a", "bench-b")]
        return await _contended(bench, namespace, nodes, manifests)
    finally:
        bench.stop(schedulers)
        await bench.cleanup(namespace, nodes)


async def contention_hoss(bench: Bench, size: Size) -> dict[str, Any]:
    """hoss (4 workers) and a kube-scheduler on the same too few nodes, the resolver guarding every binding (call
    with ``hoss_alone``)."""
    per_system = size.contention_pods_per_system
    bench.progress("contention: hoss (4 workers) + kube-scheduler, with the resolver", 0, 2 * per_system)
    namespace, nodes = await bench.fresh("cont-hoss", size.contention_nodes, CONTENTION_NODE)
    processes = bench.start_hoss(4)
    schedulers = [bench.plane.start_scheduler(scheduler_name="bench-c")]
    try:
        manifests = [pod_manifest(f"{s}-{i:04d}", requests={"cpu": "1"}, scheduler_name=s)
                     for i in range(per_system) for s in ("hoss", "bench-c")]
        return await _contended(bench, namespace, nodes, manifests)
    finally:
        bench.stop(schedulers)
        bench.stop(processes)
        await bench.cleanup(namespace, nodes)


def contention_header(size: Size) -> dict[str, Any]:
    per_system = size.contention_pods_per_system
    return {"capacity_cpu": size.contention_nodes * int(CONTENTION_NODE["cpu"]), "demand_cpu": 2 * per_system}


async def _contended(bench: Bench, namespace: str, nodes: list[str], manifests: list[Json]) -> dict[str, Any]:
    watcher = PodWatcher(bench.cluster, namespace)
    await watcher.start()
    await create_pods(bench.cluster, manifests, namespace=namespace)
    await watcher.wait_bound(len(manifests), timeout=120, quiet_seconds=8)
    await watcher.stop()
    pods = await bench.cluster.raw_list("list_namespaced_pod", namespace)
    return {"pods": len(manifests), "placed": sum(1 for p in pods if p["spec"].get("nodeName")),
            "oversold_nodes": await bench.oversold(namespace, nodes)}

