"""Measuring a scheduler from the outside: a pod watcher that timestamps creation and binding, and a loader.

Every timestamp is taken by the benchmark process when the apiserver's watch delivers the event, on one
monotonic clock, so the figures do not depend on the apiserver's one-second timestamp resolution.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from deploy.local.cluster import Cluster, Json, for_each
from resolver.kube import KubeError, list_objects, request_json, watch_objects

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
            "metadata": {"name": pod["metadata"]["name"], "namespace": namespace, "uid": pod["metadata"]["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[index % len(nodes)]},
        }
        try:
            await request_json(cluster.core.create_namespaced_pod_binding, pod["metadata"]["name"], namespace, body,
                               _request_timeout=30)
        except (KubeError, aiohttp.ClientError, TimeoutError):
            refused += 1

    await for_each(list(enumerate(pods)), bind, limit=concurrency)
    return refused
