"""What the demo reads back to tell its stories: pods and their conditions from the apiserver, the webhook denials
the apiserver counted (its own metric, so no hoss process is taken at its word), the dispatcher's /status (workers,
their policies, routing and counters) and the resolver's record of the bindings it denied."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Sequence
from typing import Any

import aiohttp

from dev.demo.stage import STORY_TIMEOUT_SECONDS
from dev.local.cluster import Cluster, wait_until
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json

REJECTIONS_METRIC = "apiserver_admission_webhook_rejection_count"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def bound(pods: Sequence[Json]) -> list[Json]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName")]


def scheduled_condition(pod: Json) -> tuple[str, str]:
    """Reason and message of the pod's PodScheduled=False condition ('' when it has none)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("reason") or ""), str(condition.get("message") or "")
    return "", ""


async def list_pods(cluster: Cluster, namespace: str, selector: str = "") -> list[Json]:
    if selector:
        return await cluster.raw_list("list_namespaced_pod", namespace, label_selector=selector)
    return await cluster.raw_list("list_namespaced_pod", namespace)


async def wait_bound(cluster: Cluster, namespace: str, selector: str, count: int, *, what: str,
                     timeout: float = STORY_TIMEOUT_SECONDS) -> None:
    async def check() -> tuple[bool, str]:
        done = len(bound(await list_pods(cluster, namespace, selector)))
        return done >= count, f"{done}/{count} bound"

    await wait_until(check, timeout=timeout, what=what)


async def wait_condition(cluster: Cluster, namespace: str, selector: str, *, contains: str, what: str,
                         timeout: float = STORY_TIMEOUT_SECONDS) -> tuple[str, str]:
    """Wait until a pod of ``selector`` says (reason or message) ``contains``; its reason and message."""
    found: list[tuple[str, str]] = []

    async def check() -> tuple[bool, str]:
        for pod in await list_pods(cluster, namespace, selector):
            reason, message = scheduled_condition(pod)
            if contains in reason or contains in message:
                found.append((reason, message))
                return True, message
        return False, "no pod says it yet"

    await wait_until(check, timeout=timeout, what=what)
    return found[-1]


def webhook_rejections(metrics: str) -> int:
    """Requests the apiserver's validating webhooks denied (``apiserver_admission_webhook_rejection_count`` with
    ``error_type="no_error"``: the webhook answered and said no; a webhook that could not be called is not a
    denial), from the apiserver's /metrics text."""
    total = 0.0
    for line in metrics.splitlines():
        sample = _SAMPLE.match(line)
        if sample is None or sample["name"] != REJECTIONS_METRIC:
            continue
        labels = dict(_LABEL.findall(sample["labels"] or ""))
        if labels.get("type") == "validating" and labels.get("error_type") == "no_error":
            total += float(sample["value"])
    return int(total)


async def webhook_denials(plane: LocalPlane) -> int:
    """Webhook denials so far, as the apiserver counts them (since it started)."""
    metrics = await asyncio.to_thread(plane.kubectl, "get", "--raw", "/metrics")
    return webhook_rejections(metrics)


async def settled_webhook_denials(plane: LocalPlane, *, quiet_seconds: float = 2.0, timeout: float = 30.0) -> int:
    """Webhook denials once the count has held still for ``quiet_seconds`` (a scheduler whose binding was denied
    tries again after a back-off), or after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last, since = await webhook_denials(plane), loop.time()
    while loop.time() < deadline and loop.time() - since < quiet_seconds:
        await asyncio.sleep(0.5)
        now = await webhook_denials(plane)
        if now != last:
            last, since = now, loop.time()
    return last


async def get_json(url: str, *, context: ssl.SSLContext | None = None) -> Any:
    timeout = aiohttp.ClientTimeout(total=10)
    verify: ssl.SSLContext | bool = True if context is None else context
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url, ssl=verify) as response:
        response.raise_for_status()
        return await response.json()


def _process(plane: LocalPlane, name: str) -> Process:
    process = plane.state().process(name)
    if process is None:
        raise LookupError(f"{name} is not running in the plane in {plane.directory}")
    return process


def dispatcher_url(plane: LocalPlane) -> str:
    """The dispatcher's /status URL."""
    return f"http://127.0.0.1:{_process(plane, 'hoss-dispatcher').port}/status"


async def dispatcher_status(plane: LocalPlane) -> Json:
    """The dispatcher's /status: the workers (policies, alive, routed, counters), the ledger's nodes, and more."""
    status: Json = await get_json(dispatcher_url(plane))
    return status


async def resolver_denials(plane: LocalPlane) -> list[Json]:
    """The denials the plane's resolver remembers (its last 50, newest first: at, pod, node, username, reason,
    message), read from the resolver itself, so none is missing for want of a stats publish."""
    resolver = _process(plane, "hoss-resolver")
    context = ssl.create_default_context(cafile=str(plane.files.ca_cert))
    status = await get_json(f"https://127.0.0.1:{resolver.port}/status", context=context)
    return list(status.get("recent_denials") or [])
