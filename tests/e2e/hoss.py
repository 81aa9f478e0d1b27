"""Helpers for end-to-end tests that run hoss itself: workers and nodes for the length of a test, hoss pods kept on
the test's nodes, waiting for them, and what the apiserver says of a pod that waits.

And the signals a test waits on to show that something did not happen: a component's counters (the dispatcher's
rounds, a worker's tries, kube-scheduler's attempts), a worker's empty stream, and a watch of the pods that hands a
check every state they pass through."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from dev.local.cluster import Cluster, pod_manifest
from dev.local.components import scheduler_process_name
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.kube.client import request_json
from hoss.model.objects import Json
from hoss.queue import WorkQueue
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


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` (with these labels) in a Prometheus text exposition."""
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


async def metrics_text(url: str, *, tls: ssl.SSLContext | None = None) -> str:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=tls if tls is not None else True) as response:
        response.raise_for_status()
        return await response.text()


async def dispatcher_rounds(dispatcher: Process) -> float:
    """The full rounds the dispatcher completed as leader (``hoss_dispatcher_rounds_total``, its /metrics)."""
    text = await metrics_text(f"http://127.0.0.1:{dispatcher.port}/metrics")
    return metric_total(text, "hoss_dispatcher_rounds_total", role="leader")


async def kube_scheduler_attempts(plane: LocalPlane, scheduler_name: str = "default-scheduler") -> float:
    """The scheduling attempts the plane's kube-scheduler serving ``scheduler_name`` finished, whatever their result
    (``scheduler_schedule_attempts_total``, its /metrics, read with the admin client certificate). An attempt is
    counted once it is over: its pod bound, or its failure (a binding refused too) handled."""
    process = plane.running(scheduler_process_name(scheduler_name))
    assert process is not None, f"no kube-scheduler serves {scheduler_name}"
    tls = ssl.create_default_context()
    tls.check_hostname = False
    tls.verify_mode = ssl.CERT_NONE  # its serving certificate is its own, self-signed
    tls.load_cert_chain(plane.pki_dir / "client-admin.crt", plane.pki_dir / "client-admin.key")
    text = await metrics_text(f"https://127.0.0.1:{process.port}/metrics", tls=tls)
    return metric_total(text, "scheduler_schedule_attempts_total", profile=scheduler_name)


async def grows(read: Callable[[], Awaitable[float]], by: int, *, what: str, timeout: float = 60) -> None:
    """Wait until ``read()`` (a counter) has grown by ``by`` from what it reads now: ``what`` happened ``by``
    more times."""
    start = await read()

    async def grown() -> tuple[bool, str]:
        more = await read() - start
        return more >= by, f"{more:g} more"

    await until(grown, timeout=timeout, what=f"{what} ({by} more)")


async def dispatcher_rounds_pass(dispatcher: Process, count: int) -> None:
    """Wait until the dispatcher has completed ``count`` more full rounds: each looks at every pending pod, so
    whatever it would do with one it has done."""
    await grows(lambda: dispatcher_rounds(dispatcher), count, what="the dispatcher to complete full rounds",
                timeout=30 + 5 * count)


async def worker_counters(worker: Process) -> dict[str, int]:
    """What a worker counted of the pods it was handed (bound, gone, unschedulable, retries...), from its /status."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{worker.port}/status") as response:
        status = await response.json()
    return {str(name): int(count) for name, count in status["counters"].items()}


async def worker_tries_again(worker: Process) -> None:
    """Wait until the worker has found a waiting pod unschedulable once more: a pod that fits nowhere stays with
    its worker, which tries it again after each backoff (and sooner when the cluster gains room)."""
    async def unschedulable() -> float:
        return (await worker_counters(worker)).get("unschedulable", 0)

    await grows(unschedulable, 1, what=f"{worker.name} to try a waiting pod again")


async def hoss_had_its_turn(plane: LocalPlane, dispatcher: Process, uids: Collection[str]) -> None:
    """Wait until hoss has done what it would do with these pending pods: the dispatcher completes two more full
    rounds (each looks at every pending pod and sends the ones that may go to a worker), then no worker holds one of
    them (a pod stays in the dispatched map from its sending until its worker is done with it; one bound keeps a
    ``bound:`` mark there, the binding made)."""
    await dispatcher_rounds_pass(dispatcher, 2)
    redis = Redis.from_url(plane.state().redis_url, decode_responses=True)
    try:
        async def done() -> tuple[bool, str]:
            dispatched = await WorkQueue(redis).dispatched()
            held = {uid: dispatched[uid] for uid in uids if uid in dispatched
                    and not dispatched[uid].startswith("bound:")}
            return not held, f"held by workers: {held}"

        await until(done, timeout=60, what="the workers to finish the pods they were sent")
    finally:
        await redis.aclose()


@asynccontextmanager
async def pods_watched(cluster: Cluster, seen: Callable[[Mapping[str, Json]], None], *,
                       namespace: str | None = None) -> AsyncIterator[None]:
    """While the block runs, ``seen(pods)`` (uid -> the pod as the apiserver has it; of ``namespace``, else of
    every namespace) after a first list, made before the block starts, and after every change a watch from it
    reports: a check made there sees each state the pods pass through. A watch too old to resume (410 Gone) lists
    again."""
    listing, args = ((cluster.core.list_pod_for_all_namespaces, ()) if namespace is None
                     else (cluster.core.list_namespaced_pod, (namespace,)))
    pods: dict[str, Json] = {}

    async def listed() -> str:
        body = await request_json(listing, *args)
        pods.clear()
        pods.update({pod["metadata"]["uid"]: pod for pod in body["items"]})
        seen(pods)
        return str(body["metadata"]["resourceVersion"])

    async def follow(version: str) -> None:
        while True:
            try:
                async with watch.Watch(return_type="object") as stream:
                    async for event in stream.stream(listing, *args, resource_version=version):
                        pod: Json = event["raw_object"]
                        if event["type"] == "DELETED":
                            pods.pop(pod["metadata"]["uid"], None)
                        elif event["type"] in ("ADDED", "MODIFIED"):
                            pods[pod["metadata"]["uid"]] = pod
                        else:
                            continue  # a bookmark
                        seen(pods)
            except ApiException as error:
                if error.status != 410:
                    raise
                version = await listed()

    task = asyncio.create_task(follow(await listed()))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def status_access(plane: LocalPlane, namespace: str) -> dict[str, int]:
    """A dispatcher, a second resolver replica (a follower on the plane's sync Lease), a worker and a rescheduler,
    each with ``--access=kubernetes``, beside the session's, asked for /status and /metrics by: nobody, a forged
    token, a ServiceAccount without the ClusterRole hoss-viewer, and one bound to it.
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
                    for path in ("/status", "/metrics"):
                        async with session.get(url + path, headers=headers) as response:
                            outcomes[f"{component} {who} {path}"] = response.status
                async with session.get(url + "/healthz") as response:
                    outcomes[f"{component} nobody /healthz"] = response.status
    finally:
        await asyncio.to_thread(plane.stop_processes, started)
        await asyncio.to_thread(plane.kubectl, "delete", "clusterrolebinding", binding, "--ignore-not-found")
    return outcomes


REPOSITORY = Path(__file__).resolve().parents[2]


async def hoss_why(plane: LocalPlane, *args: str) -> str:
    """What ``python -m dev why <args>`` prints (the operator's ``hoss why`` aimed at the plane)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dev", "why", "--dir", str(plane.directory), *args, cwd=REPOSITORY,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def why_json(plane: LocalPlane, *args: str) -> Json:
    answer: Json = json.loads(await hoss_why(plane, *args, "--json"))
    return answer


async def node_of(cluster: Cluster, namespace: str, pod: str) -> str:
    raw = await cluster.core.read_namespaced_pod(pod, namespace)
    return str(raw.spec.node_name or "")


async def wait_bound(cluster: Cluster, namespace: str, pods: Sequence[str], *, timeout: float = 120) -> dict[str, str]:
    """Wait until every pod of `pods` is bound: pod -> node."""
    where: dict[str, str] = {}

    async def bound() -> tuple[bool, str]:
        for pod in pods:
            where[pod] = await node_of(cluster, namespace, pod)
        waiting = {pod: await scheduled_condition(cluster, namespace, pod) for pod, node in where.items() if not node}
        return all(where.values()), f"{where}; waiting: {waiting}"

    await until(bound, timeout=timeout, what=f"pods {', '.join(pods)} to be bound")
    return dict(where)


async def wait_reason(cluster: Cluster, namespace: str, pod: str, text: str, *, timeout: float = 90) -> str:
    """Wait until the pod's PodScheduled=False message holds `text`; the message."""
    seen = ["", ""]

    async def waits() -> tuple[bool, str]:
        seen[:] = await scheduled_condition(cluster, namespace, pod)
        return text in seen[1], f"{pod}: {seen}"

    await until(waits, timeout=timeout, what=f"{pod} to wait with {text!r}")
    return seen[1]


async def pending(cluster: Cluster, namespace: str) -> list[str]:
    pods = await cluster.raw_list("list_namespaced_pod", namespace)
    return sorted(p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName"))


async def delete_each(made: Sequence[tuple[Callable[[str], Awaitable[object]], Sequence[str]]]) -> None:
    """Delete what a test made, kind by kind (a delete call and the names it made), a name gone already being fine."""
    for call, names in made:
        for name in names:
            try:
                await call(name)
            except ApiException as error:
                if error.status != 404:
                    raise
