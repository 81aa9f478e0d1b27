"""CPU accounting of a run: each plane process's CPU seconds summed into groups (several kube-schedulers or workers
add up) and scaled to CPU milliseconds per pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The processes whose CPU every throughput run accounts for, in the order the JSON and the chart list them.
PROCESS_GROUPS = ("kube-apiserver", "etcd", "kwok", "kube-scheduler", "dispatcher", "workers", "resolver",
                  "redis-server", "bench")


def process_group(name: str) -> str:
    """The CPU-accounting group of a plane process (several kube-schedulers or workers add up)."""
    for prefix, group in (("kube-scheduler", "kube-scheduler"), ("hoss-dispatcher", "dispatcher"),
                          ("hoss-worker", "workers"), ("hoss-resolver", "resolver")):
        if name.startswith(prefix):
            return group
    return name


def cpu_figures(spent: Mapping[str, float], pods: int) -> dict[str, Any]:
    """CPU seconds per 1,000 pods per process group (= CPU milliseconds per pod), per worker, and the sums the
    table shows: hoss-side (dispatcher + workers + redis-server) and total (every process, the bench included)."""
    per_group = dict.fromkeys(PROCESS_GROUPS, 0.0)
    per_worker: dict[str, float] = {}
    scale = 1000 / pods if pods else 0.0
    for name, seconds in spent.items():
        group = process_group(name)
        per_group[group] = per_group.get(group, 0.0) + seconds
        if group == "workers":
            per_worker[name.removeprefix("hoss-worker-")] = round(seconds * scale, 3)
    per_1000 = {group: round(seconds * scale, 3) for group, seconds in per_group.items()}
    per_1000["hoss-side"] = round((per_group["dispatcher"] + per_group["workers"] + per_group["redis-server"]) * scale,
                                  3)
    per_1000["total"] = round(sum(per_group.values()) * scale, 3)
    return {"cpu_seconds": dict(spent), "cpu_per_1000_pods": per_1000, "cpu_per_1000_pods_per_worker": per_worker}
