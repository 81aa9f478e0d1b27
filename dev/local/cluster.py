"""Drive a running plane from tests, benchmarks and the demo: fake nodes, pods from a template, waiting.

Nodes are created through the API with the capacity a scenario needs; kwok turns them Ready. Pods are created
from a plain dict template (a Pod manifest) with names numbered from a prefix.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from hoss.kube.client import KubeError, ListCall, request_json
from hoss.model.dra import extended_resource_names, without_dra
from hoss.model.objects import Json
from hoss.model.resources import node_allocatable, pod_requests

T = TypeVar("T")
log = logging.getLogger(__name__)
A = TypeVar("A")

_CONCURRENCY = 32


class WaitTimeout(TimeoutError):
    """A condition did not hold in time; the message says what was awaited and what was last seen."""


def node_manifest(
    name: str,
    *,
    capacity: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> Json:
    """A fake Node (kwok manages every node of the local plane) with ``capacity`` as capacity and allocatable."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def pod_manifest(
    name: str,
    *,
    requests: Mapping[str, str] | None = None,
    scheduler_name: str = "default-scheduler",
    labels: Mapping[str, str] | None = None,
    template: Json | None = None,
) -> Json:
    """A Pod from ``template`` (or a one-container pause pod) with name, scheduler and requests set."""
    pod: Json = copy.deepcopy(template) if template is not None else {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }
    pod.setdefault("metadata", {})["name"] = name
    if labels:
        pod["metadata"].setdefault("labels", {}).update(labels)
    pod["spec"]["schedulerName"] = scheduler_name
    pod["spec"].setdefault("terminationGracePeriodSeconds", 0)
    if requests is not None:
        for container in pod["spec"]["containers"]:
            container.setdefault("resources", {})["requests"] = dict(requests)
    return pod


async def for_each(
    items: Iterable[A], call: Callable[[A], Awaitable[T]], *, limit: int = _CONCURRENCY
) -> list[T]:
    """``call`` on every item, at most ``limit`` at once; results in the order of ``items``."""
    semaphore = asyncio.Semaphore(limit)

    async def run(item: A) -> T:
        async with semaphore:
            return await call(item)

    return list(await asyncio.gather(*(run(item) for item in items)))


class Cluster:
    """A thin async client over one kubeconfig identity of the plane."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        # The generated client takes plain dict bodies, which its annotations do not admit.
        self.core: Any = client.CoreV1Api(api)

    @classmethod
    async def connect(cls, kubeconfig: Path) -> Cluster:
        api = await config.new_client_from_config(config_file=str(kubeconfig))
        return cls(api)

    async def close(self) -> None:
        await self.api.close()

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # --- nodes -------------------------------------------------------------------------------------------

    async def create_nodes(
        self,
        count: int,
        *,
        prefix: str,
        capacity: Mapping[str, str],
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
    ) -> list[str]:
        names = [f"{prefix}-{i:04d}" for i in range(count)]
        manifests = [node_manifest(n, capacity=capacity, labels=labels, taints=taints) for n in names]
        await for_each(manifests, lambda m: self.call(self.core.create_node, m, create=True))
        return names

    async def delete_nodes(self, names: Iterable[str]) -> None:
        await for_each(names, lambda n: self._ignore_missing(self.call(self.core.delete_node, n)))

    async def ready_nodes(self, names: Iterable[str]) -> set[str]:
        wanted = set(names)
        nodes: Any = await self.call(self.core.list_node)
        return {
            node.metadata.name
            for node in nodes.items
            if node.metadata.name in wanted
            and any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
        }

    async def wait_nodes_ready(self, names: Sequence[str], *, timeout: float = 60.0) -> None:
        async def ready() -> tuple[bool, str]:
            done = await self.ready_nodes(names)
            return len(done) == len(names), f"{len(done)}/{len(names)} nodes Ready"

        await wait_until(ready, timeout=timeout, what=f"{len(names)} nodes to become Ready")

    # --- namespaces and pods -----------------------------------------------------------------------------

    async def call(
        self, method: Callable[..., Awaitable[T]], *args: Any, create: bool = False, timeout: float = 30.0,
        **kwargs: Any,
    ) -> T | None:
        """One API call with a deadline, tried up to three times when the answer does not come (on a loaded
        2-core machine a response can get lost, and the client would otherwise wait forever). A create that
        meets 409 on a retry had succeeded the first time."""
        for attempt in range(3):
            try:
                return await method(*args, _request_timeout=timeout, **kwargs)
            except (TimeoutError, aiohttp.ClientError) as error:
                if attempt == 2:
                    raise
                log.warning("API call %s got no answer (%s); trying again", getattr(method, "__name__", method), error)
            except ApiException as error:
                if create and attempt > 0 and error.status == 409:
                    return None
                raise
        raise AssertionError("unreachable")

    async def ensure_namespace(self, name: str) -> None:
        try:
            await self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        except ApiException as error:
            if error.status != 409:
                raise

    async def create_pods(self, manifests: Iterable[Json], *, namespace: str) -> list[str]:
        items = list(manifests)
        await for_each(items, lambda m: self.call(self.core.create_namespaced_pod, namespace, m, create=True))
        return [m["metadata"]["name"] for m in items]

    async def raw_list(self, call: str, *args: str, **kwargs: Any) -> list[Json]:
        """A list call's items as raw JSON (the shape hoss.model.resources parses), e.g. ``raw_list("list_node")``."""
        body: Any = await self.call(request_json, getattr(self.core, call), *args, **kwargs)
        return list(body["items"])

    async def dra_resources(self) -> frozenset[str]:
        """The extended resources the cluster's DeviceClasses map to DRA devices (none where resource.k8s.io/v1
        is not served)."""
        body = await self.call(dra_list, client.ResourceV1Api(self.api).list_device_class)
        return frozenset().union(*map(extended_resource_names, [] if body is None else body["items"]))

    async def resource_claims(self) -> list[Json]:
        """Every ResourceClaim (none where resource.k8s.io/v1 is not served)."""
        body = await self.call(dra_list, client.ResourceV1Api(self.api).list_resource_claim_for_all_namespaces)
        return [] if body is None else list(body["items"])

    async def pods(self, namespace: str, *, label_selector: str = "") -> list[Any]:
        result = await self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        return list(result.items)

    async def delete_pods(self, namespace: str) -> None:
        await self.call(self.core.delete_collection_namespaced_pod, namespace, grace_period_seconds=0,
                        timeout=120)

    async def events_for(self, namespace: str, pod: str) -> list[Any]:
        events = await self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod},involvedObject.kind=Pod"
        )
        return list(events.items)

    @staticmethod
    async def _ignore_missing(call: Awaitable[Any]) -> None:
        try:
            await call
        except ApiException as error:
            if error.status != 404:
                raise


async def dra_list(call: ListCall, *args: Any, **kwargs: Any) -> Json | None:
    """`request_json` of a resource.k8s.io/v1 list call; None where the apiserver does not serve that API (its 404:
    Kubernetes before 1.34, or the API turned off)."""
    try:
        return await request_json(call, *args, **kwargs)
    except KubeError as error:
        if error.status == 404:
            return None
        raise


def oversold_nodes(nodes: Iterable[Json], pods: Iterable[Json], *, dra: Set[str] = frozenset()) -> dict[str, str]:
    """Nodes where the bound, unfinished pods' requests exceed allocatable, with the first resource that does.

    Computed from apiserver objects alone (raw JSON), the way a user would check a scheduler's work. ``dra``: the
    extended resources DeviceClasses map (`Cluster.dra_resources`), which a node without them in allocatable leaves
    to DRA, as kube-scheduler does (hoss/model/dra.py); their devices are allocated by ResourceClaims instead.
    """
    used: dict[str, dict[str, int]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            per_node = used.setdefault(node, {})
            for resource, amount in pod_requests(pod).items():
                per_node[resource] = per_node.get(resource, 0) + amount
    result = {}
    for node in nodes:
        name = node["metadata"]["name"]
        alloc = node_allocatable(node)
        for resource, amount in sorted(without_dra(used.get(name, {}), allocatable=alloc, dra=dra).items()):
            if amount > alloc.get(resource, 0):
                result[name] = f"{resource}: {amount} requested > {alloc.get(resource, 0)} allocatable"
                break
    return result


def devices_allocated_twice(claims: Iterable[Json]) -> dict[str, list[str]]:
    """Devices that the allocations of two or more ResourceClaims hold (admin access aside, which shares a device
    by design): 'driver/pool/device' -> the claims ('namespace/name'). Computed from the apiserver's claims
    alone."""
    holders: dict[str, list[str]] = {}
    for claim in claims:
        metadata = claim.get("metadata") or {}
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("adminAccess"):
                continue
            device = f"{result.get('driver')}/{result.get('pool')}/{result.get('device')}"
            holders.setdefault(device, []).append(f"{metadata.get('namespace')}/{metadata.get('name')}")
    return {device: names for device, names in holders.items() if len(set(names)) > 1}


async def wait_until(
    check: Callable[[], Awaitable[tuple[bool, str]]],
    *,
    timeout: float,
    what: str,
    interval: float = 0.5,
) -> str:
    """Poll ``check`` (returning done and a description of what it saw) until done or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    seen = "nothing yet"
    while True:
        done, seen = await check()
        if done:
            return seen
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {seen}")
        await asyncio.sleep(interval)
