"""Story 1, throughput: a mix of CPU and GPU pods under the default and binpack policies, created as fast as the
apiserver takes them; how many are bound and how fast, why the others wait, and how many each worker placed, with
why a worker placed few or none.

Why a worker places few pods is a matter of its policies and of the dispatcher's routing (dispatcher/routing.py):
a pod goes only to a worker serving its policy, and among those the dispatcher keeps a load that one worker keeps up
with on that worker, engaging another only once about ``pack_depth`` pods wait for the engaged one's decision
(dispatcher --pack-depth). `worker_notes` words that from the dispatcher's /status, without guessing.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dev.demo.observe import bound, dispatcher_status, scheduled_condition
from dev.demo.stage import DEMO_NAMESPACE, POLICY_LABEL, SCHEDULER_NAME, demo_pods
from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from hoss.model.objects import Json

QUIET_SECONDS = 10.0
"""The story ends when every pod is bound, or when no pod was bound for this long after all were created."""
HEARTBEAT_WAIT_SECONDS = 5.0
"""How long to wait for the workers' heartbeats to count every pod bound (a worker beats once a second)."""


@dataclass
class WorkerView:
    """A worker as the dispatcher's /status shows it."""

    id: str
    policies: list[str]
    alive: bool
    routed: bool | None
    """On the leader's routing list (None: the dispatcher asked is not the leader)."""
    bound: int
    """Pods it bound since it started (its heartbeat's counter)."""


def worker_views(status: Json) -> list[WorkerView]:
    return [WorkerView(id=str(w["id"]), policies=[str(p) for p in w.get("policies") or []],
                       alive=bool(w.get("alive")), routed=w.get("routed"),
                       bound=int((w.get("counters") or {}).get("bound", 0)))
            for w in status.get("workers") or []]


@dataclass
class MixResult:
    bound: int
    seconds: float
    pending_reasons: dict[str, int]
    """The five commonest messages of the pods left pending, with how many say each."""
    asked: dict[str, int]
    """The story's pods by policy."""
    per_worker: dict[str, int]
    """Pods each worker bound during the story."""
    worker_notes: dict[str, str]
    """Why a worker placed few or no pods (`worker_notes`); workers with a fair share are not named."""


def _policies(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def worker_notes(placed: Mapping[str, int], workers: Sequence[WorkerView], *, asked: Mapping[str, int],
                 pack_depth: int) -> dict[str, str]:
    """Why each worker that placed less than half an even share of ``placed`` did: it was not running, it serves
    none of the policies the pods asked for (``asked``: pods per policy), the dispatcher did not route to it, or
    the dispatcher kept the load on another worker serving the same policies (the busiest of them is named)."""
    total = sum(placed.values())
    notes: dict[str, str] = {}
    for worker in workers:
        count = placed.get(worker.id, 0)
        if total == 0 or count * 2 * len(workers) >= total:
            continue
        served = [policy for policy in asked if policy in worker.policies]
        shared = [other for other in workers if other.id != worker.id
                  and any(policy in other.policies for policy in served)]
        if not worker.alive:
            why = "its heartbeat is gone: it was not running"
        elif not served:
            wanted = ", ".join(f"{policy} {n}" for policy, n in asked.items())
            why = (f"it serves {_policies(worker.policies)}, and none of the story's pods asks for "
                   f"{'that policy' if len(worker.policies) == 1 else 'those policies'} (they ask for {wanted})")
        elif worker.routed is False:
            why = ("the dispatcher does not route to it (it stalled, reports an unhealthy loop, or started after the "
                   "routing list was last read)")
        elif not shared:
            why = (f"it alone serves {_policies(served)}, and only {sum(asked[p] for p in served)} of the story's "
                   f"pods ask for {'it' if len(served) == 1 else 'them'}")
        else:
            busiest = max(shared, key=lambda other: (placed.get(other.id, 0), other.id))
            common = [policy for policy in served if policy in busiest.policies]
            why = (f"it serves {_policies(served)} as {busiest.id} does (which placed {placed.get(busiest.id, 0)}); "
                   f"the dispatcher keeps a load that one worker keeps up with on that worker, and engages another "
                   f"only once about {pack_depth} pods wait for the engaged one's decision (dispatcher "
                   f"--pack-depth)")
            if common != served:
                why += f"; {busiest.id} serves {_policies(common)} of them"
        notes[worker.id] = why
    return notes


def _bar(done: int, total: int, rate: float, width: int = 40) -> str:
    filled = int(width * done / total) if total else width
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} bound  {rate:7.1f} pods/s"


async def _bound_per_worker(plane: LocalPlane, baseline: Mapping[str, int], *, expected: int) -> list[WorkerView]:
    """The workers with their bound counters less ``baseline``, once the counters add up to ``expected`` (or after
    HEARTBEAT_WAIT_SECONDS: a heartbeat can lag the pods it bound)."""
    deadline = time.monotonic() + HEARTBEAT_WAIT_SECONDS
    while True:
        views = worker_views(await dispatcher_status(plane))
        for view in views:
            view.bound -= baseline.get(view.id, 0)
        if sum(view.bound for view in views) >= expected or time.monotonic() > deadline:
            return views
        await asyncio.sleep(0.5)


async def mix_story(cluster: Cluster, plane: LocalPlane, pods: int, *, pack_depth: int, as_json: bool,
                    progress: Callable[[str], None]) -> MixResult:
    progress(f"throughput: creating {pods} pods (schedulerName {SCHEDULER_NAME}; policies default and binpack)")
    manifests = demo_pods(pods)
    asked = dict(Counter(m["metadata"]["labels"][POLICY_LABEL] for m in manifests).most_common())
    baseline = {view.id: view.bound for view in worker_views(await dispatcher_status(plane))}
    started = time.monotonic()
    creating = asyncio.create_task(cluster.create_pods(manifests, namespace=DEMO_NAMESPACE))
    last_change, done, last_bound_at = time.monotonic(), -1, started
    while True:
        await asyncio.sleep(1)
        now_bound = len(bound(await cluster.raw_list("list_namespaced_pod", DEMO_NAMESPACE)))
        if now_bound != done:
            done, last_change, last_bound_at = now_bound, time.monotonic(), time.monotonic()
        elapsed = max(last_bound_at - started, 1e-6)
        if not as_json:
            print(_bar(done, pods, done / elapsed), end="", file=sys.stderr, flush=True)
        if creating.done() and (done >= pods or time.monotonic() - last_change > QUIET_SECONDS):
            break
    await creating
    if not as_json:
        print(file=sys.stderr)
    reasons: Counter[str] = Counter()
    for pod in await cluster.raw_list("list_namespaced_pod", DEMO_NAMESPACE):
        if not pod["spec"].get("nodeName"):
            _reason, message = scheduled_condition(pod)
            if message:
                reasons[message] += 1
    workers = await _bound_per_worker(plane, baseline, expected=done)
    per_worker = {view.id: view.bound for view in sorted(workers, key=lambda view: view.id)}
    return MixResult(bound=done, seconds=max(last_bound_at - started, 1e-6),
                     pending_reasons=dict(reasons.most_common(5)), asked=asked, per_worker=per_worker,
                     worker_notes=worker_notes(per_worker, workers, asked=asked, pack_depth=pack_depth))
