"""``hoss bench``: every scenario on one local plane, with a progress bar, a table, JSON and a chart."""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path
from typing import Any

from bench import report, scenarios
from deploy.local import binaries
from deploy.local.cluster import Cluster
from deploy.local.plane import POLICIES_FILE, LocalPlane
from workers.profiles import load_profiles


class ProgressBar:
    """One line on stderr: the step, a bar and a count."""

    def __init__(self) -> None:
        self.step = ""
        self.started = time.monotonic()

    def __call__(self, step: str, done: int, total: int) -> None:
        if step and step != self.step:
            if self.step:
                print(file=sys.stderr)
            self.step = step
        width = 30
        filled = int(width * done / total) if total else 0
        elapsed = time.monotonic() - self.started
        print(f"\r[{elapsed:6.0f}s] {self.step:<62} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}",
              end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        print(file=sys.stderr)


async def run_bench(*, plane: LocalPlane, quick: bool, json_path: Path, chart_path: Path) -> dict[str, Any]:
    size = scenarios.QUICK if quick else scenarios.FULL
    progress = ProgressBar()
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
    async with await Cluster.connect(plane.kubeconfig("admin")) as cluster:
        bench = scenarios.Bench(plane, cluster, progress=progress)
        try:
            results["scenarios"]["throughput"] = await scenarios.throughput(bench, size)
            results["scenarios"]["contention"] = await scenarios.contention(bench, size)
            results["scenarios"]["core_scale"] = scenarios.core_scale(size, policies_file=POLICIES_FILE,
                                                                      progress=progress)
            results["scenarios"]["gpu_mix"] = await scenarios.gpu_mix(bench, size, policy=_gpu_policy())
        finally:
            bench.close()
            progress.close()
    report.write_json(results, json_path)
    report.chart(results, chart_path)
    print(report.table(results))
    print(f"\nJSON: {json_path}\nchart: {chart_path}")
    return results


def _gpu_policy() -> str:
    profiles, _default = load_profiles(str(POLICIES_FILE))
    return "gpu" if "gpu" in profiles else "binpack"
