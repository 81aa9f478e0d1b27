"""Helpers for end-to-end tests that run hoss itself: workers for the length of a test, hoss pods, waiting."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from deploy.local.cluster import Cluster, Json, pod_manifest, wait_until
from deploy.local.plane import LocalPlane, Process


@asynccontextmanager
async def workers(
    plane: LocalPlane, layout: Sequence[tuple[str, Sequence[str]]], *, extra_args: Sequence[str] = ()
) -> AsyncIterator[list[Process]]:
    started = [plane.start_worker(wid, policies=policies, extra_args=extra_args) for wid, policies in layout]
    try:
        yield started
    finally:
        for process in started:
            plane.stop_process(process.name)


def hoss_pods(
    prefix: str,
    count: int,
    *,
    policy: str | None = None,
    cpu: str = "500m",
    labels: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> list[Json]:
    """``count`` pods for hoss; ``extra`` adds requests (and matching limits, as extended resources need)."""
    all_labels = {**(labels or {}), **({"hoss.io/policy": policy} if policy else {})}
    pods = []
    for i in range(count):
        pod = pod_manifest(f"{prefix}-{i:04d}", requests={"cpu": cpu, "memory": "512Mi", **(extra or {})},
                           scheduler_name="hoss", labels=all_labels or None)
        if extra:
            pod["spec"]["containers"][0]["resources"]["limits"] = dict(extra)
        pods.append(pod)
    return pods


async def wait_all_bound(cluster: Cluster, namespace: str, count: int, *, timeout: float = 120) -> list[Json]:
    async def bound() -> tuple[bool, str]:
        pods = await cluster.raw_list("list_namespaced_pod", namespace)
        done = sum(1 for p in pods if p["spec"].get("nodeName"))
        return done == count, f"{done}/{count} bound"

    await wait_until(bound, timeout=timeout, what=f"{count} pods to be bound by hoss")
    return await cluster.raw_list("list_namespaced_pod", namespace)


