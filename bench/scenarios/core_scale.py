"""Scenario 3, the worker core at scale: the time of one scheduling decision over thousands of nodes, hoss's in
process over a synthetic node table, kube-scheduler's from its own metrics over kwok nodes."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure import ALGORITHM_METRIC, Histogram, PodWatcher, create_pods, fetch_metrics, parse_histogram
from bench.scenarios.harness import NODE, SMALL_POD, Bench, Progress, guarded, next_run, small_pods
from bench.scenarios.sizes import Size
from dev.local.state import Process
from hoss.framework.cycle import Profile, decide
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import PlacedPod
from hoss.framework.profiles import load_profiles
from hoss.kube.client import request_json
from hoss.model.objects import Json

NODE_CREATION_CAP_SECONDS = 180.0
"""Longest the kube-scheduler side may spend creating kwok nodes for one node count; a count that would take longer
(estimated from the rate just measured) is reported as not measured."""
CORE_LABEL = "bench.hoss.io/core"

def core_scale(size: Size, *, policies_file: Path, progress: Progress) -> dict[str, Any]:
    """hoss: per-pod decision time (filter + score + choose) in process, over synthetic nodes."""
    profiles, default = load_profiles(str(policies_file))
    profile = profiles[default]
    rng = np.random.default_rng(1)
    pod = parse_pod({"metadata": {"name": "probe", "namespace": "bench", "uid": "probe"},
                     "spec": {"schedulerName": "hoss",
                              "containers": [{"name": "c", "resources": {"requests": SMALL_POD}}]}})
    results: dict[str, Any] = {}
    for count in size.core_nodes:
        progress(f"worker core: hoss in process, {count} nodes", 0, size.core_decisions)
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
                progress(f"worker core: hoss in process, {count} nodes", n, size.core_decisions)
        p50, p99 = np.percentile(timings, [50, 99])
        results[str(count)] = {"decision_p50_ms": round(float(p50), 3), "decision_p99_ms": round(float(p99), 3),
                               "decision_mean_ms": round(float(np.mean(timings)), 3),
                               "decisions_per_second": round(1000 / float(p50), 1),
                               **_term_pods_p50(profile, table, rng, size.core_decisions)}
    return results


def _term_probe(name: str, spec: Json) -> PodView:
    return parse_pod({"metadata": {"name": name, "namespace": "bench", "uid": name, "labels": {"app": "web"}},
                      "spec": {"schedulerName": "hoss", **spec,
                               "containers": [{"name": "c", "resources": {"requests": SMALL_POD}}]}})


def _term_pods_p50(profile: Profile, table: NodeTable, rng: np.random.Generator, decisions: int) -> dict[str, float]:
    """Decision p50 (ms) of a pod with a DoNotSchedule zone spread constraint and of a pod with required and
    preferred hostname anti-affinity, with one placed pod of their group per 20 nodes in the pod index."""
    web = {"labelSelector": {"matchLabels": {"app": "web"}}}
    probes = {
        "spread_decision_p50_ms": _term_probe("spread", {"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", **web}]}),
        "anti_affinity_decision_p50_ms": _term_probe("anti", {"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", **web}],
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "podAffinityTerm": {"topologyKey": "zone", **web}}]}}}),
    }
    for i in range(0, len(table), 20):
        table.place_pod(PlacedPod(uid=f"placed-{i}", node=table.names[i], namespace="bench", labels={"app": "web"},
                                  ports=()))
    figures = {}
    for key, pod in probes.items():
        timings = []
        for _ in range(max(decisions // 4, 10)):
            started = time.perf_counter()
            decide(profile, pod, table, rng=rng)
            timings.append((time.perf_counter() - started) * 1000)
        figures[key] = round(float(np.percentile(timings, 50)), 3)
    table.clear_pods()
    return figures


def kube_feasible_nodes_sought(nodes: int) -> int:
    """How many feasible nodes kube-scheduler's default configuration (percentageOfNodesToScore unset) looks for
    before it stops filtering and scores them: numFeasibleNodesToFind in pkg/scheduler/schedule_one.go (v1.36)."""
    if nodes < 100:
        return nodes
    percentage = max(50 - nodes // 125, 5)
    return max(nodes * percentage // 100, 100)


async def core_scale_kube(bench: Bench, size: Size, *, delete_nodes: bool = True) -> dict[str, Any]:
    """kube-scheduler's own decision time over kwok nodes of each count (call with ``kube_alone``).

    The nodes are created through the API (kwok makes them Ready), growing from one count to the next, and
    deleted afterwards unless ``delete_nodes`` is False (the last scenario on a plane about to be torn down: tens of
    seconds of deletions would go for nothing); the
    plane's kube-scheduler (its default configuration, as users run it) then schedules ``kube_core_pods`` small
    pods, ten at a time, and the difference of its ``scheduler_scheduling_algorithm_duration_seconds`` histogram
    (filter + score + select host, per attempt) before and after gives its p50 (interpolated inside the bucket,
    as histogram_quantile does) and its exact mean (sum / count). A count whose nodes would take longer than
    NODE_CREATION_CAP_SECONDS to create, at the rate just measured, is reported as not measured, with why.
    """
    scheduler = bench.plane.running("kube-scheduler")
    if scheduler is None:
        raise RuntimeError("the plane's kube-scheduler is not running; call Bench.kube_alone first")
    run = next_run()
    namespace = f"bench-core-{run}"
    await bench.cluster.ensure_namespace(namespace)
    results: dict[str, Any] = {}
    created = 0
    rate: float | None = None
    creation_seconds = 0.0
    try:
        for count in size.core_nodes:
            step = f"worker core: kube-scheduler, {count} kwok nodes"
            missing = count - created
            if rate is not None and missing / rate > NODE_CREATION_CAP_SECONDS:
                results[str(count)] = {
                    "measured": False,
                    "reason": f"not measured: {missing} more kwok nodes would take about {missing / rate:.0f} s to "
                              f"create at the {rate:.0f} nodes/s measured up to {created} nodes (cap "
                              f"{NODE_CREATION_CAP_SECONDS:.0f} s)",
                }
                continue
            bench.progress(step, created, count)
            started = time.monotonic()
            await bench.create_nodes(missing, prefix=f"b{run}-core{created}", capacity=NODE,
                                     labels={CORE_LABEL: str(run)})
            await bench.wait_ready(f"{CORE_LABEL}={run}", count, timeout=900, show=True)
            seconds = time.monotonic() - started
            creation_seconds += seconds
            rate = missing / seconds if seconds > 0 else None
            created = count
            bench.progress(step, 0, size.kube_core_pods)
            histogram = await _scheduled_histogram(bench, scheduler, namespace, size.kube_core_pods, prefix=f"c{count}")
            p50 = histogram.quantile(0.5)
            results[str(count)] = {
                "measured": True,
                "pods": int(histogram.count),
                "decision_p50_ms": None if p50 is None else round(p50 * 1000, 3),
                "decision_mean_ms": round(histogram.total / histogram.count * 1000, 3) if histogram.count else None,
                "p50_bucket_ms": None if p50 is None else [round(b * 1000, 3) for b in histogram.bucket_of(p50)],
                "feasible_nodes_sought": kube_feasible_nodes_sought(count),
                "nodes_created": missing,
                "nodes_ready_seconds": round(seconds, 1),
                "all_nodes_ready_seconds": round(creation_seconds, 1),
            }
    finally:
        if delete_nodes:
            await guarded("deleting the worker-core pods and nodes", _delete_core(bench, namespace, run), seconds=900)
    return results


async def _delete_core(bench: Bench, namespace: str, run: int) -> None:
    await guarded("deleting the worker-core pods", bench.delete_pods(namespace), seconds=300)
    await request_json(bench.cluster.core.delete_collection_node, label_selector=f"{CORE_LABEL}={run}",
                       _request_timeout=600)



async def _scheduled_histogram(bench: Bench, scheduler: Process, namespace: str, pods: int, *,
                               prefix: str) -> Histogram:
    """kube-scheduler's algorithm-duration histogram over scheduling ``pods`` pods, ten at a time (so that the
    apiserver is mostly idle while it decides)."""
    def read() -> Histogram:
        return parse_histogram(fetch_metrics(scheduler.port, pki_dir=bench.plane.pki_dir), ALGORITHM_METRIC)

    before = await asyncio.to_thread(read)
    watcher = PodWatcher(bench.cluster, namespace)
    await watcher.start()
    try:
        manifests = small_pods(pods, "default-scheduler", prefix=prefix)
        for start in range(0, pods, 10):
            batch = manifests[start:start + 10]
            await create_pods(bench.cluster, batch, namespace=namespace)
            await watcher.wait_bound(start + len(batch), timeout=60, quiet_seconds=15)
            bench.progress("", start + len(batch), pods)
    finally:
        await watcher.stop()
    return (await asyncio.to_thread(read)).minus(before)

