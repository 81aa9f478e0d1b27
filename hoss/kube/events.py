"""Kubernetes Events and pod conditions that explain scheduling, as ``kubectl describe pod`` shows them.

Building the bodies is pure; posting them is one call each, or, off the caller's path, through an ``EventSink``.
Posting is best effort: a failure is logged and never stops scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from hoss.kube.client import KubeError, request_json
from hoss.kube.rest import STRATEGIC_MERGE_PATCH, KubeREST
from hoss.model import reservations
from hoss.model.objects import Json

log = logging.getLogger(__name__)



def _now() -> str:
    return _second_text(int(time.time()))


@functools.lru_cache(maxsize=2)
def _second_text(second: int) -> str:
    """RFC 3339 in whole seconds, as Kubernetes writes a Time; formatted once per second, not once per event."""
    return datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_event(
    *, namespace: str, name: str, uid: str, reason: str, message: str, component: str, warning: bool = True,
    action: str | None = None,
) -> Json:
    """A core/v1 Event about a pod."""
    now = _now()
    event: Json = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    if action is not None:
        event["action"] = action
    return event


def node_event(*, name: str, uid: str, reason: str, message: str, component: str, warning: bool = True) -> Json:
    """A core/v1 Event about a node (recorded in namespace ``default``, as the kubelet records node events)."""
    event = pod_event(namespace="default", name=name, uid=uid, reason=reason, message=message,
                      component=component, warning=warning)
    event["involvedObject"] = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
    return event


@dataclass(frozen=True)
class EventTarget:
    """What a component's events about itself are about: its own Pod, when the downward API names it (env
    ``POD_NAME``, ``POD_NAMESPACE``, ``POD_UID``, set in deploy/), else its namespace (``POD_NAMESPACE``, or
    ``default``), as a process outside a Pod has no object of its own."""

    namespace: str = "default"
    pod: str | None = None
    uid: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EventTarget:
        return cls(namespace=env.get("POD_NAMESPACE") or "default", pod=env.get("POD_NAME") or None,
                   uid=env.get("POD_UID", ""))

    def event(self, *, reason: str, message: str, component: str, warning: bool) -> Json:
        """A core/v1 Event about the target: its Pod, or its Namespace (recorded in that namespace)."""
        if self.pod is not None:
            return pod_event(namespace=self.namespace, name=self.pod, uid=self.uid, reason=reason, message=message,
                             component=component, warning=warning)
        body = pod_event(namespace=self.namespace, name=self.namespace, uid="", reason=reason, message=message,
                         component=component, warning=warning)
        body["involvedObject"] = {"apiVersion": "v1", "kind": "Namespace", "namespace": self.namespace,
                                  "name": self.namespace}
        return body


def scheduled_event(*, namespace: str, name: str, uid: str, node: str, component: str) -> Json:
    """The Normal ``Scheduled`` event kube-scheduler records after a successful binding, worded as it words it."""
    return pod_event(
        namespace=namespace, name=name, uid=uid, reason="Scheduled", action="Binding", warning=False,
        message=f"Successfully assigned {namespace}/{name} to {node}", component=component,
    )


def unschedulable_condition(message: str, *, reason: str = "Unschedulable") -> Json:
    """A strategic-merge patch for pods/status setting PodScheduled=False with the reason."""
    return {
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": reason,
                    "message": message[:1024],
                    "lastTransitionTime": _now(),
                }
            ]
        }
    }



_POST_ERRORS = (KubeError, aiohttp.ClientError, OSError, TimeoutError)


async def post_event(core: Any, event: Json) -> None:
    """Post one event now; ``core`` is a KubeREST or the generated CoreV1Api. A failure is logged, never raised."""
    try:
        if isinstance(core, KubeREST):
            await core.create_event(event)
        else:
            await request_json(core.create_namespaced_event, event["metadata"]["namespace"], event)
    except _POST_ERRORS as error:
        log.warning("cannot record event %s on %s: %s", event["reason"], event["involvedObject"]["name"], error)


async def set_unschedulable(
    core: Any, *, namespace: str, name: str, message: str, reason: str = "Unschedulable"
) -> None:
    """Set PodScheduled=False; ``core`` is a KubeREST or the generated CoreV1Api. A failure is logged, never raised."""
    patch = unschedulable_condition(message, reason=reason)
    try:
        if isinstance(core, KubeREST):
            await core.patch_pod_status(namespace, name, patch)
        else:
            await request_json(
                core.patch_namespaced_pod_status, name, namespace, patch, _content_type=STRATEGIC_MERGE_PATCH
            )
    except _POST_ERRORS as error:
        log.warning("cannot set PodScheduled=False on %s/%s: %s", namespace, name, error)


class TokenBucket:
    """``rate`` tokens a second, holding at most ``burst``; starts full. ``rate`` 0 means unlimited."""

    def __init__(self, rate: float, burst: int | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0, not {rate}")
        self.rate = rate
        self.burst = float(burst if burst is not None else max(1, math.ceil(rate)))
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, not {burst}")
        self._clock = clock
        self._tokens = self.burst
        self._at = clock()

    def take(self) -> float:
        """Take a token: 0.0 when one was taken, else the seconds until one will be there (nothing taken)."""
        if self.rate == 0:
            return 0.0
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate

    async def acquire(self) -> None:
        """Wait for a token (re-checking the clock at least every second)."""
        while True:
            wait = self.take()
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, 1.0))


class EventSink:
    """Posts events off the caller's path.

    ``record`` never blocks and never raises: the event joins a bounded queue, or is dropped and counted when
    ``max_queued`` are already waiting (or the sink is closed). Background workers started by ``start()`` post
    them through ``rest``, at most ``concurrency`` at a time and, when ``per_second`` > 0, at most that many a
    second after a burst of ``burst``. A failed post is counted, not retried, and logged at most once every
    ``log_every`` seconds. ``close(timeout)`` posts what is queued within the timeout, then drops the rest.
    Every event recorded ends up counted exactly once in ``posted``, ``failed`` or ``dropped`` once closed.
    """

    def __init__(
        self,
        rest: KubeREST,
        *,
        max_queued: int = 10_000,
        concurrency: int = 8,
        per_second: float = 0.0,
        burst: int | None = None,
        request_timeout: float = 30.0,
        log_every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if concurrency < 1 or max_queued < 1:
            raise ValueError("concurrency and max_queued must be >= 1")
        self.rest = rest
        self.concurrency = concurrency
        self.request_timeout = request_timeout
        self.posted = 0
        self.failed = 0
        self.dropped = 0
        self._queue: asyncio.Queue[Json] = asyncio.Queue(maxsize=max_queued)
        self._bucket = TokenBucket(per_second, burst, clock=clock)
        self._clock = clock
        self._log_every = log_every
        self._logged_at: float | None = None
        self._unlogged = 0
        self._unfinished = 0  # accepted and not yet posted or failed
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def record(self, event: Json) -> None:
        """Queue ``event`` for posting; never blocks, never raises."""
        if self._closed:
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            return
        self._unfinished += 1

    def start(self) -> None:
        """Start the posting workers (in the running event loop); events recorded before are posted too."""
        if self._workers or self._closed:
            return
        self._workers = [
            asyncio.create_task(self._work(), name=f"event-sink-{i}") for i in range(self.concurrency)
        ]

    async def close(self, timeout: float = 5.0) -> None:
        """Stop accepting events, post what is queued within ``timeout`` seconds, and drop (count) the rest."""
        self._closed = True
        if self._workers:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._queue.join()
            for worker in self._workers:
                worker.cancel()
            await asyncio.gather(*self._workers, return_exceptions=True)
            self._workers = []
        self.dropped += self._unfinished
        self._unfinished = 0
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()

    async def __aenter__(self) -> EventSink:
        self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    async def _work(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._bucket.acquire()
                await self.rest.create_event(event, timeout=self.request_timeout)
            except Exception as error:  # a bad event or a failed post must not stop the worker
                self._unfinished -= 1
                self.failed += 1
                self._log_failure(event, error)
            else:
                self._unfinished -= 1
                self.posted += 1
            finally:
                self._queue.task_done()

    def _log_failure(self, event: Json, error: Exception) -> None:
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < self._log_every:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more failed posts not logged)" if self._unlogged else ""
        self._logged_at, self._unlogged = now, 0
        try:
            what = f"{event['reason']} on {event['involvedObject']['name']}"
        except (KeyError, TypeError):
            what = "event"
        log.warning("cannot record %s: %s%s", what, error or type(error).__name__, more)


def reservation_event(name: str, uid: str, *, reason: str, message: str, component: str, warning: bool) -> Json:
    """A core/v1 Event about a (cluster-scoped) Reservation, recorded in namespace default."""
    body = pod_event(namespace="default", name=name, uid=uid, reason=reason, message=message,
                     component=component, warning=warning)
    group, version, _plural = reservations.API
    body["involvedObject"] = {"apiVersion": f"{group}/{version}", "kind": "Reservation", "name": name, "uid": uid}
    return body


def podgroup_event(namespace: str, name: str, uid: str, *, api_version: str, reason: str, message: str,
                   component: str, warning: bool = False) -> Json:
    """A core/v1 Event about a PodGroup (of any of the APIs that define gangs), in its namespace."""
    body = pod_event(namespace=namespace, name=name, uid=uid, reason=reason, message=message,
                     component=component, warning=warning)
    body["involvedObject"] = {"apiVersion": api_version, "kind": "PodGroup", "namespace": namespace, "name": name,
                              "uid": uid}
    return body
