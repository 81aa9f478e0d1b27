"""The dispatcher in integration tests: pending pods as its watch sees them, a dispatcher fed with them, workers
simulated by their heartbeats, and what a worker's stream holds."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

from dispatcher.core import Dispatcher
from dispatcher.intake import PendingPod
from dispatcher.settings import DispatcherSettings
from hoss.queue import WorkerInfo, WorkItem, WorkQueue, queue_key
from tests.waiting import until

Json = dict[str, Any]
ALIVE_SECONDS = 60.0
"""A heartbeat TTL no test outlives."""


def pending_pod(n: int, *, policy: str | None = None) -> Json:
    labels = {"hoss.io/policy": policy} if policy else {}
    return {
        "metadata": {"name": f"pod-{n}", "namespace": "team", "uid": f"uid-{n}", "labels": labels},
        "spec": {"schedulerName": "hoss", "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }


def settings(**overrides: Any) -> DispatcherSettings:
    return DispatcherSettings(identity="test-dispatcher", **overrides)


class RecordingNotifier:
    """Records what the dispatcher tells pods that wait, and the pods it fails."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, str]] = []
        self.failures: list[tuple[str, str, str]] = []

    async def waiting(self, pod: PendingPod, *, reason: str, message: str) -> None:
        self.notices.append((pod.key, message))

    async def failed(self, pod: PendingPod, *, reason: str, message: str) -> bool:
        self.failures.append((pod.key, reason, message))
        return True


async def make_dispatcher(
    queue: WorkQueue, pods: list[Json], *, notifier: RecordingNotifier | None = None,
    is_leader: Callable[[], bool] = lambda: True, **overrides: Any,
) -> Dispatcher:
    """A dispatcher whose watch has listed ``pods`` (it is synced); ``overrides`` are its settings."""
    dispatcher = Dispatcher(
        queue=queue, settings=settings(**overrides), notifier=notifier, rng=random.Random(11), is_leader=is_leader
    )
    await dispatcher.on_list(copy.deepcopy(pods))
    dispatcher.synced.set()
    return dispatcher


async def beat(queue: WorkQueue, worker_id: str, *, policies: tuple[str, ...] = ("default",),
               ttl: float = ALIVE_SECONDS, **fields: Any) -> None:
    await queue.heartbeat(WorkerInfo(id=worker_id, policies=list(policies), **fields), ttl_seconds=ttl)


async def dead(queue: WorkQueue, *worker_ids: str) -> None:
    """Wait until these workers' heartbeats have expired (a key's TTL, on the Redis server's clock)."""
    async def expired() -> tuple[bool, str]:
        _live, gone = await queue.workers()
        return gone >= set(worker_ids), f"dead: {sorted(gone)}"

    await until(expired, timeout=10, what=f"the heartbeats of {', '.join(worker_ids)} to expire")


async def stream_items(queue: WorkQueue, worker_id: str) -> list[WorkItem]:
    """The items in a worker's stream, delivered or not, in order."""
    entries: Any = await queue.redis.xrange(queue_key(worker_id))
    return [WorkItem.decode(fields) for _id, fields in entries]


async def stream_uids(queue: WorkQueue, worker_id: str) -> list[str]:
    """The pods in a worker's stream, delivered or not, in order."""
    return [item.uid for item in await stream_items(queue, worker_id)]


def rounds(dispatcher: Dispatcher, role: str) -> float:
    """The rounds the dispatcher completed in ``role`` (leader, follower), from its metrics."""
    return dispatcher.metrics.registry.get_sample_value("hoss_dispatcher_rounds_total", {"role": role}) or 0.0
