"""Helpers for end-to-end tests that run hoss itself: workers and nodes for the length of a test, hoss pods kept on
the test's nodes, waiting for them, and what the apiserver says of a pod that waits."""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.waiting import until

NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}
"""A test node: 8 cpu, 32 GiB, 110 pods."""
_node_sets = itertools.count()


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


def started_workers(plane: LocalPlane, prefix: str, count: int) -> Iterator[list[Process]]:
    """``count`` workers (``prefix``-0, ...) started together, healthy before the caller goes on, stopped after:
    the body of a module-scoped worker fixture."""
    started = [plane.start_worker(f"{prefix}-{i}", wait=False) for i in range(count)]
    try:
        plane.wait_healthy(started)
        yield started
    finally:
        plane.stop_processes([p.name for p in started])


@asynccontextmanager
async def node_set(cluster: Cluster, count: int, *, labels: dict[str, str] | None = None,
                   taints: list[dict[str, str]] | None = None) -> AsyncIterator[list[str]]:
    """``count`` Ready nodes of `NODE_CAPACITY` for the length of the block (names unique in the session)."""
    names = await cluster.create_nodes(count, prefix=f"spec{next(_node_sets)}", capacity=NODE_CAPACITY,
                                       labels=labels, taints=taints or ())
    try:
        await cluster.wait_nodes_ready(names)
        yield names
    finally:
        await cluster.delete_nodes(names)


def pinned(pods: list[Json], key: str, value: str) -> list[Json]:
    """Keep the pods on this test's nodes (other tests' nodes may exist on the shared plane)."""
    for pod in pods:
        pod["spec"]["nodeSelector"] = {key: value}
    return pods


async def scheduled_condition(cluster: Cluster, namespace: str, pod: str) -> tuple[str, str]:
    """The reason and message of the pod's PodScheduled=False condition ("", "" without one)."""
    raw = await cluster.core.read_namespaced_pod(pod, namespace)
    for condition in raw.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return str(condition.reason or ""), str(condition.message or "")
    return "", ""


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

    await until(bound, timeout=timeout, what=f"{count} pods to be bound by hoss")
    return await cluster.raw_list("list_namespaced_pod", namespace)


async def dispatcher_rounds(dispatcher: Process) -> float:
    """The full rounds the dispatcher completed as leader (``hoss_dispatcher_rounds_total``, its /metrics)."""
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{dispatcher.port}/metrics") as response:
        text = await response.text()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "hoss_dispatcher_rounds_total" and sample.labels.get("role") == "leader")


async def dispatcher_rounds_pass(dispatcher: Process, count: int) -> None:
    """Wait until the dispatcher has completed ``count`` more full rounds: each looks at every pending pod, so
    whatever it would do with one it has done."""
    start = await dispatcher_rounds(dispatcher)

    async def passed() -> tuple[bool, str]:
        done = await dispatcher_rounds(dispatcher) - start
        return done >= count, f"{done:g} rounds"

    await until(passed, timeout=30 + 5 * count, what=f"the dispatcher to complete {count} more rounds")


async def worker_counters(worker: Process) -> dict[str, int]:
    """What a worker counted of the pods it was handed (bound, gone, unschedulable, retries...), from its /status."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{worker.port}/status") as response:
        status = await response.json()
    return {str(name): int(count) for name, count in status["counters"].items()}


async def status_access(plane: LocalPlane, namespace: str) -> dict[str, int]:
    """A dispatcher, a second resolver replica (a follower on the plane's sync Lease), a worker and a rescheduler
    (which serves /status only), each with ``--access=kubernetes``, beside the session's, asked for /status and
    /metrics by: nobody, a forged token, a ServiceAccount without the ClusterRole hoss-viewer, and one bound to it.
    The HTTP status of each (keys ``<component> <who> <path>``), and of each one's health probe without a token
    (``<component> nobody /healthz``)."""
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
    access = "--access=kubernetes"
    name = f"hoss-dispatcher-access-{namespace}"[:60]
    worker_id = f"access-{namespace}"[:50]
    resolver_name = f"hoss-resolver-access-{namespace}"[:60]
    started: list[str] = []
    outcomes: dict[str, int] = {}
    try:
        # Started together, then waited for together. A worker for a policy no test of the session sends pods to,
        # so it is never given work. The resolver takes the plane's sync Lease name, so it is a follower: one sync
        # per ledger. The dispatcher and the rescheduler (a dry run) get a Lease of their own, and the dispatcher a
        # scheduler name of its own: neither may take a session component's role or act.
        rescheduler_name = f"hoss-rescheduler-access-{namespace}"[:60]
        worker = await asyncio.to_thread(plane.start_worker, worker_id, policies=["gang-topology"],
                                         extra_args=[access], wait=False)
        started.append(worker.name)
        resolver = await asyncio.to_thread(plane.start_resolver, name=resolver_name, extra_args=[access], wait=False)
        started.append(resolver.name)
        dispatcher = await asyncio.to_thread(
            plane.start_dispatcher, name=name,
            extra_args=[access, f"--lease-name={name}", f"--scheduler-names={name}"], wait=False,
        )
        started.append(dispatcher.name)
        rescheduler = await asyncio.to_thread(
            plane.start_rescheduler, name=rescheduler_name,
            extra_args=[access, f"--lease-name={rescheduler_name}", "--dry-run=true"], wait=False,
        )
        started.append(rescheduler.name)
        await asyncio.to_thread(plane.wait_healthy, [worker, resolver, dispatcher, rescheduler])
        tls = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
        urls = {
            "dispatcher": f"http://127.0.0.1:{dispatcher.port}",
            "resolver": f"https://127.0.0.1:{resolver.port}",
            "worker": f"http://127.0.0.1:{worker.port}",
            "rescheduler": f"http://127.0.0.1:{rescheduler.port}",
        }
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as session:
            for component, url in urls.items():
                for who, token in tokens.items():
                    headers = {"Authorization": f"Bearer {token}"} if token else {}
                    for path in ("/status",) if component == "rescheduler" else ("/status", "/metrics"):
                        async with session.get(url + path, headers=headers) as response:
                            outcomes[f"{component} {who} {path}"] = response.status
                async with session.get(url + "/healthz") as response:
                    outcomes[f"{component} nobody /healthz"] = response.status
    finally:
        await asyncio.to_thread(plane.stop_processes, started)
        await asyncio.to_thread(plane.kubectl, "delete", "clusterrolebinding", binding, "--ignore-not-found")
    return outcomes
