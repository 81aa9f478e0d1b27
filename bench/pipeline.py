"""The pipeline ceiling: dispatcher + workers + ledger on a real redis-server, with the apiserver taken out.

The binding POST is replaced by a sink (`SinkBinder`): it records the binding in Redis and tells the ledger the
pod is bound, as the resolver's sync would. The dispatcher runs in this process and is fed pods through its
informer handlers; it learns bindings from the sink's list and drops the pods, as its watch would. Workers run
in this process (`run_in_process`) or as their own processes (``python -m bench.pipeline worker ...``, which the
benchmark pins to cores), so what is measured is hoss's own cost per pod, apart from the apiserver.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from bench.measure import CpuMeter
from dev.local.ports import free_port
from dispatcher.core import Dispatcher
from dispatcher.roles import cancel_and_wait
from dispatcher.settings import DispatcherSettings
from hoss.framework.pod import PodView
from hoss.ledger.arguments import BoundPod
from hoss.ledger.client import Ledger
from hoss.ledger.redisclient import PipelinedRedis
from hoss.model import compact
from hoss.model.objects import Json
from hoss.model.resources import node_allocatable, pod_requests
from hoss.queue import WorkQueue
from hoss.settings import run_loop
from workers.connections import Pipelined, connect_redis
from workers.core import Worker
from workers.settings import WorkerSettings

BOUND_KEY = "{hoss}:bench:bound"


class SinkBinder:
    """A binding that never reaches an apiserver: one list push. The driver plays the apiserver's watchers: it
    records the bindings in the ledger in batches (as the resolver's sync does) and tells the dispatcher."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def bind(self, pod: PodView, node: str) -> None:
        await self.redis.rpush(BOUND_KEY, f"{pod.uid} {node}")


def node_object(name: str, *, cpu: str = "32", memory: str = "128Gi", pods: str = "110") -> Json:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {}, "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def pod_object(n: int, *, cpu: str = "100m", memory: str = "128Mi", namespace: str = "bench") -> Json:
    return {"metadata": {"name": f"p-{n:06d}", "namespace": namespace, "uid": f"uid-{n:06d}",
                         "labels": {"app": "bench"}},
            "spec": {"schedulerName": "hoss",
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": "Pending"}}


async def prepare_ledger(redis: Redis, nodes: Sequence[Json]) -> None:
    """A fresh ledger with these nodes (descriptions included), nothing bound, and no queues."""
    await redis.flushdb()
    await Ledger(redis).rebuild(
        nodes=[(n["metadata"]["name"], node_allocatable(n), n["metadata"].get("labels") or {},
                compact.encode(compact.compact_node(n)).decode()) for n in nodes],
        bound=[])


@dataclass
class PipelineRun:
    pods: int
    bound: int
    seconds: float

    @property
    def pods_per_second(self) -> float:
        return self.bound / self.seconds if self.seconds > 0 else 0.0


async def drive(redis: Redis, pods: Sequence[Json], *, expected_workers: int, timeout: float = 300.0,
                on_start: Callable[[], None] | None = None, sends: PipelinedRedis | None = None) -> PipelineRun:
    """Run a dispatcher over `pods` until every pod is bound by the sink (or the timeout); ``sends`` is the
    pipelined connection the dispatcher's sends take, as hoss-dispatcher's do (redis-py's ``redis`` without)."""
    dispatcher = Dispatcher(queue=WorkQueue(redis, pipelined=sends),
                            settings=DispatcherSettings(identity="bench-pipeline"))
    by_uid = {p["metadata"]["uid"]: p for p in pods}
    requests = {uid: pod_requests(p) for uid, p in by_uid.items()}
    # the ports and description the resolver's sync gives the ledger for a bound pod (resolver/sync.py)
    metas = {uid: compact.pod_meta(p, request=requests[uid]) for uid, p in by_uid.items()}
    ledger = Ledger(redis)
    deadline = time.monotonic() + timeout
    while True:  # the workers must be beating before the first round, or the pods wait for a worker
        live, _dead = await dispatcher.queue.workers()
        if len(live) >= expected_workers:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(live)} of {expected_workers} workers started")
        await asyncio.sleep(0.05)
    await dispatcher.on_list([])
    dispatcher.synced.set()
    lead = asyncio.create_task(dispatcher.lead())
    if on_start is not None:
        on_start()
    started = time.monotonic()
    bound = 0
    try:
        for start in range(0, len(pods), 500):  # arrive in bursts, as a watch delivers them
            for pod in pods[start:start + 500]:
                await dispatcher.on_event("ADDED", pod)
            await asyncio.sleep(0)
        while bound < len(pods) and time.monotonic() < deadline:
            entries: Any = await redis.lpop(BOUND_KEY, 1000)
            if not entries:
                await asyncio.sleep(0.01)
                continue
            confirmed = []
            for entry in entries:
                uid, node = str(entry).split(" ", 1)
                placed = by_uid.get(uid)
                if placed is not None:
                    bound += 1
                    ports, meta = metas[uid]
                    confirmed.append(BoundPod(uid=uid, pod=f"{placed['metadata']['namespace']}/"
                                              f"{placed['metadata']['name']}", node=node, request=requests[uid],
                                              ports=ports, meta=meta))
                    await dispatcher.on_event("MODIFIED", {**placed, "spec": {**placed["spec"], "nodeName": node}})
            await ledger.bind_many(confirmed)
        return PipelineRun(pods=len(pods), bound=bound, seconds=time.monotonic() - started)
    finally:
        await cancel_and_wait(lead)  # redis-py can swallow a single cancellation


def worker_settings(worker_id: str, redis_url: str, policies_file: str, **overrides: Any) -> WorkerSettings:
    return WorkerSettings(id=worker_id, redis_url=redis_url, policies_file=policies_file, port=0,
                          scheduled_events=False, **overrides)


async def run_worker(settings: WorkerSettings, stop: asyncio.Event, *,
                     prepare: Callable[[Worker], None] | None = None) -> Worker:
    """One worker with the sink binder, until `stop` is set; `prepare` sees it before it starts."""
    redis = connect_redis(settings.redis_url)
    pipelined = Pipelined.connect(settings.redis_url)
    worker = Worker(settings, redis=redis, rest=None, binder=SinkBinder(redis), pipelined=pipelined)
    if prepare is not None:
        prepare(worker)
    task = asyncio.create_task(worker.run())
    await stop.wait()
    worker.stopping.set()
    await task
    await pipelined.aclose()
    await redis.aclose()
    return worker


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.pipeline worker ID REDIS_URL POLICIES_FILE``: one sink worker until SIGTERM."""
    parser = argparse.ArgumentParser(prog="bench.pipeline")
    parser.add_argument("role", choices=["worker"])
    parser.add_argument("id")
    parser.add_argument("redis_url")
    parser.add_argument("policies_file")
    args = parser.parse_args(argv)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_worker(worker_settings(args.id, args.redis_url, args.policies_file), stop)

    run_loop(serve())  # the event loop the services run on
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --- the benchmark scenario ----------------------------------------------------------------------------------

PIPELINE_RUNS: tuple[tuple[str, int, bool], ...] = (
    ("pipeline-1w", 1, False), ("pipeline-2w", 2, False), ("pipeline-4w", 4, False),
    ("pipeline-1w-pinned", 1, True), ("pipeline-2w-pinned", 2, True),
)
"""(row, workers, pinned): pinned runs put worker i on core i (taskset), the dispatcher and Redis unpinned."""


def _start(argv: list[str], work_dir: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=work_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def pipeline_rows(*, nodes: int, pods: int, policies_file: str, work_dir: str,
                        progress: Callable[[str, int, int], None]) -> dict[str, dict[str, Any]]:
    """Every pipeline run on a redis-server of its own: pods/s and CPU ms per pod of each process."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    redis_process = _start([shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "",
                            "--appendonly", "no", "--bind", "127.0.0.1"], work_dir)
    redis = Redis.from_url(url, decode_responses=True)
    sends = PipelinedRedis(url)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(100):
            try:
                await redis.ping()
                break
            except (OSError, RedisError):
                await asyncio.sleep(0.05)
        node_objects = [node_object(f"pn{i:05d}") for i in range(nodes)]
        for row, count, pinned in PIPELINE_RUNS:
            if pinned and (os.cpu_count() or 1) < count:
                continue
            progress(f"pipeline ceiling: {row} (binding replaced by a sink, no apiserver)", 0, pods)
            await prepare_ledger(redis, node_objects)
            workers = []
            for i in range(count):
                argv = [sys.executable, "-m", "bench.pipeline", "worker", f"pw{i}", url, policies_file]
                if pinned:
                    argv = ["taskset", "-c", str(i), *argv]
                workers.append(_start(argv, work_dir))
            try:
                meter = CpuMeter({"redis-server": redis_process.pid, "dispatcher": os.getpid(),
                                  **{f"hoss-worker-pw{i}": w.pid for i, w in enumerate(workers)}})
                driving = asyncio.create_task(drive(redis, [pod_object(n) for n in range(pods)],
                                                    expected_workers=count, timeout=300, on_start=meter.start,
                                                    sends=sends))
                run = await driving
                spent = meter.stop()
            finally:
                for worker in workers:
                    worker.terminate()
                for worker in workers:
                    try:
                        worker.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        worker.kill()
                        worker.wait()
            scale = 1000 / pods
            per_worker = {name.removeprefix("hoss-worker-"): round(s * scale, 3) for name, s in spent.items()
                          if name.startswith("hoss-worker-")}
            groups = {"dispatcher": spent.get("dispatcher", 0.0), "redis-server": spent.get("redis-server", 0.0),
                      "workers": sum(s for name, s in spent.items() if name.startswith("hoss-worker-"))}
            per_1000 = {group: round(seconds * scale, 3) for group, seconds in groups.items()}
            per_1000["hoss-side"] = round(sum(groups.values()) * scale, 3)
            per_1000["total"] = per_1000["hoss-side"]
            rows[row] = {"pods": pods, "bound": run.bound, "pods_per_second": round(run.pods_per_second, 1),
                         "workers": count, "pinned": pinned, "cpu_seconds": spent, "cpu_per_1000_pods": per_1000,
                         "cpu_per_1000_pods_per_worker": per_worker,
                         "note": "dispatcher + workers + ledger on a real redis-server; bindings into a sink, no "
                                 "apiserver; 'dispatcher' is the bench process (dispatcher and driver)"}
            progress("", run.bound, pods)
    finally:
        await sends.aclose()
        await redis.aclose()
        redis_process.terminate()
        redis_process.wait(timeout=15)
    return rows
