"""Benchmark output: a terminal table with ratios against kube-scheduler, a JSON file and a PNG chart."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "n/a"


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    tput = results["scenarios"].get("throughput", {})
    if tput:
        base = tput.get("kube-scheduler", {}).get("pods_per_second", 0.0)
        lines.append("1. throughput (first pod created -> last pod bound)")
        lines.append(f"   {'system':<28}{'pods/s':>9}{'vs kube':>9}{'bound':>8}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
        for system, r in tput.items():
            lines.append(
                f"   {system:<28}{r['pods_per_second']:>9.1f}{ratio(r['pods_per_second'], base):>9}"
                f"{r['bound']:>8}{r.get('p50_ms', float('nan')):>9.1f}{r.get('p90_ms', float('nan')):>9.1f}"
                f"{r.get('p99_ms', float('nan')):>9.1f}"
            )
    cont = results["scenarios"].get("contention", {})
    if cont:
        lines.append(f"2. contention (demand {cont['demand_cpu']} cpu on {cont['capacity_cpu']} cpu of nodes)")
        lines.append(f"   {'system':<40}{'placed':>8}{'oversold nodes':>16}")
        for system, r in cont.items():
            if isinstance(r, dict):
                lines.append(f"   {system:<40}{r['placed']:>8}{r['oversold_nodes']:>16}")
    core = results["scenarios"].get("core_scale", {})
    if core:
        lines.append("3. worker core: one decision (filter + score + choose), in process")
        lines.append(f"   {'nodes':>8}{'p50 ms':>10}{'p99 ms':>10}{'decisions/s':>13}")
        for nodes, r in core.items():
            lines.append(f"   {nodes:>8}{r['decision_p50_ms']:>10.3f}{r['decision_p99_ms']:>10.3f}"
                         f"{r['decisions_per_second']:>13.1f}")
    gpu = results["scenarios"].get("gpu_mix", {})
    if gpu:
        lines.append(f"4. GPU mix ({gpu['gpus_requested']} GPUs of 1/2/4/8-GPU pods on {gpu['gpu_nodes']} 8-GPU nodes)")
        lines.append(f"   {'system':<28}{'placed':>8}{'free nodes':>12}{'partly used':>13}{'stranded GPUs':>15}")
        for system, r in gpu.items():
            if isinstance(r, dict):
                lines.append(f"   {system:<28}{r['placed']:>8}{r['fully_free_gpu_nodes']:>12}"
                             f"{r['partly_used_gpu_nodes']:>13}{r['stranded_gpus']:>15}")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))


def chart(results: dict[str, Any], path: Path) -> None:
    """Throughput per system (hoss by worker count) and latency percentiles, side by side."""
    tput = results["scenarios"].get("throughput", {})
    systems = [s for s in tput if "ceiling" not in s]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = ["#7f7f7f" if s == "kube-scheduler" else "#1f77b4" for s in systems]
    left.bar(systems, [tput[s]["pods_per_second"] for s in systems], color=colours)
    for name, style in (("apiserver-ceiling", "--"), ("apiserver-ceiling+webhook", ":")):
        if name in tput:
            left.axhline(tput[name]["pods_per_second"], linestyle=style, color="#d62728", label=name)
    left.set_ylabel("pods bound per second")
    left.set_title("Throughput (first create -> last bound)")
    left.legend(loc="upper left", fontsize=8)
    width = 0.25
    positions = range(len(systems))
    for offset, key in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        right.bar([p + (offset - 1) * width for p in positions], [tput[s].get(key, 0) for s in systems],
                  width=width, label=key.replace("_ms", ""))
    right.set_xticks(list(positions), systems)
    right.set_ylabel("ms, pod created -> bound")
    right.set_title("Scheduling latency percentiles")
    right.legend(fontsize=8)
    for axis in (left, right):
        axis.tick_params(axis="x", labelrotation=20, labelsize=8)
    figure.suptitle(f"hoss vs kube-scheduler on {results['machine']['cpus']} cores, {results['date']}", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
