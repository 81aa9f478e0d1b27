"""``hoss demo``: the whole system on a real local plane, with a live progress bar and a final report.

Brings up the plane (etcd, kube-apiserver, kwok, redis, the resolver webhook), starts a dispatcher and K workers
serving two policies, creates fake CPU and 8-GPU nodes in two pools and a mix of pods, and reports pods bound and
pending, pods/s, ledger conflicts retried, webhook denials, oversold nodes (checked from the apiserver) and pods
per worker. The plane and the hoss processes keep running afterwards, for `hoss status` and kubectl.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis

from deploy.local.cluster import Cluster, Json, oversold_nodes, pod_manifest
from deploy.local.plane import LocalPlane
from dispatcher.queue import WorkQueue

DEMO_NAMESPACE = "hoss-demo"
SCHEDULER_NAME = "hoss"
GPU = "nvidia.com/gpu"


@dataclass
class DemoReport:
    pods_total: int
    pods_bound: int
    pods_pending: int
    seconds: float
    pods_per_second: float
    ledger_conflicts: int
    webhook_denials: int
    oversold_nodes: int
    per_worker: dict[str, int]
    nodes: int
    workers: int
    status_url: str
    pending_reasons: dict[str, int] = field(default_factory=dict)


def worker_layout(count: int) -> list[tuple[str, list[str]]]:
    """K workers over two policies: the first serves default, the last binpack, the others both."""
    layout = []
    for i in range(1, count + 1):
        if count == 1:
            policies = ["default", "binpack"]
        elif i == 1:
            policies = ["default"]
        elif i == count:
            policies = ["binpack"]
        else:
            policies = ["default", "binpack"]
        layout.append((f"w{i}", policies))
    return layout


def demo_pods(count: int, *, seed: int = 7) -> list[Json]:
    """A mix: small and medium CPU pods under the default (spread) policy, GPU pods under binpack."""
    rng = random.Random(seed)
    pods = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.1:
            gpus = rng.choice([1, 1, 2, 2, 4, 8])
            requests = {"cpu": "4", "memory": "16Gi", GPU: str(gpus)}
            policy = "binpack"
        elif roll < 0.4:
            requests = {"cpu": rng.choice(["1", "2"]), "memory": rng.choice(["2Gi", "4Gi"])}
            policy = "binpack"
        else:
            requests = {"cpu": rng.choice(["250m", "500m", "1"]), "memory": rng.choice(["512Mi", "1Gi"])}
            policy = "default"
        pod = pod_manifest(f"demo-{i:05d}", requests=requests, scheduler_name=SCHEDULER_NAME,
                           labels={"hoss.io/policy": policy, "app": "hoss-demo"})
        if GPU in requests:
            pod["spec"]["containers"][0]["resources"]["limits"] = {GPU: requests[GPU]}
        pods.append(pod)
    return pods


async def create_demo_nodes(cluster: Cluster, count: int) -> list[str]:
    """80% CPU nodes, 20% 8-GPU nodes; two pools."""
    gpu_nodes = max(1, count // 5)
    cpu_nodes = count - gpu_nodes
    names = await cluster.create_nodes(
        cpu_nodes // 2, prefix="demo-cpu-a", capacity={"cpu": "16", "memory": "64Gi", "pods": "110"},
        labels={"hoss.io/pool": "pool-a"})
    names += await cluster.create_nodes(
        cpu_nodes - cpu_nodes // 2, prefix="demo-cpu-b", capacity={"cpu": "16", "memory": "64Gi", "pods": "110"},
        labels={"hoss.io/pool": "pool-b"})
    names += await cluster.create_nodes(
        gpu_nodes, prefix="demo-gpu", capacity={"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"},
        labels={"hoss.io/pool": "pool-gpu", "nvidia.com/gpu.present": "true"})
    return names


def _bar(done: int, total: int, rate: float, width: int = 40) -> str:
    filled = int(width * done / total) if total else width
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} bound  {rate:7.1f} pods/s"


async def _cluster_counters(redis: Redis) -> tuple[dict[str, int], int, int]:
    """Per-worker bound counts, ledger conflicts, webhook denials — from heartbeats and resolver stats."""
    live, _dead = await WorkQueue(redis).workers()
    per_worker = {w.id: w.counters.get("bound", 0) for w in live}
    conflicts = sum(w.counters.get("conflicts", 0) for w in live)
    denials = 0
    async for key in redis.scan_iter(match="{hoss}:resolver:*"):
        verdicts = json.loads(await redis.hget(key, "verdicts") or "{}")
        denials += sum(n for reason, n in verdicts.items() if reason not in ("reserved", "fits", "not-enforced",
                                                                             "not-a-binding"))
    return per_worker, conflicts, denials


async def run_demo(
    *, plane: LocalPlane, nodes: int, pods: int, workers: int, as_json: bool, progress: Callable[[str], None]
) -> int:
    plane.up(progress=progress)
    state = plane.state()
    names = {p.name for p in state.processes}
    if "hoss-dispatcher" not in names:
        progress("starting hoss-dispatcher")
        plane.start_dispatcher()
    for worker_id, policies in worker_layout(workers):
        if f"hoss-worker-{worker_id}" not in names:
            progress(f"starting hoss-worker {worker_id} (policies: {', '.join(policies)})")
            plane.start_worker(worker_id, policies=policies)
    state = plane.state()
    dispatcher = next(p for p in state.processes if p.name == "hoss-dispatcher")
    status_url = f"http://127.0.0.1:{dispatcher.port}/status"

    redis = Redis.from_url(state.redis_url, decode_responses=True)
    async with await Cluster.connect(plane.kubeconfig("admin")) as cluster:
        await cluster.ensure_namespace(DEMO_NAMESPACE)
        await cluster.delete_pods(DEMO_NAMESPACE)
        old = [n["metadata"]["name"] for n in await cluster.raw_list("list_node")]
        await cluster.delete_nodes(n for n in old if n.startswith("demo-"))
        progress(f"creating {nodes} fake nodes (CPU nodes in pool-a and pool-b, 8-GPU nodes in pool-gpu)")
        node_names = await create_demo_nodes(cluster, nodes)
        await cluster.wait_nodes_ready(node_names, timeout=180)
        baseline, _, _ = await _cluster_counters(redis)

        progress(f"creating {pods} pods (schedulerName {SCHEDULER_NAME}; policies default and binpack)")
        started = time.monotonic()
        creating = asyncio.create_task(cluster.create_pods(demo_pods(pods), namespace=DEMO_NAMESPACE))
        last_change, bound, last_bound_at = time.monotonic(), -1, started
        while True:
            await asyncio.sleep(1)
            listed = await cluster.raw_list("list_namespaced_pod", DEMO_NAMESPACE)
            now_bound = sum(1 for p in listed if p["spec"].get("nodeName"))
            if now_bound != bound:
                bound, last_change, last_bound_at = now_bound, time.monotonic(), time.monotonic()
            elapsed = max(last_bound_at - started, 1e-6)
            if not as_json:
                print(_bar(bound, pods, bound / elapsed), end="", file=sys.stderr, flush=True)
            # Done when everything is bound, or nothing has moved for a while after creation finished.
            if creating.done() and (bound >= pods or time.monotonic() - last_change > 10):
                break
        await creating
        if not as_json:
            print(file=sys.stderr)
        seconds = max(last_bound_at - started, 1e-6)
        listed = await cluster.raw_list("list_namespaced_pod", DEMO_NAMESPACE)
        oversold = oversold_nodes(await cluster.raw_list("list_node"), listed)
        reasons: Counter[str] = Counter()
        for pod in listed:
            if not pod["spec"].get("nodeName"):
                for condition in pod.get("status", {}).get("conditions") or []:
                    if condition.get("type") == "PodScheduled" and condition.get("message"):
                        reasons[condition["message"]] += 1
        per_worker, conflicts, denials = await _cluster_counters(redis)
    await redis.aclose()
    report = DemoReport(
        pods_total=pods,
        pods_bound=bound,
        pods_pending=pods - bound,
        seconds=round(seconds, 2),
        pods_per_second=round(bound / seconds, 1),
        ledger_conflicts=conflicts,
        webhook_denials=denials,
        oversold_nodes=len(oversold),
        per_worker={w: n - baseline.get(w, 0) for w, n in sorted(per_worker.items())},
        nodes=len(node_names),
        workers=workers,
        status_url=status_url,
        pending_reasons=dict(reasons.most_common(5)),
    )
    if as_json:
        print(json.dumps(asdict(report)))
    else:
        print_report(report, plane)
    return 0 if report.oversold_nodes == 0 else 1


def print_report(report: DemoReport, plane: LocalPlane) -> None:
    rows: list[tuple[str, Any]] = [
        ("pods bound", f"{report.pods_bound} / {report.pods_total}"),
        ("pods pending", report.pods_pending),
        ("time to last binding", f"{report.seconds} s"),
        ("throughput", f"{report.pods_per_second} pods/s"),
        ("ledger conflicts retried", report.ledger_conflicts),
        ("webhook denials", report.webhook_denials),
        ("oversold nodes", report.oversold_nodes),
    ]
    print("\nhoss demo report")
    for label, value in rows:
        print(f"  {label:<26} {value}")
    print("  pods per worker")
    for worker, count in report.per_worker.items():
        print(f"    {worker:<24} {count}")
    if report.pending_reasons:
        print("  why pods wait (kubectl describe pod shows the same)")
        for message, count in report.pending_reasons.items():
            print(f"    {count:>4} x {message}")
    print(f"\nstatus: {report.status_url}   (or: .venv/bin/hoss status)")
    print("The plane keeps running. To use it from this shell:")
    print(plane.exports())
    print("Tear it down with: make down   (or .venv/bin/hoss local down)")
