"""What the guard's end-to-end tests share: nodes and pods put straight onto nodes, the apiserver's refusals, and
the ledger's count of a node held against the apiserver's."""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable
from typing import Any

import aiohttp
import pytest

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from hoss.kube.client import KubeError, request_json
from hoss.ledger.client import Ledger
from hoss.model.objects import Json
from hoss.model.resources import pod_requests
from tests.waiting import until

NOBODY = "no-such-scheduler"
"""schedulerName of pods nobody schedules: the test binds them, or puts them on a node itself (spec.nodeName)."""


async def one_node(cluster: Cluster, prefix: str, cpu: str, *, labels: dict[str, str] | None = None) -> str:
    (node,) = await cluster.create_nodes(1, prefix=prefix, capacity={"cpu": cpu, "memory": "8Gi", "pods": "110"},
                                         labels=labels)
    await cluster.wait_nodes_ready([node])
    return node


def pod_on(name: str, node: str | None, cpu: str, *, scheduler: str = NOBODY,
           annotations: dict[str, str] | None = None) -> Json:
    """A pod asking ``cpu``, created on ``node`` (spec.nodeName) unless it is None."""
    pod = pod_manifest(name, requests={"cpu": cpu, "memory": "64Mi"}, scheduler_name=scheduler)
    if node is not None:
        pod["spec"]["nodeName"] = node
    if annotations:
        pod["metadata"]["annotations"] = dict(annotations)
    return pod


async def create(cluster: Cluster, namespace: str, pod: Json, **kwargs: Any) -> Json:
    created: Json = await request_json(cluster.core.create_namespaced_pod, namespace, pod, **kwargs)
    return created


async def refused(call: Awaitable[Any]) -> KubeError:
    """The apiserver's refusal of `call` (its status and message)."""
    with pytest.raises(KubeError) as caught:
        await call
    return caught.value


async def ledger_cpu(ledger: Ledger, node: str) -> int:
    """The milli-CPU the ledger holds on ``node``; -1 when it does not know the node."""
    usage = await ledger.node_usage([node])
    return usage[node][1].get("cpu", 0) if node in usage else -1


async def apiserver_cpu(cluster: Cluster, node: str) -> int:
    """The milli-CPU the apiserver's pods on ``node`` request."""
    pods = await cluster.raw_list("list_pod_for_all_namespaces", field_selector=f"spec.nodeName={node}")
    return sum(pod_requests(pod).get("cpu", 0) for pod in pods)


async def ledger_agrees(cluster: Cluster, ledger: Ledger, node: str, *, timeout: float = 60) -> None:
    """Wait until the ledger holds on ``node`` what the apiserver's pods there ask (and has the node at all)."""

    async def agree() -> tuple[bool, str]:
        held, truth = await ledger_cpu(ledger, node), await apiserver_cpu(cluster, node)
        return held == truth, f"ledger {held}m, apiserver {truth}m"

    await until(agree, timeout=timeout, what=f"the ledger to count node {node}'s pods")


async def resolver_get(plane: LocalPlane, path: str) -> str:
    """The body of the plane's resolver's answer to GET ``path`` over its serving TLS."""
    resolver = plane.running("hoss-resolver")
    assert resolver is not None and resolver.port is not None
    context = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    async with aiohttp.ClientSession() as session, session.get(
        f"https://127.0.0.1:{resolver.port}{path}", ssl=context
    ) as response:
        response.raise_for_status()
        return await response.text()


async def ledger_counter(plane: LocalPlane, name: str) -> int:
    """A ledger counter as the resolver's /status shows it (it reads them every 2 s)."""
    status = json.loads(await resolver_get(plane, "/status"))
    return int(status["ledger_counters"][name])
