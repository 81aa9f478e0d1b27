"""Scenario 5, large clusters: hoss and kube-scheduler end to end at the node counts AI clusters run (5,000 and
20,000 kwok nodes), each system alone on the same nodes with the same mixed pods.

The kwok nodes are made Ready once and have neither heartbeats nor leases (the plane's kwok stages and
``--node-lease-duration-seconds=0``), so the idle plane costs little at 20,000 nodes once kwok and the apiserver have
worked through the new nodes (`settle` waits for that before any run); that idle cost is measured
at each size (CPU seconds per second, per process group, with kube-scheduler and with hoss's dispatcher, one worker
and resolver running) and subtracted from nothing. At each size, in this
order: kube-scheduler with its default configuration (percentageOfNodesToScore unset: its adaptive share of the
nodes), kube-scheduler with percentageOfNodesToScore 100 (as users set it for packing), then hoss with 1 and with
2 workers. Each run creates the same pods (one in eight asks for GPUs) into a namespace of its own and ends with
them deleted, so every run starts on empty nodes.

Per run: pods/s, p50/p99 latency and CPU per pod per process group (`Bench.timed_run`), and the decision time per
pod: kube-scheduler's ``scheduler_scheduling_algorithm_duration_seconds`` over the run (its mean), hoss's decision
over the same node count in process (`core_scale`), which the table of per-pod costs by size sets side by side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.measure import ALGORITHM_METRIC, Histogram, fetch_metrics, parse_histogram
from bench.scenarios.core_scale import core_scale, kube_feasible_nodes_sought
from bench.scenarios.cpu import process_group
from bench.scenarios.harness import GPU, Bench, guarded, next_run
from bench.scenarios.sizes import QUICK
from dev.local.cluster import pod_manifest
from dev.local.state import Process
from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.kube.client import request_json
from hoss.ledger.client import Ledger
from hoss.model.objects import Json

CPU_NODE = {"cpu": "32", "memory": "128Gi", "pods": "110"}
GPU_NODE = {"cpu": "96", "memory": "768Gi", "pods": "110", GPU: "8"}
GPU_NODE_EVERY = 8
"""One node in eight has eight GPUs."""
LARGE_LABEL = "bench.hoss.io/large"
FULL_SCORING_SCHEDULER = "bench-score-all"
RUN_TIMEOUT = 1800.0
IDLE_SECONDS = 10.0
SETTLED_CPU = 0.15
"""CPU seconds per second of the whole plane below which it counts as settled after the nodes were made: kwok and
the apiserver go on working through the new nodes for minutes after they are Ready, and a run started then would
pay for it (the first version of this scenario ran kube-scheduler in that tail and hoss after it)."""
SETTLE_TIMEOUT = 900.0
"""The longest `settle` waits (60 s and one more second per 20 nodes, up to this)."""
SHAPES: tuple[tuple[str, dict[str, str], int], ...] = (
    ("small", {"cpu": "100m", "memory": "128Mi"}, 5),
    ("medium", {"cpu": "1", "memory": "2Gi"}, 1),
    ("large", {"cpu": "4", "memory": "8Gi"}, 1),
    ("gpu", {"cpu": "2", "memory": "8Gi"}, 1),
)
"""Pod shapes and their weights: of every eight pods, five small, one medium, one large and one asking 1, 2, 4 or 8
GPUs (with a limit, as extended resources need)."""


@dataclass(frozen=True)
class LargeSize:
    nodes: tuple[int, ...]
    pods: int


LARGE = LargeSize(nodes=(5000, 20000), pods=5000)


def large_pods(count: int, scheduler: str, *, seed: int = 5) -> list[Json]:
    """``count`` pods of the mixed shapes in a fixed random order (the same for every run)."""
    rng = random.Random(seed)
    names = [name for name, _requests, weight in SHAPES for _ in range(weight)]
    requests = {name: requests for name, requests, _weight in SHAPES}
    pods = []
    for i in range(count):
        shape = rng.choice(names)
        wanted = dict(requests[shape])
        if shape == "gpu":
            wanted[GPU] = str(rng.choice([1, 1, 2, 2, 4, 8]))
        pod = pod_manifest(f"{shape}-{i:05d}", requests=wanted, scheduler_name=scheduler)
        if shape == "gpu":
            pod["spec"]["containers"][0]["resources"]["limits"] = {GPU: wanted[GPU]}
        pods.append(pod)
    return pods


async def large_nodes(bench: Bench, count: int, *, run: int, created: int) -> list[str]:
    """Grow the run's kwok nodes from ``created`` to ``count`` (one in eight with GPUs); every node's name."""
    missing = range(created, count)
    gpu = [i for i in missing if i % GPU_NODE_EVERY == 0]
    cpu = [i for i in missing if i % GPU_NODE_EVERY != 0]
    labels = {LARGE_LABEL: str(run)}
    if cpu:
        await bench.create_nodes(len(cpu), prefix=f"b{run}-large-cpu{created}", capacity=CPU_NODE, labels=labels)
    if gpu:
        await bench.create_nodes(len(gpu), prefix=f"b{run}-large-gpu{created}", capacity=GPU_NODE, labels=labels)
    await bench.wait_ready(f"{LARGE_LABEL}={run}", count, timeout=1800, show=True)
    nodes = await bench.cluster.raw_list("list_node", label_selector=f"{LARGE_LABEL}={run}")
    return [node["metadata"]["name"] for node in nodes]


async def idle_cost(bench: Bench, seconds: float = IDLE_SECONDS) -> dict[str, float]:
    """CPU seconds per second of each running process group while nothing is scheduled."""
    meter = bench.meter()
    meter.start()
    await asyncio.sleep(seconds)
    spent = meter.stop()
    groups: dict[str, float] = {}
    for name, used in spent.items():
        group = process_group(name)
        groups[group] = round(groups.get(group, 0.0) + used / seconds, 3)
    return groups


def _algorithm(scheduler: Process, bench: Bench, *, tries: int = 30) -> Histogram:
    """kube-scheduler's algorithm histogram from its /metrics. A kube-scheduler just started may answer 403 for a
    few seconds (its delegated authorization is not set up yet): asked again once a second, ``tries`` times."""
    for _ in range(tries - 1):
        try:
            return parse_histogram(fetch_metrics(scheduler.port, pki_dir=bench.plane.pki_dir), ALGORITHM_METRIC)
        except (urllib.error.HTTPError, urllib.error.URLError):
            time.sleep(1)
    return parse_histogram(fetch_metrics(scheduler.port, pki_dir=bench.plane.pki_dir), ALGORITHM_METRIC)


async def settle(bench: Bench, *, nodes: int, step: str) -> float:
    """Wait until the plane's CPU use falls below SETTLED_CPU (looked at over 5 s windows; at most 60 s and a second
    per 20 nodes, up to SETTLE_TIMEOUT); the seconds waited."""
    started = time.monotonic()
    longest = min(SETTLE_TIMEOUT, 60.0 + nodes / 20)
    while time.monotonic() - started < longest:
        busy = sum((await idle_cost(bench, 5.0)).values())
        bench.progress(f"{step}: the plane settles ({busy:.2f} CPU s/s)", 0, 1)
        if busy <= SETTLED_CPU:
            break
    return round(time.monotonic() - started, 1)


async def _kube_run(bench: Bench, scheduler: Process, scheduler_name: str, size: LargeSize, nodes: Sequence[str],
                    *, label: str) -> dict[str, Any]:
    namespace = f"bench-large-{next_run()}"
    await bench.cluster.ensure_namespace(namespace)
    bench.progress(label, 0, size.pods)
    before = await asyncio.to_thread(_algorithm, scheduler, bench)
    try:
        row = await bench.timed_run(namespace, large_pods(size.pods, scheduler_name), nodes, timeout=RUN_TIMEOUT)
        algorithm = (await asyncio.to_thread(_algorithm, scheduler, bench)).minus(before)
        mean = algorithm.total / algorithm.count * 1000 if algorithm.count else None
        return {**row, "decision_mean_ms": None if mean is None else round(mean, 3)}
    finally:
        await guarded("deleting the run's pods", bench.delete_pods(namespace), seconds=600)


async def _hoss_run(bench: Bench, workers: int, size: LargeSize, nodes: Sequence[str], *,
                    label: str) -> dict[str, Any]:
    namespace = f"bench-large-{next_run()}"
    await bench.cluster.ensure_namespace(namespace)
    bench.progress(label, 0, size.pods)
    processes = bench.start_hoss(workers)
    try:
        row = await bench.timed_run(namespace, large_pods(size.pods, "hoss"), nodes, timeout=RUN_TIMEOUT)
        return {**row, "workers": workers}
    finally:
        bench.stop(processes)
        await guarded("deleting the run's pods", bench.delete_pods(namespace), seconds=600)


async def large_clusters(bench: Bench, size: LargeSize, *, policies_file: Path) -> dict[str, Any]:
    """Every node count of ``size``, growing one set of kwok nodes: the idle plane's cost, then kube-scheduler
    (default, and scoring every node), then hoss with 1 and 2 workers, each alone. Leaves hoss alone on the plane
    and the nodes deleted."""
    run = next_run()
    results: dict[str, Any] = {}
    created = 0
    try:
        for count in size.nodes:
            step = f"large clusters: {count} kwok nodes"
            bench.progress(step, created, count)
            started = time.monotonic()
            bench.kube_alone()
            nodes = await large_nodes(bench, count, run=run, created=created)
            created = count
            row: dict[str, Any] = {"nodes": count, "gpu_nodes": (count + GPU_NODE_EVERY - 1) // GPU_NODE_EVERY,
                                   "pods": size.pods, "nodes_ready_seconds": round(time.monotonic() - started, 1),
                                   "kube_feasible_nodes_sought": kube_feasible_nodes_sought(count)}
            row["settle_seconds"] = await settle(bench, nodes=count, step=step)
            row["idle_cpu_per_second"] = {"kube-scheduler": await idle_cost(bench)}
            scheduler = bench.plane.running("kube-scheduler")
            if scheduler is None:
                raise RuntimeError("the plane's kube-scheduler is not running")
            row["kube-scheduler"] = await _kube_run(bench, scheduler, "default-scheduler", size, nodes,
                                                    label=f"{step}: kube-scheduler (default)")
            bench.plane.stop_scheduler()
            score_all = bench.plane.start_scheduler(scheduler_name=FULL_SCORING_SCHEDULER,
                                                    percentage_of_nodes_to_score=100)
            try:
                row["kube-scheduler 100%"] = await _kube_run(
                    bench, score_all, FULL_SCORING_SCHEDULER, size, nodes,
                    label=f"{step}: kube-scheduler (percentageOfNodesToScore 100)")
            finally:
                bench.stop([score_all])
            bench.hoss_alone()
            await _ledger_knows(bench, count)
            processes = bench.start_hoss(1)
            try:
                row["idle_cpu_per_second"]["hoss"] = await idle_cost(bench)
            finally:
                bench.stop(processes)
            for workers in (1, 2):
                row[f"hoss-{workers}w"] = await _hoss_run(bench, workers, size, nodes,
                                                          label=f"{step}: hoss, {workers} worker(s)")
            hoss_core = core_scale(dataclasses.replace(QUICK, core_nodes=(count,), core_decisions=100),
                                   policies_file=policies_file, progress=bench.progress)[str(count)]
            row["hoss_decision_mean_ms"] = hoss_core["decision_mean_ms"]
            results[str(count)] = row
    finally:
        bench.close()
        await guarded("deleting the large clusters' nodes", request_json(
            bench.cluster.core.delete_collection_node, label_selector=f"{LARGE_LABEL}={run}", _request_timeout=900),
            seconds=900)
    return results


async def _ledger_knows(bench: Bench, count: int, *, timeout: float = 600.0) -> None:
    """Until the resolver's ledger holds at least ``count`` nodes (it rebuilt after hoss_alone started it)."""
    client = aioredis.Redis.from_url(bench.plane.state().redis_url, decode_responses=True)
    try:
        ledger = Ledger(client)
        deadline = time.monotonic() + timeout
        while True:
            try:
                known = len((await ledger.snapshot()).nodes)
            except (LedgerNotReadyError, LedgerUnavailable):
                known = 0  # not ready while it rebuilds
            bench.progress("large clusters: the ledger takes the nodes", known, count)
            if known >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the ledger holds {known} of {count} nodes after {timeout:.0f} s")
            await asyncio.sleep(2)
    finally:
        await client.aclose()
