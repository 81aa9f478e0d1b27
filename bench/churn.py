"""GPU mix with churn: fragmentation after pods come and go, with and without the rescheduler.

Every system gets the same story on 24 fresh 8-GPU nodes: 1/2/4/8-GPU pods (each the one pod of a ReplicaSet, so
that a controller recreates a moved pod) created one at a time until 60 % of the GPUs are asked for; every third
ReplicaSet deleted; the same number of GPUs asked for again (new ReplicaSets, other shapes). Then: GPUs stranded
on partly used nodes, whole free nodes, pods placed. kube-scheduler runs configured for GPU packing
(NodeResourcesFit MostAllocated with nvidia.com/gpu weighted 3, the anchor); hoss runs its gpu policy, is
measured, and then hoss-rescheduler runs (periodic pass, every second) until it finds no plan three rounds in a
row, with the independent oversell check polled throughout; hoss is measured again. kube-controller-manager runs
for both systems (ReplicaSets need it).

Run it alone: ``python -m bench.churn`` (its own plane under the bench's state directory, torn down afterwards;
``--keep`` leaves it running).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.progress import ProgressBar
from bench.scenarios.gpu_mix import GPU_NODE, GPU_PACKING_PLUGIN_CONFIG, GPU_PACKING_SCHEDULER, gpu_figures
from bench.scenarios.harness import CONTROLLER_MANAGER, GPU, RUN_LABEL, Bench
from dev.local.cluster import Cluster, oversold_nodes
from dev.local.errors import PlaneError
from dev.local.plane import LocalPlane
from dev.local.state import Process, default_directory
from hoss.model.objects import Json

CHURN_NODES = 24
SHARE = 0.6


def _shapes(total: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    shapes, asked = [], 0
    while asked < total:
        gpus = rng.choice([1, 1, 2, 2, 4, 8])
        shapes.append(gpus)
        asked += gpus
    return shapes


def _replicaset(name: str, gpus: int, scheduler: str, policy: str | None) -> Json:
    labels = {"app": name, **({"hoss.io/policy": policy} if policy else {})}
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": {"labels": labels},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {
                         "requests": {"cpu": "1", "memory": "4Gi", GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}]},
        }},
    }


async def _pods(cluster: Cluster, namespace: str) -> list[Json]:
    return [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
            if not p["metadata"].get("deletionTimestamp")]


async def _wait_bound(cluster: Cluster, namespace: str, count: int, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = await _pods(cluster, namespace)
        if sum(1 for p in pods if p["spec"].get("nodeName")) >= count:
            return
        await asyncio.sleep(0.1)


async def _create(bench: Bench, namespace: str, names_shapes: list[tuple[str, int]], *, scheduler: str,
                  policy: str | None, bound_before: int) -> int:
    """Create the ReplicaSets one at a time, each waited for (placement order matters, not speed)."""
    bound = bound_before
    for i, (name, gpus) in enumerate(names_shapes):
        manifest = bench.plane.directory / f"{namespace}-rs.json"
        manifest.write_text(json.dumps(_replicaset(name, gpus, scheduler, policy)))
        await asyncio.to_thread(bench.plane.kubectl, "apply", "-n", namespace, "-f", str(manifest))
        await _wait_bound(bench.cluster, namespace, bound + 1)
        bound = sum(1 for p in await _pods(bench.cluster, namespace) if p["spec"].get("nodeName"))
        bench.progress("", i + 1, len(names_shapes))
    return bound


async def _cleanup(bench: Bench, namespace: str, nodes: list[str]) -> None:
    """The ReplicaSets first (their controller would recreate the pods), then the pods and nodes."""
    await asyncio.to_thread(bench.plane.kubectl, "delete", "replicasets", "--all", "-n", namespace, "--wait=false")
    await bench.cleanup(namespace, nodes)


async def _figures(bench: Bench, namespace: str, nodes: list[str]) -> dict[str, Any]:
    pods = await _pods(bench.cluster, namespace)
    node_objects = [n for n in await bench.cluster.raw_list("list_node") if n["metadata"]["name"] in nodes]
    return {**gpu_figures(node_objects, pods), "oversold_nodes": len(oversold_nodes(node_objects, pods))}


async def _churn(bench: Bench, system: str, scheduler: str,
                 policy: str | None) -> tuple[str, list[str], dict[str, Any]]:
    """The story up to the measurement; returns the namespace, the nodes and the figures."""
    bench.progress(f"GPU churn: {system}", 0, 1)
    namespace, nodes = await bench.fresh("churn", CHURN_NODES, GPU_NODE)
    total = int(CHURN_NODES * 8 * SHARE)
    first = [(f"first-{i:03d}", g) for i, g in enumerate(_shapes(total, seed=11))]
    await _create(bench, namespace, first, scheduler=scheduler, policy=policy, bound_before=0)
    gone = [(n, g) for i, (n, g) in enumerate(first) if i % 3 == 0]
    for name, _ in gone:
        await asyncio.to_thread(bench.plane.kubectl, "delete", "replicaset", name, "-n", namespace, "--wait=false")
    freed = sum(g for _, g in gone)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(await _pods(bench.cluster, namespace)) <= len(first) - len(gone):
            break
        await asyncio.sleep(0.2)
    again = [(f"again-{i:03d}", g) for i, g in enumerate(_shapes(freed, seed=12))]
    bound = len([p for p in await _pods(bench.cluster, namespace) if p["spec"].get("nodeName")])
    await _create(bench, namespace, again, scheduler=scheduler, policy=policy, bound_before=bound)
    await asyncio.sleep(2)
    figures = await _figures(bench, namespace, nodes)
    figures["replicasets"] = len(first) - len(gone) + len(again)
    figures["gpus_deleted"] = freed
    return namespace, nodes, figures


async def churn_kube(bench: Bench) -> dict[str, Any]:
    """kube-scheduler configured for GPU packing (call with ``kube_alone``; starts kube-controller-manager)."""
    packing = bench.plane.start_scheduler(scheduler_name=GPU_PACKING_SCHEDULER, plugin_config=GPU_PACKING_PLUGIN_CONFIG)
    if bench.plane.running(CONTROLLER_MANAGER) is None:
        bench.plane.start_controller_manager()
    try:
        namespace, nodes, figures = await _churn(bench, "kube-scheduler MostAllocated", GPU_PACKING_SCHEDULER, None)
        await _cleanup(bench, namespace, nodes)
        return {"kube-scheduler MostAllocated": figures}
    finally:
        bench.stop([packing])
        bench.plane.stop_process(CONTROLLER_MANAGER)


async def churn_hoss(bench: Bench, *, policy: str = "gpu", settle_seconds: float = 240.0) -> dict[str, Any]:
    """hoss's gpu policy, then hoss-rescheduler over the same cluster (call with ``hoss_alone``)."""
    if bench.plane.running(CONTROLLER_MANAGER) is None:
        bench.plane.start_controller_manager()
    processes = bench.start_hoss(1, policies=[policy])
    rescheduler: Process | None = None
    try:
        namespace, nodes, before = await _churn(bench, f"hoss ({policy} policy)", "hoss", policy)
        run = (await bench.cluster.raw_list("list_node", label_selector=f"{RUN_LABEL}"))
        run_label = next(n["metadata"]["labels"][RUN_LABEL] for n in run if n["metadata"]["name"] == nodes[0])
        bench.progress("GPU churn: hoss-rescheduler", 0, 1)
        started = time.monotonic()
        oversold_seen: list[int] = []

        async def poll_oversell() -> None:
            while True:
                all_nodes = await bench.cluster.raw_list("list_node")
                all_pods = await bench.cluster.raw_list("list_pod_for_all_namespaces")
                oversold_seen.append(len(oversold_nodes(all_nodes, all_pods)))
                await asyncio.sleep(0.5)

        watch = asyncio.create_task(poll_oversell())
        rescheduler = bench.plane.start_rescheduler(name="hoss-rescheduler-bench", extra_args=[
            f"--node-selector={RUN_LABEL}={run_label}", "--interval-seconds=1", "--min-stranded-gpus=1",
            "--min-pending-seconds=5", "--max-evictions-per-minute=120", "--outcome-timeout-seconds=60",
            "--lease-name=hoss-rescheduler-bench"])
        url = f"http://127.0.0.1:{rescheduler.port}/status"
        quiet, last_rounds, plans = 0, -1, 0
        status: dict[str, Any] = {}
        while time.monotonic() - started < settle_seconds and quiet < 3:
            await asyncio.sleep(1.0)
            with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=5) as response:  # noqa: ASYNC210
                status = json.loads(response.read())
            rounds = int(status.get("rounds") or 0)
            history = status.get("plans") or []
            if rounds != last_rounds:
                busy = any(p.get("outcome") in ("holding", "evicting", "waiting") for p in history)
                if len(history) == plans and not busy and rounds > 0:
                    quiet += 1
                else:
                    quiet = 0
                plans, last_rounds = len(history), rounds
            bench.progress("", min(plans, 20), 20)
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await asyncio.sleep(2)
        after = await _figures(bench, namespace, nodes)
        history = status.get("plans") or []
        after.update({
            "plans": len(history),
            "completed_plans": sum(1 for p in history if p.get("outcome") == "completed"),
            "pods_moved": sum(len(p.get("evicted") or []) for p in history),
            "evictions": int(status.get("evictions") or 0),
            "oversold_checks": len(oversold_seen),
            "max_oversold_during_moves": max(oversold_seen, default=0),
            "pods_lost": before["replicasets"] - after["placed"],
            "seconds": round(time.monotonic() - started, 1),
            "outcomes": [p.get("outcome") for p in history],
        })
        await _cleanup(bench, namespace, nodes)
        return {f"hoss ({policy} policy)": before, f"hoss ({policy} policy) + rescheduler": after}
    finally:
        if rescheduler is not None:
            bench.plane.stop_process(rescheduler.name)
        bench.stop(processes)
        bench.plane.stop_process(CONTROLLER_MANAGER)


def table(churn: dict[str, Any]) -> str:
    lines = [f"4b. GPU mix with churn ({CHURN_NODES} 8-GPU nodes, pods to 60 %, a third deleted, demand added "
             "again; every pod a ReplicaSet's)",
             f"   {'system':<38}{'placed':>8}{'free nodes':>12}{'partly used':>13}{'stranded GPUs':>15}"]
    for system, r in churn.items():
        if isinstance(r, dict):
            lines.append(f"   {system:<38}{r['placed']:>8}{r['fully_free_gpu_nodes']:>12}"
                         f"{r['partly_used_gpu_nodes']:>13}{r['stranded_gpus']:>15}")
    for system, r in churn.items():
        if isinstance(r, dict) and "plans" in r:
            lines.append(f"   {system}: {r['plans']} plans ({r['completed_plans']} completed), {r['pods_moved']} pods "
                         f"moved, {r['pods_lost']} pods lost, oversold nodes during the moves: at most "
                         f"{r['max_oversold_during_moves']} in {r['oversold_checks']} checks, {r['seconds']} s")
    return "\n".join(lines)


async def run(plane: LocalPlane) -> dict[str, Any]:
    progress = ProgressBar()
    plane.up(progress=lambda message: progress(message, 0, 1))
    results: dict[str, Any] = {}
    async with await Cluster.connect(plane.kubeconfig("admin")) as cluster:
        bench = Bench(plane, cluster, progress=progress)
        try:
            bench.kube_alone()
            results.update(await churn_kube(bench))
            bench.hoss_alone()
            results.update(await churn_hoss(bench))
        finally:
            progress.close()
            try:
                bench.restore()
            except PlaneError as error:
                print(f"[bench] could not restore the plane: {error}", file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.churn", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="the plane's state directory (default: the bench's)")
    parser.add_argument("--json", default="bench/results/churn.json", help="where to write the figures")
    parser.add_argument("--keep", action="store_true", help="leave the plane running")
    args = parser.parse_args(argv)
    plane = LocalPlane(Path(args.dir) if args.dir else default_directory().parent / "bench")
    try:
        results = asyncio.run(run(plane))
    finally:
        if not args.keep:
            plane.down()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(table(results))
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
