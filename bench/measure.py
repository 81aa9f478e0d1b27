"""Measuring a scheduler from the outside: a pod watcher that timestamps creation and binding, a loader, the CPU
time of each process of the plane (/proc), and kube-scheduler's own latency histograms (/metrics).

Every timestamp is taken by the benchmark process when the apiserver's watch delivers the event, on one
monotonic clock, so the figures do not depend on the apiserver's one-second timestamp resolution.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from dev.local.cluster import Cluster, for_each
from hoss.kube.client import KubeError, list_objects, request_json, watch_objects
from hoss.model.admission import LANE_LABEL, lane_of
from hoss.model.objects import Json

log = logging.getLogger(__name__)


@dataclass
class Timeline:
    """When each pod of a run was seen created and seen bound."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    started: float = 0.0

    def throughput(self, expected: int) -> float:
        """Pods bound per second, from the first creation to the last binding."""
        if not self.bound:
            return 0.0
        span = max(self.bound.values()) - self.started
        return len(self.bound) / span if span > 0 else 0.0

    def latencies_ms(self) -> list[float]:
        return [(self.bound[p] - self.created[p]) * 1000 for p in self.bound if p in self.created]

    def percentiles(self) -> dict[str, float]:
        values = self.latencies_ms()
        if not values:
            return {"p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0}
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return {"p50_ms": round(float(p50), 1), "p90_ms": round(float(p90), 1), "p99_ms": round(float(p99), 1)}


class ScheduledEvents:
    """Counts the pods of one namespace that got their Normal ``Scheduled`` event (reason Scheduled), from a watch
    of the namespace's events. Both systems post one per placed pod; the bench waits for them before it stops
    counting CPU, so a system whose events lag behind its bindings is not spared their cost."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.pods: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def _see(self, event: Json) -> None:
        involved = event.get("involvedObject") or {}
        if event.get("reason") == "Scheduled" and involved.get("kind") == "Pod" and involved.get("name"):
            self.pods.add(str(involved["name"]))

    async def _run(self, version: str) -> None:
        call = self.cluster.core.list_namespaced_event
        selector = {"namespace": self.namespace, "field_selector": "reason=Scheduled"}
        while True:
            try:
                async for kind, event in watch_objects(call, resource_version=version, timeout_seconds=600,
                                                       inactivity_seconds=600, **selector):
                    version = str(event.get("metadata", {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED"):
                        self._see(event)
            except (KubeError, aiohttp.ClientError, TimeoutError, ValueError) as error:
                log.info("benchmark event watch restarts after: %s", error)
                items, version = await list_objects(call, **selector)
                for event in items:
                    self._see(event)

    async def start(self) -> None:
        _items, version = await list_objects(self.cluster.core.list_namespaced_event, namespace=self.namespace,
                                             field_selector="reason=Scheduled")
        self._task = asyncio.create_task(self._run(version))

    async def wait_for(self, count: int, *, quiet_seconds: float = 10.0, timeout: float = 120.0) -> float:
        """Until ``count`` pods have their event, nothing new came for ``quiet_seconds``, or ``timeout``; returns
        the seconds waited."""
        started = time.monotonic()
        seen, quiet_since = len(self.pods), started
        while len(self.pods) < count:
            now = time.monotonic()
            if len(self.pods) != seen:
                seen, quiet_since = len(self.pods), now
            if now - quiet_since >= quiet_seconds or now - started >= timeout:
                break
            await asyncio.sleep(0.1)
        return time.monotonic() - started

    async def stop(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 5)


class PodWatcher:
    """Watches one namespace and fills a Timeline; ``bound_count`` rises as pods get a node."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.timeline = Timeline()
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def bound_count(self) -> int:
        return len(self.timeline.bound)

    def _see(self, pod: Json, now: float) -> None:
        name = str(pod["metadata"]["name"])
        self.timeline.created.setdefault(name, now)
        if (pod.get("spec") or {}).get("nodeName") and name not in self.timeline.bound:
            self.timeline.bound[name] = now
            self.changed.set()

    async def _run(self, version: str) -> None:
        call = self.cluster.core.list_namespaced_pod
        while True:
            try:
                async for kind, pod in watch_objects(call, resource_version=version, namespace=self.namespace,
                                                     timeout_seconds=600, inactivity_seconds=600):
                    version = str(pod.get("metadata", {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED"):
                        self._see(pod, time.monotonic())
            except (KubeError, aiohttp.ClientError, TimeoutError, ValueError) as error:
                # WatchGone included: list again (pods seen late get late timestamps, never lost ones).
                log.info("benchmark watch restarts after: %s", error)
                items, version = await list_objects(call, namespace=self.namespace)
                for pod in items:
                    self._see(pod, time.monotonic())

    async def start(self) -> None:
        _items, version = await list_objects(self.cluster.core.list_namespaced_pod, namespace=self.namespace)
        self._task = asyncio.create_task(self._run(version))

    async def stop(self) -> None:
        """Cancel the watch; never wait on it for long (a cancellation can be lost on Python 3.11)."""
        task = self._task
        if task is None:
            return
        for _ in range(50):
            task.cancel()
            done, _pending = await asyncio.wait({task}, timeout=0.2)
            if done:
                with contextlib.suppress(asyncio.CancelledError):
                    task.result()
                return
        log.warning("the benchmark's pod watch did not stop; leaving it")

    async def wait_bound(self, count: int, *, timeout: float, quiet_seconds: float = 15.0) -> None:
        """Until ``count`` pods are bound, or nothing was bound for ``quiet_seconds``, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.bound_count < count and time.monotonic() < deadline:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), quiet_seconds)
            except TimeoutError:
                return


async def create_pods(cluster: Cluster, manifests: Iterable[Json], *, namespace: str, concurrency: int = 64) -> int:
    """Create the pods, ``concurrency`` at a time; returns how many could not be created (each request has a
    timeout, so one stuck connection cannot stall a run)."""
    failed = 0

    async def create(manifest: Json) -> None:
        nonlocal failed
        try:
            await request_json(cluster.core.create_namespaced_pod, namespace, manifest, _request_timeout=30)
        except (KubeError, aiohttp.ClientError, TimeoutError) as error:
            failed += 1
            log.warning("creating pod %s failed: %s", manifest["metadata"]["name"], error)

    await for_each(list(manifests), create, limit=concurrency)
    return failed


async def post_bindings(
    cluster: Cluster, pods: list[Json], nodes: list[str], *, namespace: str, concurrency: int = 64
) -> int:
    """Bind pods round-robin to ``nodes`` as fast as the apiserver takes them; returns how many were refused."""
    refused = 0

    async def bind(item: tuple[int, Json]) -> None:
        nonlocal refused
        index, pod = item
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod["metadata"]["name"], "namespace": namespace, "uid": pod["metadata"]["uid"],
                         "labels": {LANE_LABEL: lane_of(index)}},  # the webhook lanes, as hoss workers take them
            "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[index % len(nodes)]},
        }
        try:
            await request_json(cluster.core.create_namespaced_pod_binding, pod["metadata"]["name"], namespace, body,
                               _request_timeout=30)
        except (KubeError, aiohttp.ClientError, TimeoutError):
            refused += 1

    await for_each(list(enumerate(pods)), bind, limit=concurrency)
    return refused


# --- CPU per process -----------------------------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` so far (all its threads), from /proc/<pid>/stat; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after "(comm)" start at field 3 (state); utime and stime are fields 14 and 15.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter:
    """CPU seconds each named process spent between ``start`` and ``stop``."""

    def __init__(self, processes: Mapping[str, int]) -> None:
        self.processes = dict(processes)
        self._before: dict[str, float] = {}

    def start(self) -> None:
        self._before = {}
        for name, pid in self.processes.items():
            seconds = cpu_seconds(pid)
            if seconds is not None:
                self._before[name] = seconds

    def stop(self) -> dict[str, float]:
        """Per process, CPU seconds since ``start`` (a process that died meanwhile is left out)."""
        spent = {}
        for name, before in self._before.items():
            after = cpu_seconds(self.processes[name])
            if after is not None:
                spent[name] = round(after - before, 3)
        return spent


# --- kube-scheduler's own histograms -------------------------------------------------------------------------

ALGORITHM_METRIC = "scheduler_scheduling_algorithm_duration_seconds"


@dataclass
class Histogram:
    """A Prometheus histogram: cumulative counts per upper bound (seconds), plus sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0

    def minus(self, earlier: Histogram) -> Histogram:
        return Histogram({le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
                         self.total - earlier.total, self.count - earlier.count)

    def quantile(self, q: float) -> float | None:
        """The q-quantile by linear interpolation inside its bucket (as Prometheus' histogram_quantile does)."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for upper in sorted(self.buckets):
            cumulative = self.buckets[upper]
            if cumulative >= rank:
                if upper == float("inf"):
                    return lower  # beyond the last finite bound: that bound is all a histogram can say
                inside = cumulative - below
                return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = upper, cumulative
        return lower

    def bucket_of(self, value: float) -> tuple[float, float]:
        """The (lower, upper] bucket bounds that hold ``value``."""
        lower = 0.0
        for upper in sorted(self.buckets):
            if value <= upper:
                return lower, upper
            lower = upper
        return lower, float("inf")


def parse_histogram(text: str, metric: str) -> Histogram:
    """One unlabelled histogram from Prometheus text exposition."""
    histogram = Histogram()
    for line in text.splitlines():
        if line.startswith(f"{metric}_bucket"):
            label, value = line.rsplit(" ", 1)
            bound = label.split('le="', 1)[1].split('"', 1)[0]
            histogram.buckets[float(bound)] = float(value)
        elif line.startswith(f"{metric}_sum"):
            histogram.total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{metric}_count"):
            histogram.count = float(line.rsplit(" ", 1)[1])
    return histogram


def fetch_metrics(port: int, *, pki_dir: Path, client: str = "admin") -> str:
    """GET https://127.0.0.1:<port>/metrics of a kube component with a client certificate of the plane (admin is
    in system:masters, which delegated authorization always allows). Blocking: call it in a thread."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the component's self-signed serving certificate
    context.load_cert_chain(pki_dir / f"client-{client}.crt", pki_dir / f"client-{client}.key")
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10, context=context) as response:
        return str(response.read().decode())
