"""Helpers for end-to-end tests that run hoss itself: workers for the length of a test, hoss pods, waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import aiohttp

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




async def status_access(plane: LocalPlane, namespace: str) -> dict[str, int]:
    """A dispatcher with ``--access=kubernetes`` beside the session's, asked for /status and /metrics by: nobody, a
    forged token, a ServiceAccount without the ClusterRole hoss-viewer, and one bound to it. The HTTP status of
    each (keys ``<who> <path>``), and of /healthz without a token."""
    viewer, stranger = f"viewer-{namespace}"[:60], f"stranger-{namespace}"[:60]
    binding = f"hoss-viewer-{namespace}"[:60]
    await asyncio.to_thread(plane.kubectl, "-n", namespace, "create", "serviceaccount", viewer)
    await asyncio.to_thread(plane.kubectl, "-n", namespace, "create", "serviceaccount", stranger)
    await asyncio.to_thread(plane.kubectl, "create", "clusterrolebinding", binding, "--clusterrole=hoss-viewer",
                            f"--serviceaccount={namespace}:{viewer}")
    tokens = {
        "nobody": None,
        "forged": "eyJhbGciOiJSUzI1NiJ9.e30.forged",
        "stranger": (await asyncio.to_thread(plane.kubectl, "-n", namespace, "create", "token", stranger)).strip(),
        "viewer": (await asyncio.to_thread(plane.kubectl, "-n", namespace, "create", "token", viewer)).strip(),
    }
    name = f"hoss-dispatcher-access-{namespace}"[:60]
    # A Lease and a scheduler name of its own: it must neither take the session dispatcher's role nor dispatch.
    process = await asyncio.to_thread(
        plane.start_dispatcher, name=name,
        extra_args=["--access=kubernetes", f"--lease-name={name}", f"--scheduler-names={name}"],
    )
    outcomes: dict[str, int] = {}
    try:
        async with aiohttp.ClientSession() as session:
            for who, token in tokens.items():
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                for path in ("/status", "/metrics"):
                    async with session.get(f"http://127.0.0.1:{process.port}{path}", headers=headers) as response:
                        outcomes[f"{who} {path}"] = response.status
            async with session.get(f"http://127.0.0.1:{process.port}/healthz") as response:
                outcomes["nobody /healthz"] = response.status
    finally:
        await asyncio.to_thread(plane.stop_process, name)
        await asyncio.to_thread(plane.kubectl, "delete", "clusterrolebinding", binding, "--ignore-not-found")
    return outcomes
