"""What every scenario stands on: `Bench`, which holds the plane and one client and switches which system runs
alone (``kube_alone`` / ``hoss_alone``: each system with only what it needs), makes fresh kwok nodes and
namespaces, starts hoss's processes, meters CPU and runs a timed batch of pods; and the small helpers the scenarios
share."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp

from bench.measure import CpuMeter, PodWatcher, ScheduledEvents, create_pods
from bench.scenarios.cpu import cpu_figures
from dev.local.cluster import Cluster, for_each, node_manifest, oversold_nodes, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.kube.client import KubeError, request_json
from hoss.model.objects import Json

GPU = "nvidia.com/gpu"
Progress = Callable[[str, int, int], None]
T = TypeVar("T")

CONTROLLER_MANAGER = "kube-controller-manager"
"""Stopped while the bench runs: its pods are bare (no workload to recreate them), and it is part of neither system,
so its watch traffic would only blur both systems' figures."""
RUN_LABEL = "bench.hoss.io/run"
SMALL_POD = {"cpu": "100m", "memory": "128Mi"}
NODE = {"cpu": "32", "memory": "128Gi", "pods": "110"}
_run_ids = iter(range(1, 10_000))


def next_run() -> int:
    """A number no earlier run of this process had: it names a run's namespace, nodes and workers."""
    return next(_run_ids)


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
        run = next_run()
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
        await for_each(manifests, lambda manifest: create_node(self.cluster, manifest), limit=64)
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
        run = next_run()
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



async def create_node(cluster: Cluster, manifest: Json) -> None:
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

