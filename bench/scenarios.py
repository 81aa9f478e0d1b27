"""The benchmark scenarios: hoss and kube-scheduler on the same plane, nodes and pods, each system alone.

Every scenario gets a fresh set of kwok nodes and pods and cleans up after itself. Each system runs with only
what it needs (``Bench.kube_alone`` / ``Bench.hoss_alone``): kube-scheduler without hoss's dispatcher, workers,
resolver and webhook; hoss without the plane's kube-scheduler. Figures are returned as plain dicts per system;
the report turns them into ratios against kube-scheduler and into the targets.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np

from bench.measure import (
    ALGORITHM_METRIC,
    CpuMeter,
    Histogram,
    PodWatcher,
    ScheduledEvents,
    create_pods,
    fetch_metrics,
    parse_histogram,
    post_bindings,
)
from dev.local.cluster import Cluster, for_each, node_manifest, oversold_nodes, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.framework.cycle import Profile, decide
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import PlacedPod
from hoss.framework.profiles import load_profiles
from hoss.kube.client import KubeError, request_json
from hoss.model.objects import Json
from hoss.model.resources import gpu_spread, node_allocatable, pod_requests

GPU = "nvidia.com/gpu"
Progress = Callable[[str, int, int], None]
T = TypeVar("T")

CONTROLLER_MANAGER = "kube-controller-manager"
"""Stopped while the bench runs: its pods are bare (no workload to recreate them), and it is part of neither system,
so its watch traffic would only blur both systems' figures."""
# The processes whose CPU every throughput run accounts for, in the order the JSON and the chart list them.
PROCESS_GROUPS = ("kube-apiserver", "etcd", "kwok", "kube-scheduler", "dispatcher", "workers", "resolver",
                  "redis-server", "bench")
# Longest the kube-scheduler side of the worker-core scenario may spend creating kwok nodes for one node count;
# a count that would take longer (estimated from the rate just measured) is reported as not measured.
NODE_CREATION_CAP_SECONDS = 180.0
CORE_LABEL = "bench.hoss.io/core"
RUN_LABEL = "bench.hoss.io/run"


@dataclass(frozen=True)
class Size:
    """How big each scenario is; --quick shrinks everything."""

    nodes: int
    pods: int
    worker_counts: tuple[int, ...]
    pinned_worker_counts: tuple[int, ...]
    contention_nodes: int
    contention_pods_per_system: int
    core_nodes: tuple[int, ...]
    core_decisions: int
    kube_core_pods: int
    gpu_nodes: int
    repeats: int = 1
    """How many times the throughput runs the targets compare with each other are made, interleaved
    (`throughput_again`); each of those rows is the run with the median pods/s. This machine's speed drifts by up
    to 2x within minutes, and one draw of each system made the ratio between them a lottery."""


FULL = Size(nodes=500, pods=5000, worker_counts=(1, 2, 4, 8), pinned_worker_counts=(1, 2), contention_nodes=40,
            contention_pods_per_system=120, core_nodes=(1000, 5000, 20000), core_decisions=200, kube_core_pods=300,
            gpu_nodes=32, repeats=3)
QUICK = Size(nodes=50, pods=300, worker_counts=(1, 2, 4), pinned_worker_counts=(1, 2), contention_nodes=10,
             contention_pods_per_system=30, core_nodes=(1000, 5000), core_decisions=50, kube_core_pods=100,
             gpu_nodes=8, repeats=2)

SMALL_POD = {"cpu": "100m", "memory": "128Mi"}
NODE = {"cpu": "32", "memory": "128Gi", "pods": "110"}
_run_ids = iter(range(1, 10_000))


def process_group(name: str) -> str:
    """The CPU-accounting group of a plane process (several kube-schedulers or workers add up)."""
    for prefix, group in (("kube-scheduler", "kube-scheduler"), ("hoss-dispatcher", "dispatcher"),
                          ("hoss-worker", "workers"), ("hoss-resolver", "resolver")):
        if name.startswith(prefix):
            return group
    return name


def cpu_figures(spent: Mapping[str, float], pods: int) -> dict[str, Any]:
    """CPU seconds per 1,000 pods per process group (= CPU milliseconds per pod), per worker, and the sums the
    table shows: hoss-side (dispatcher + workers + redis-server) and total (every process, the bench included)."""
    per_group = dict.fromkeys(PROCESS_GROUPS, 0.0)
    per_worker: dict[str, float] = {}
    scale = 1000 / pods if pods else 0.0
    for name, seconds in spent.items():
        group = process_group(name)
        per_group[group] = per_group.get(group, 0.0) + seconds
        if group == "workers":
            per_worker[name.removeprefix("hoss-worker-")] = round(seconds * scale, 3)
    per_1000 = {group: round(seconds * scale, 3) for group, seconds in per_group.items()}
    per_1000["hoss-side"] = round((per_group["dispatcher"] + per_group["workers"] + per_group["redis-server"]) * scale,
                                  3)
    per_1000["total"] = round(sum(per_group.values()) * scale, 3)
    return {"cpu_seconds": dict(spent), "cpu_per_1000_pods": per_1000, "cpu_per_1000_pods_per_worker": per_worker}


class Bench:
    """Shared plumbing: the plane, one client, the hoss processes of the current run, which system runs alone."""

    def __init__(self, plane: LocalPlane, cluster: Cluster, *, progress: Progress) -> None:
        self.plane = plane
        self.cluster = cluster
        self.progress = progress
        self.dispatcher: Process | None = None

    # --- which system runs -----------------------------------------------------------------------------

    def kube_alone(self) -> None:
        """kube-scheduler as its users run it: the plane's kube-scheduler up; hoss's dispatcher, workers and
        resolver stopped and the webhook unregistered."""
        self.close()
        self.plane.stop_resolver()
        self.plane.stop_process(CONTROLLER_MANAGER)
        if self.plane.running("kube-scheduler") is None:
            self.plane.start_scheduler(scheduler_name="default-scheduler")

    def hoss_alone(self) -> None:
        """hoss as its users run it: the resolver up (it rebuilds the ledger) with its webhook registered; the
        plane's kube-scheduler stopped. The dispatcher and workers start with each run."""
        self.plane.stop_scheduler()
        self.plane.stop_process(CONTROLLER_MANAGER)
        self.plane.ensure_resolver()

    def restore(self) -> None:
        """The plane as ``up`` left it: kube-controller-manager, kube-scheduler, resolver and webhook; no
        dispatcher."""
        self.close()
        self.plane.ensure_resolver()
        if self.plane.running("kube-scheduler") is None:
            self.plane.start_scheduler(scheduler_name="default-scheduler")
        if self.plane.running(CONTROLLER_MANAGER) is None:
            self.plane.start_controller_manager()

    # --- nodes, pods and hoss processes ----------------------------------------------------------------

    async def fresh(self, prefix: str, count: int, capacity: dict[str, str], **labels: str) -> tuple[str, list[str]]:
        run = next(_run_ids)
        namespace = f"bench-{prefix}-{run}"
        await self.cluster.ensure_namespace(namespace)
        nodes = await self.create_nodes(count, prefix=f"b{run}-{prefix}", capacity=capacity,
                                        labels={**labels, RUN_LABEL: str(run)})
        await self.wait_ready(f"{RUN_LABEL}={run}", count, timeout=300)
        return namespace, nodes

    async def create_nodes(self, count: int, *, prefix: str, capacity: Mapping[str, str],
                           labels: Mapping[str, str]) -> list[str]:
        """``count`` kwok nodes, created 64 at a time with raw requests (a model per answer costs the client more
        than the apiserver spends)."""
        manifests = [node_manifest(f"{prefix}-{i:05d}", capacity=capacity, labels=labels) for i in range(count)]
        await for_each(manifests, lambda manifest: _create_node(self.cluster, manifest), limit=64)
        return [m["metadata"]["name"] for m in manifests]

    async def wait_ready(self, selector: str, total: int, *, timeout: float, show: bool = False) -> None:
        """Until ``total`` nodes matching ``selector`` are Ready (kwok marks them)."""
        deadline = time.monotonic() + timeout
        while True:
            nodes = await self.cluster.raw_list("list_node", label_selector=selector)
            ready = sum(1 for n in nodes if any(c.get("type") == "Ready" and c.get("status") == "True"
                                                for c in (n.get("status") or {}).get("conditions") or []))
            if show:
                self.progress("", ready, total)
            if ready >= total:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {ready} of {total} kwok nodes ({selector}) were Ready after {timeout:.0f} s")
            # Each look lists every node: look less often when there are thousands (the apiserver pays for it).
            await asyncio.sleep(min(10.0, max(0.5, total / 2000)))

    async def cleanup(self, namespace: str, nodes: Sequence[str]) -> None:
        """Delete the run's pods, then its nodes (raw requests: the typed client would parse every deleted object
        into a model)."""
        await guarded("deleting the run's pods", self.delete_pods(namespace), seconds=180)
        await guarded("deleting the run's nodes", for_each(nodes, self._delete_node), seconds=180)

    async def delete_pods(self, namespace: str) -> None:
        """Delete every pod of the namespace. Deleting thousands can outlast the apiserver's own 60 s request
        limit (504, while the deletion goes on server-side): ask again until a call completes."""
        while True:
            try:
                await request_json(self.cluster.core.delete_collection_namespaced_pod, namespace,
                                   grace_period_seconds=0, _request_timeout=170)
            except KubeError as error:
                if error.status not in (429, 500, 503, 504):
                    raise
                print(f"\n[bench] deleting the pods of {namespace}: {error}; asking again", file=sys.stderr,
                      flush=True)
                await asyncio.sleep(1)
            else:
                return

    async def _delete_node(self, name: str) -> None:
        try:
            await request_json(self.cluster.core.delete_node, name, _request_timeout=30)
        except KubeError as error:
            if error.status != 404:
                raise

    def start_hoss(self, workers: int, *, policies: Sequence[str] = ("default",),
                   cpus: Sequence[int] | None = None) -> list[Process]:
        """The dispatcher (once) and ``workers`` workers, started at once; ``cpus`` pins worker i to core cpus[i]."""
        if self.dispatcher is None:
            self.dispatcher = self.plane.start_dispatcher(name="hoss-dispatcher-bench")
        run = next(_run_ids)
        ids = [f"bench{run}-{i}" for i in range(1, workers + 1)]
        processes = [self.plane.start_worker(worker_id, policies=policies,
                                             cpu=None if cpus is None else cpus[i], wait=False)
                     for i, worker_id in enumerate(ids)]
        self.plane.wait_healthy(processes)
        self._wait_routed(ids)
        return processes

    def _wait_routed(self, ids: Sequence[str], *, timeout: float = 30.0) -> None:
        """Until the dispatcher's /status lists every worker of ``ids`` on its routing list (read once a round;
        new pods also make it read the heartbeats again): hoss is up before its pods arrive, as kube-scheduler
        is."""
        assert self.dispatcher is not None
        url = f"http://127.0.0.1:{self.dispatcher.port}/status"
        deadline = time.monotonic() + timeout
        routed: set[str] = set()
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    status = json.loads(response.read())
                routed = {w["id"] for w in status.get("workers", []) if w.get("routed")}
            except (OSError, ValueError):
                routed = set()
            if routed >= set(ids):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the dispatcher did not route to workers {sorted(set(ids) - routed)} within "
                           f"{timeout:.0f} s; read {self.dispatcher.log}")

    def stop(self, processes: Sequence[Process]) -> None:
        self.plane.stop_processes([process.name for process in processes])

    def close(self) -> None:
        if self.dispatcher is not None:
            self.plane.stop_process(self.dispatcher.name)
            self.dispatcher = None

    def meter(self) -> CpuMeter:
        """A CPU meter over every process of the plane now running, and this benchmark process (the load
        generator, which also watches the pods)."""
        processes = {p.name: p.pid for p in self.plane.state().processes}
        processes["bench"] = os.getpid()
        return CpuMeter(processes)

    async def oversold(self, namespace: str, nodes: Sequence[str]) -> int:
        pods = await self.cluster.raw_list("list_namespaced_pod", namespace)
        wanted = set(nodes)
        node_objects = [n for n in await self.cluster.raw_list("list_node") if n["metadata"]["name"] in wanted]
        return len(oversold_nodes(node_objects, pods))

    async def timed_run(self, namespace: str, manifests: list[Json], nodes: Sequence[str], *,
                        timeout: float) -> dict[str, Any]:
        """Create the pods as fast as the apiserver takes them; time until the last one is bound; CPU per process
        over the same span and on until the bound pods' Scheduled events are posted; oversold nodes afterwards."""
        watcher = PodWatcher(self.cluster, namespace)
        await watcher.start()
        events = ScheduledEvents(self.cluster, namespace)
        await events.start()
        meter = self.meter()
        meter.start()
        watcher.timeline.started = time.monotonic()
        creating = asyncio.create_task(create_pods(self.cluster, manifests, namespace=namespace))
        waiting = asyncio.create_task(watcher.wait_bound(len(manifests), timeout=timeout))
        while not waiting.done():
            self.progress("", watcher.bound_count, len(manifests))
            await asyncio.sleep(0.5)
        # CPU is counted until the pods' Scheduled events are posted too: events a scheduler leaves queued behind
        # its bindings are work it still owes the apiserver and etcd.
        events_wait = await events.wait_for(watcher.bound_count)
        spent = meter.stop()
        create_failed = await guarded("creating the pods", creating, seconds=120) or 0
        await guarded("stopping the watch", watcher.stop(), seconds=30)
        await guarded("stopping the event watch", events.stop(), seconds=30)
        timeline = watcher.timeline
        bound = len(timeline.bound)
        return {
            "scheduled_events": len(events.pods),
            "events_wait_seconds": round(events_wait, 1),
            "pods": len(manifests),
            "create_failed": create_failed,
            "bound": bound,
            "pods_per_second": round(timeline.throughput(len(manifests)), 1),
            **timeline.percentiles(),
            "oversold_nodes": await self.oversold(namespace, nodes),
            **cpu_figures(spent, bound),
        }


async def guarded(step: str, work: Awaitable[T], *, seconds: float) -> T | None:
    """``work``, abandoned with a message after ``seconds``: one stuck request must not stall a whole run."""
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        print(f"\n[bench] {step} did not finish within {seconds:.0f}s; going on", file=sys.stderr, flush=True)
        return None
    except KubeError as error:
        print(f"\n[bench] {step} failed ({error}); going on", file=sys.stderr, flush=True)
        return None


def small_pods(count: int, scheduler: str, prefix: str = "p") -> list[Json]:
    return [pod_manifest(f"{prefix}-{i:05d}", requests=SMALL_POD, scheduler_name=scheduler) for i in range(count)]


# --- 1. throughput -----------------------------------------------------------------------------------------

THROUGHPUT_TIMEOUT = 600.0
# More hoss-side throughput rows (name -> row), run while hoss runs alone, after the hoss rows: the pipeline
# ceiling (bench/pipeline.py), see run.PIPELINE_CEILING.
ThroughputHook = Callable[["Bench", Size], Awaitable[dict[str, Any]]]


async def throughput_kube(bench: Bench, size: Size) -> dict[str, Any]:
    """kube-scheduler alone, then the apiserver's own ceiling without the webhook (call with ``kube_alone``)."""
    results: dict[str, Any] = {"kube-scheduler": await _kube_run(bench, size)}
    bench.progress("throughput: apiserver ceiling (pre-chosen nodes, no webhook)", 0, size.pods)
    results["apiserver-ceiling"] = await ceiling(bench, size)
    return results


async def throughput_hoss(bench: Bench, size: Size, *, pipeline_ceiling: ThroughputHook | None = None
                          ) -> dict[str, Any]:
    """The apiserver's ceiling with the webhook, hoss with each worker count, and hoss with workers pinned to
    one core each (call with ``hoss_alone``)."""
    results: dict[str, Any] = {}
    bench.progress("throughput: apiserver ceiling (pre-chosen nodes, with the webhook)", 0, size.pods)
    results["apiserver-ceiling+webhook"] = await ceiling(bench, size)
    runs: list[tuple[str, int, list[int] | None]] = [(f"hoss-{n}w", n, None) for n in size.worker_counts]
    runs += [(f"hoss-{n}w-pinned", n, list(range(n))) for n in size.pinned_worker_counts]
    for label, workers, cpus in runs:
        results[label] = await _hoss_run(bench, size, workers, cpus)
    if pipeline_ceiling is not None:
        results.update(await pipeline_ceiling(bench, size))
    return results


async def throughput_again(bench: Bench, size: Size) -> dict[str, list[dict[str, Any]]]:
    """The throughput rows the targets compare with each other (hoss-1w against kube-scheduler, hoss-4w against
    hoss-1w, the apiserver's ceiling with the webhook against without) made again ``size.repeats - 1`` times; the
    runs of each row in order. Each round has kube-scheduler alone (and the ceiling without the webhook) and hoss
    alone (the ceiling with the webhook, 1 and 4 workers). The order alternates: round 2 hoss first (4 workers
    before 1), round 3 kube-scheduler first (1 worker before 4), and so on, so that neither system always runs
    on a plane that has run longer (the first round, the main pass, has kube-scheduler first and 1 worker before
    4). Leaves hoss alone on the plane."""
    again: dict[str, list[dict[str, Any]]] = {}

    async def kube_side(round_: int) -> None:
        bench.kube_alone()
        again.setdefault("kube-scheduler", []).append(await _kube_run(bench, size, again=round_))
        bench.progress(f"throughput{_round(size, round_)}: apiserver ceiling, no webhook", 0, size.pods)
        again.setdefault("apiserver-ceiling", []).append(await ceiling(bench, size))

    async def hoss_side(round_: int, worker_counts: Sequence[int]) -> None:
        bench.hoss_alone()
        bench.progress(f"throughput{_round(size, round_)}: apiserver ceiling, with the webhook", 0, size.pods)
        again.setdefault("apiserver-ceiling+webhook", []).append(await ceiling(bench, size))
        for workers in worker_counts:
            if workers in size.worker_counts:
                again.setdefault(f"hoss-{workers}w", []).append(
                    await _hoss_run(bench, size, workers, None, again=round_))

    for round_ in range(2, size.repeats + 1):
        if round_ % 2 == 0:
            await hoss_side(round_, (4, 1))
            await kube_side(round_)
        else:
            await kube_side(round_)
            await hoss_side(round_, (1, 4))
    bench.hoss_alone()
    return again


def take_medians(throughput: dict[str, Any], again: Mapping[str, Sequence[dict[str, Any]]]) -> None:
    """Each row of ``throughput`` measured again becomes its run with the median pods/s (of an even count, the
    lower of the middle two), all its figures from that one run, with every run's pods/s in ``runs_pods_per_second``
    (in the order they ran), and, for rows with latencies, every run's p50 and p99 in ``runs_p50_ms`` and
    ``runs_p99_ms``: the median run by pods/s need not be the median by latency."""
    for name, later in again.items():
        if name not in throughput or not later:
            continue
        runs = [throughput[name], *later]
        ranked = sorted(runs, key=lambda row: float(row.get("pods_per_second") or 0.0))
        row = {**ranked[(len(ranked) - 1) // 2], "runs_pods_per_second": [run.get("pods_per_second") for run in runs]}
        for key in ("p50_ms", "p99_ms"):
            if all(isinstance(run.get(key), int | float) for run in runs):
                row[f"runs_{key}"] = [run[key] for run in runs]
        throughput[name] = row


def _round(size: Size, again: int) -> str:
    """How a progress line names a repeated run's round (nothing for the first)."""
    return f" again ({again} of {size.repeats})" if again else ""


async def _kube_run(bench: Bench, size: Size, *, again: int = 0) -> dict[str, Any]:
    bench.progress(f"throughput{_round(size, again)}: kube-scheduler (alone)", 0, size.pods)
    namespace, nodes = await bench.fresh("tput-kube", size.nodes, NODE)
    try:
        return await bench.timed_run(namespace, small_pods(size.pods, "default-scheduler"), nodes,
                                     timeout=THROUGHPUT_TIMEOUT)
    finally:
        await bench.cleanup(namespace, nodes)


async def _hoss_run(bench: Bench, size: Size, workers: int, cpus: list[int] | None, *,
                    again: int = 0) -> dict[str, Any]:
    pinned = f", pinned to core{'s' if workers > 1 else ''} {','.join(map(str, cpus))}" if cpus else ""
    bench.progress(f"throughput{_round(size, again)}: hoss, {workers} worker(s){pinned}", 0, size.pods)
    namespace, nodes = await bench.fresh(f"tput-hoss{workers}", size.nodes, NODE)
    processes = bench.start_hoss(workers, cpus=cpus)
    try:
        row = await bench.timed_run(namespace, small_pods(size.pods, "hoss"), nodes, timeout=THROUGHPUT_TIMEOUT)
        return {**row, "workers": workers, "pinned_cpus": cpus}
    finally:
        bench.stop(processes)
        await bench.cleanup(namespace, nodes)


async def ceiling(bench: Bench, size: Size) -> dict[str, Any]:
    """Bindings posted straight to round-robin nodes: the most the apiserver (and webhook) can take."""
    namespace, nodes = await bench.fresh("ceiling", size.nodes, NODE)
    try:
        # Pods for a scheduler that does not exist stay pending until we bind them ourselves.
        await create_pods(bench.cluster, small_pods(size.pods, "nobody"), namespace=namespace)
        pods = await bench.cluster.raw_list("list_namespaced_pod", namespace)
        meter = bench.meter()
        meter.start()
        started = time.monotonic()
        refused = await post_bindings(bench.cluster, pods, nodes, namespace=namespace)
        seconds = time.monotonic() - started
        bound = len(pods) - refused
        return {"pods": len(pods), "bound": bound, "pods_per_second": round(bound / seconds, 1), "refused": refused,
                "oversold_nodes": await bench.oversold(namespace, nodes), **cpu_figures(meter.stop(), bound)}
    finally:
        await bench.cleanup(namespace, nodes)


# --- 2. contention -------------------------------------------------------------------------------------------

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


# --- 3. the worker core at scale ---------------------------------------------------------------------------

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
    run = next(_run_ids)
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


async def _create_node(cluster: Cluster, manifest: Json) -> None:
    """One node, its answer not turned into a model (that costs the client more than the apiserver); a create
    whose answer was lost and that meets 409 when tried again had succeeded."""
    for attempt in range(3):
        try:
            await request_json(cluster.core.create_node, manifest, _request_timeout=30)
        except KubeError as error:
            if error.status == 409 and attempt > 0:
                return
            raise
        except (TimeoutError, aiohttp.ClientError):
            if attempt == 2:
                raise
        else:
            return


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


# --- 4. GPU mix ----------------------------------------------------------------------------------------------

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
