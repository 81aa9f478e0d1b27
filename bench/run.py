"""``python -m dev bench``: every scenario on one local plane, with a progress bar, a table, JSON, a chart and its page
(docs/benchmarks.md for the default JSON, bench/page.py). ``python -m dev bench --large``: the large-cluster scenario
alone (docs/benchmarks-large.md, bench/large_page.py)."""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import churn, large_page, page, pipeline, report, scenarios
from bench.progress import ProgressBar
from bench.scenarios.large import LargeSize, large_clusters
from dev.local import binaries
from dev.local.cluster import Cluster
from dev.local.errors import PlaneError
from dev.local.plane import POLICIES_FILE, LocalPlane
from hoss.framework.profiles import load_profiles


async def _pipeline_ceiling(bench: scenarios.Bench, size: scenarios.Size) -> dict[str, Any]:
    """Dispatcher + workers + ledger with the binding replaced by a sink (bench/pipeline.py): hoss's own ceiling
    per CPU-second, apart from the apiserver."""
    return await pipeline.pipeline_rows(nodes=size.nodes, pods=max(size.pods, PIPELINE_MIN_PODS),
                                        policies_file=str(POLICIES_FILE), work_dir=os.getcwd(),
                                        progress=bench.progress)


PIPELINE_MIN_PODS = 1000
PIPELINE_CEILING: scenarios.ThroughputHook | None = _pipeline_ceiling


async def run_bench(*, plane: LocalPlane, quick: bool, json_path: Path, chart_path: Path,
                    plane_kept: bool = True) -> dict[str, Any]:
    """Every scenario, each system alone; the plane is restored afterwards (``plane_kept`` False: the caller tears
    it down, so the thousands of worker-core nodes are left for that)."""
    size = scenarios.QUICK if quick else scenarios.FULL
    gpu_policies = _gpu_policies()  # a policies file hoss cannot read fails here, not minutes later
    progress = ProgressBar()
    started = time.monotonic()
    plane.up(progress=lambda message: progress(message, 0, 1))
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": quick,
        "machine": report.machine(),
        "versions": {"kubernetes": binaries.KUBERNETES_VERSION, "etcd": binaries.ETCD_VERSION,
                     "kwok": binaries.KWOK_VERSION, "hoss": "0.1.0"},
        "size": size.__dict__,
        "scenarios": {},
    }
    figures: dict[str, Any] = results["scenarios"]
    async with await Cluster.connect(plane.kubeconfig("admin")) as cluster:
        bench = scenarios.Bench(plane, cluster, progress=progress)
        try:
            # kube-scheduler alone: hoss's dispatcher, workers and resolver stopped, the webhook unregistered.
            bench.kube_alone()
            throughput = await scenarios.throughput_kube(bench, size)
            contention = {**scenarios.contention_header(size),
                          "2x kube-scheduler": await scenarios.contention_kube(bench, size)}
            gpu = {**scenarios.gpu_header(size), **await scenarios.gpu_mix_kube(bench, size)}
            # GPU mix with churn (bench/churn.py), full runs only: kube-scheduler MostAllocated as the anchor.
            churned = {} if quick else await churn.churn_kube(bench)
            # hoss alone: the plane's kube-scheduler stopped, the resolver up with its webhook registered.
            bench.hoss_alone()
            throughput.update(await scenarios.throughput_hoss(bench, size, pipeline_ceiling=PIPELINE_CEILING))
            figures["throughput"] = throughput
            contention["hoss 4w + kube-scheduler, resolver"] = await scenarios.contention_hoss(bench, size)
            figures["contention"] = contention
            gpu.update(await scenarios.gpu_mix_hoss(bench, size, policies=gpu_policies))
            figures["gpu_mix"] = gpu
            if not quick:
                churned.update(await churn.churn_hoss(bench))
                figures["gpu_churn"] = churned
            # kube-scheduler, hoss-1w and hoss-4w again, interleaved; each row becomes its median run.
            scenarios.take_medians(throughput, await scenarios.throughput_again(bench, size))
            hoss_core = scenarios.core_scale(size, policies_file=POLICIES_FILE, progress=progress)
            # kube-scheduler alone again, last: its worker-core scenario leaves thousands of nodes behind.
            bench.kube_alone()
            kube_core = await scenarios.core_scale_kube(bench, size, delete_nodes=plane_kept)
            figures["core_scale"] = {count: {**row, "kube_scheduler": kube_core.get(count)}
                                     for count, row in hoss_core.items()}
        finally:
            progress.close()
            try:
                bench.restore()
            except PlaneError as error:  # never hide the run's own error behind this one
                print(f"[bench] could not restore the plane: {error}", file=sys.stderr)
    results["targets"] = report.targets(results)
    results["seconds"] = round(time.monotonic() - started, 1)
    report.write_json(results, json_path)
    report.chart(results, chart_path)
    page_path = page.page_for(json_path)
    page.write(json_path=json_path, page_path=page_path, chart_path=chart_path,
               churn_path=page.DEFAULT_CHURN if page_path == page.DEFAULT_PAGE else None)
    print(report.table(results))
    print(f"\nJSON: {json_path}\nchart: {chart_path}\npage: {page_path}\nbench took {results['seconds']:.0f} s")
    return results


async def run_large(*, plane: LocalPlane, size: LargeSize, json_path: Path, page_path: Path | None) -> dict[str, Any]:
    """The large-cluster scenario alone (bench/scenarios/large.py); writes its JSON and, given ``page_path``, its
    page. The plane is restored afterwards."""
    progress = ProgressBar()
    started = time.monotonic()
    plane.up(progress=lambda message: progress(message, 0, 1))
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": report.machine(),
        "versions": {"kubernetes": binaries.KUBERNETES_VERSION, "etcd": binaries.ETCD_VERSION,
                     "kwok": binaries.KWOK_VERSION, "hoss": "0.1.0"},
        "size": {"nodes": list(size.nodes), "pods": size.pods},
    }
    async with await Cluster.connect(plane.kubeconfig("admin")) as cluster:
        bench = scenarios.Bench(plane, cluster, progress=progress)
        try:
            results["sizes"] = await large_clusters(bench, size, policies_file=POLICIES_FILE)
        finally:
            progress.close()
            try:
                bench.restore()
            except PlaneError as error:  # never hide the run's own error behind this one
                print(f"[bench] could not restore the plane: {error}", file=sys.stderr)
    results["seconds"] = round(time.monotonic() - started, 1)
    report.write_json(results, json_path)
    text = large_page.render(results)
    if page_path is not None:
        await asyncio.to_thread(page_path.write_text, text)
    print(text)
    print(f"\nJSON: {json_path}\nbench took {results['seconds']:.0f} s")
    return results


def _gpu_policies() -> list[str]:
    """hoss's gpu policy and its binpack policy (those of them that configs/policies.yaml has)."""
    profiles, _default = load_profiles(str(POLICIES_FILE))
    return [p for p in ("gpu", "binpack") if p in profiles] or [_default]
