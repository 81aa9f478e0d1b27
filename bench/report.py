"""Benchmark output: a terminal table with ratios against kube-scheduler, the targets met or not (computed from
the figures), a JSON file and a PNG chart."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench import churn as churn_scenario
from bench.scenarios import PROCESS_GROUPS

# The CPU columns of the throughput table (CPU seconds per 1,000 pods); every process is in the JSON.
CPU_COLUMNS = (("hoss-side", "hoss*"), ("resolver", "resolver"), ("kube-apiserver", "apiserver"),
               ("kube-scheduler", "kube-sch"), ("total", "total"))
HOSS_ROW = re.compile(r"^hoss-(\d+)w$")
CORE_TARGET_NODES = ("5000", "20000")
# The rows whose pods/s a target compares, made again in interleaved rounds (bench/scenarios.py throughput_again).
COMPARED = (("hoss-1w", "kube-scheduler"), ("hoss-4w", "hoss-1w"), ("apiserver-ceiling+webhook", "apiserver-ceiling"))


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "n/a"


def _number(value: Any, width: int, digits: int = 1) -> str:
    if isinstance(value, int | float) and not math.isnan(value):
        return f"{value:>{width}.{digits}f}"
    return f"{'-':>{width}}"


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    scenarios = results["scenarios"]
    tput = scenarios.get("throughput", {})
    if tput:
        base = tput.get("kube-scheduler", {}).get("pods_per_second", 0.0)
        lines.append("1. throughput (first pod created -> last pod bound; each system alone on the plane) and CPU "
                     "seconds per 1,000 pods (= CPU ms per pod)")
        cpu_head = "".join(f"{label:>10}" for _key, label in CPU_COLUMNS)
        lines.append(f"   {'system':<26}{'pods/s':>8}{'vs kube':>8}{'bound':>7}{'p50 ms':>9}{'p90 ms':>9}"
                     f"{'p99 ms':>9} |{cpu_head}")
        for system, r in tput.items():
            cpu = r.get("cpu_per_1000_pods", {})
            cpu_cells = "".join(_number(cpu.get(key), 10, 2) for key, _label in CPU_COLUMNS)
            lines.append(
                f"   {system:<26}{r['pods_per_second']:>8.1f}{ratio(r['pods_per_second'], base):>8}"
                f"{r['bound']:>7}{_number(r.get('p50_ms'), 9)}{_number(r.get('p90_ms'), 9)}"
                f"{_number(r.get('p99_ms'), 9)} |{cpu_cells}"
            )
        lines.append("   * hoss = dispatcher + workers + redis-server; total = every process (etcd, kwok and the "
                     "benchmark's load generator too); per process and per worker in the JSON")
        repeated = {system: r["runs_pods_per_second"] for system, r in tput.items() if r.get("runs_pods_per_second")}
        if repeated:
            lines.append(f"   {', '.join(repeated)}: the run with the median pods/s of "
                         f"{max(len(runs) for runs in repeated.values())}, interleaved (kube-scheduler alone and "
                         "hoss alone in each round, which goes first alternating); pods/s of every run in order:")
            lines.extend(f"     {system}: " + " / ".join(_number(value, 0) for value in runs)
                         + _run_latencies(tput[system]) for system, runs in repeated.items())
            for top, bottom in COMPARED:
                rounds = per_round(tput, top, bottom)
                if rounds is not None:
                    lines.append(f"     {top} / {bottom} in each round: "
                                 + " / ".join(f"{r:.2f}x" for r in rounds)
                                 + f" (median {statistics.median(rounds):.2f}x; the targets read this)")
        for system, r in tput.items():
            if r.get("bound") != r.get("pods"):
                lines.append(f"   ! {system}: only {r.get('bound')} of {r.get('pods')} pods bound (the run gives up "
                             "after 15 s without a binding); its figures are not comparable")
        pinned = _pinned_scaling(tput)
        if pinned is not None:
            lines.append(f"   pinned-core scaling: hoss-2w-pinned / hoss-1w-pinned = {pinned:.2f}x "
                         "(worker i on core i, the rest of the plane unpinned)")
    cont = scenarios.get("contention", {})
    if cont:
        lines.append(f"2. contention (demand {cont['demand_cpu']} cpu on {cont['capacity_cpu']} cpu of nodes)")
        lines.append(f"   {'system':<40}{'placed':>8}{'oversold nodes':>16}")
        for system, r in cont.items():
            if isinstance(r, dict):
                lines.append(f"   {system:<40}{r['placed']:>8}{r['oversold_nodes']:>16}")
    core = scenarios.get("core_scale", {})
    if core:
        lines.extend(_core_lines(core))
    gpu = scenarios.get("gpu_mix", {})
    if gpu:
        lines.append(f"4. GPU mix ({gpu['gpus_requested']} GPUs of 1/2/4/8-GPU pods on {gpu['gpu_nodes']} 8-GPU nodes)")
        lines.append(f"   {'system':<30}{'placed':>8}{'free nodes':>12}{'partly used':>13}{'stranded GPUs':>15}")
        for system, r in gpu.items():
            if isinstance(r, dict):
                lines.append(f"   {system:<30}{r['placed']:>8}{r['fully_free_gpu_nodes']:>12}"
                             f"{r['partly_used_gpu_nodes']:>13}{r['stranded_gpus']:>15}")
        lines.append("   kube-scheduler MostAllocated: NodeResourcesFit scoringStrategy MostAllocated, cpu 1, "
                     "memory 1, nvidia.com/gpu 3 (the upstream bin-packing example)")
    churned = scenarios.get("gpu_churn", {})
    if churned:
        lines.append(churn_scenario.table(churned))
    found = results.get("targets") or targets(results)
    lines.append("targets (from the figures above; a target naming no worker count holds for every hoss-Nw run, the "
                 "worst is shown)")
    width = max(len(t["target"]) for t in found) + 2
    for t in found:
        verdict = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        lines.append(f"   {t['target']:<{width}}{verdict:<14}{t['value']}")
    return "\n".join(lines)


def _core_lines(core: dict[str, Any]) -> list[str]:
    lines = ["3. worker core: one decision (filter + score + choose); hoss in process, kube-scheduler (default "
             "configuration) from its",
             "   scheduler_scheduling_algorithm_duration_seconds over kwok nodes (p50 interpolated in the "
             "histogram's bucket, mean exact)",
             f"   {'nodes':>8}{'hoss p50':>10}{'hoss p99':>10}{'decisions/s':>13}{'kube p50':>10}{'kube mean':>11}"
             f"{'kube/hoss p50':>15}   (ms)"]
    notes = []
    for nodes, r in core.items():
        kube = r.get("kube_scheduler") or {}
        head = (f"   {nodes:>8}{r['decision_p50_ms']:>10.3f}{r['decision_p99_ms']:>10.3f}"
                f"{r['decisions_per_second']:>13.1f}")
        if r.get("spread_decision_p50_ms") is not None:
            notes.append(f"   hoss at {nodes} nodes, pods with terms (one placed pod of their group per 20 nodes): "
                         f"zone spread p50 {r['spread_decision_p50_ms']:.3f} ms, hostname anti-affinity p50 "
                         f"{r.get('anti_affinity_decision_p50_ms', 0.0):.3f} ms")
        if kube.get("measured"):
            lines.append(f"{head}{_number(kube['decision_p50_ms'], 10, 3)}{_number(kube['decision_mean_ms'], 11, 3)}"
                         f"{ratio(kube['decision_p50_ms'] or 0.0, r['decision_p50_ms']):>15}")
            low, high = kube["p50_bucket_ms"]
            if low == 0.0:
                notes.append(f"   at {nodes} nodes kube-scheduler's p50 lies in its first bucket (0 to {high:g} ms): "
                             "read the mean")
            notes.append(f"   kube-scheduler at {nodes} nodes: {kube['pods']} pods; it stops filtering once "
                         f"{kube['feasible_nodes_sought']} nodes fit (percentageOfNodesToScore), hoss evaluates all; "
                         f"the kwok nodes were Ready {kube['all_nodes_ready_seconds']:.0f} s after creation began")
        else:
            lines.append(f"{head}   kube-scheduler {kube.get('reason', 'not measured')}")
    return lines + notes


def _row_value(rows: dict[str, Any], name: str, key: str) -> float | None:
    value = rows.get(name, {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def _pinned_scaling(tput: dict[str, Any]) -> float | None:
    one, two = (_row_value(tput, f"hoss-{n}w-pinned", "pods_per_second") for n in (1, 2))
    return two / one if one and two is not None else None


def _run_latencies(row: Mapping[str, Any]) -> str:
    """`` (p50 ... ms, p99 ... ms)`` of every run of a repeated row, in order; empty for rows without latencies."""
    p50, p99 = row.get("runs_p50_ms"), row.get("runs_p99_ms")
    if not p50 or not p99:
        return ""
    return (f"   (p50 {' / '.join(f'{value:,.0f}' for value in p50)} ms, "
            f"p99 {' / '.join(f'{value:,.0f}' for value in p99)} ms)")


def per_round(tput: dict[str, Any], top: str, bottom: str) -> list[float] | None:
    """The pods/s of ``top`` over those of ``bottom`` in each round, when both rows were made in the same rounds
    (``runs_pods_per_second`` of equal length, in the order they ran); None otherwise."""
    highs, lows = (tput.get(name, {}).get("runs_pods_per_second") or [] for name in (top, bottom))
    if len(highs) < 2 or len(highs) != len(lows):
        return None
    if not all(isinstance(v, int | float) for v in (*highs, *lows)) or not all(lows):
        return None
    return [high / low for high, low in zip(highs, lows, strict=True)]


def _worst(tput: dict[str, Any], value: Callable[[dict[str, Any]], float | None]) -> tuple[str, float] | None:
    """The hoss-Nw row with the largest ``value``."""
    found = [(name, v) for name, row in tput.items() if HOSS_ROW.match(name) and (v := value(row)) is not None]
    return max(found, key=lambda item: item[1]) if found else None


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue, its measured value and whether it is met (None: not measured in this run)."""
    scenarios = results["scenarios"]
    tput = scenarios.get("throughput", {})
    found: list[dict[str, Any]] = []

    def add(target: str, met: bool | None, value: str, rows: Iterable[str] = ()) -> None:
        """One target; a run it reads that did not bind all its pods makes it not measured."""
        short = [f"{name} bound {tput[name]['bound']} of {tput[name]['pods']} pods" for name in rows
                 if name in tput and tput[name].get("bound") != tput[name].get("pods")]
        if short:
            met, value = None, "incomplete run: " + "; ".join(short)
        found.append({"target": target, "met": met, "value": value})

    hoss_rows = [name for name in tput if HOSS_ROW.match(name)]

    def compared(target: str, top: str, bottom: str, floor: float, percent: bool = False) -> None:
        """A target on the pods/s of ``top`` against ``bottom``. Rows made again in interleaved rounds are judged on
        the median of the per-round ratios (each round's two runs ran minutes apart, on the same drift of the
        machine), not on the ratio of the two median runs, which can pair a fast draw with a slow one."""
        def shown(value: float) -> str:
            return f"{value:.0%}" if percent else f"{value:.2f}x"

        high, low = _row_value(tput, top, "pods_per_second"), _row_value(tput, bottom, "pods_per_second")
        if not low or high is None:
            add(target, None, "n/a")
            return
        medians = f"{shown(high / low)} ({high:.1f} vs {low:.1f}{' pods/s' if percent else ''})"
        rounds = per_round(tput, top, bottom)
        if rounds is None:
            add(target, high / low >= floor, medians, (top, bottom))
            return
        middle = statistics.median(rounds)
        add(target, middle >= floor, f"{shown(middle)}, the median of {len(rounds)} rounds ("
            f"{' / '.join(shown(r) for r in rounds)}); of the median runs {medians}", (top, bottom))

    compared("hoss-1w pods/s >= 1.0x kube-scheduler", "hoss-1w", "kube-scheduler", 1.0)
    compared("hoss-4w pods/s >= 0.95x hoss-1w", "hoss-4w", "hoss-1w", 0.95)

    def cpu(row: dict[str, Any], key: str) -> float | None:
        value = row.get("cpu_per_1000_pods", {}).get(key)
        return float(value) if isinstance(value, int | float) else None

    kube_cpu = cpu(tput.get("kube-scheduler", {}), "kube-scheduler")
    worst_side = _worst(tput, lambda row: cpu(row, "hoss-side"))
    if kube_cpu is not None and worst_side is not None:
        add("hoss-side CPU/pod (dispatcher+workers+redis) <= kube-scheduler's", worst_side[1] <= kube_cpu,
            f"{worst_side[1]:.2f} ms ({worst_side[0]}) vs {kube_cpu:.2f} ms", [*hoss_rows, "kube-scheduler"])
    else:
        add("hoss-side CPU/pod (dispatcher+workers+redis) <= kube-scheduler's", None, "n/a")
    worst_resolver = _worst(tput, lambda row: cpu(row, "resolver"))
    if worst_resolver is not None:
        add("resolver CPU/pod <= 0.5 ms", worst_resolver[1] <= 0.5, f"{worst_resolver[1]:.2f} ms ({worst_resolver[0]})",
            hoss_rows)
    else:
        add("resolver CPU/pod <= 0.5 ms", None, "n/a")
    compared("apiserver ceiling with webhook >= 80% of without", "apiserver-ceiling+webhook", "apiserver-ceiling",
             0.8, percent=True)
    pinned = _pinned_scaling(tput)
    add("hoss 2 workers pinned >= 1.8x 1 worker pinned", None if pinned is None else pinned >= 1.8,
        "n/a" if pinned is None else f"{pinned:.2f}x", ("hoss-1w-pinned", "hoss-2w-pinned"))
    pipeline = {name: row for name, row in tput.items() if name.startswith("pipeline-")}
    best = max(pipeline.items(), key=lambda item: item[1].get("pods_per_second") or 0.0, default=None)
    add("pipeline ceiling >= 2,000 pods/s", None if best is None else best[1]["pods_per_second"] >= 2000,
        "n/a" if best is None else f"{best[1]['pods_per_second']:.0f} pods/s ({best[0]})",
        [best[0]] if best is not None else [])
    one_pinned, two_pinned = (_row_value(tput, f"pipeline-{n}w-pinned", "pods_per_second") for n in (1, 2))
    ratio = two_pinned / one_pinned if one_pinned and two_pinned is not None else None
    add("pipeline: 2 workers pinned >= 1.8x 1 worker pinned", None if ratio is None else ratio >= 1.8,
        "n/a" if ratio is None else f"{ratio:.2f}x ({two_pinned:.0f} vs {one_pinned:.0f} pods/s)",
        ("pipeline-1w-pinned", "pipeline-2w-pinned"))

    core = scenarios.get("core_scale", {})
    for nodes in CORE_TARGET_NODES:
        target = f"decision p50 <= kube-scheduler's at {nodes} nodes"
        row = core.get(nodes)
        if row is None:
            add(target, None, "not run (--quick runs 1000 and 5000 nodes)" if results.get("quick") else "not run")
            continue
        kube_row = row.get("kube_scheduler") or {}
        if not kube_row.get("measured") or kube_row.get("decision_p50_ms") is None:
            add(target, None, f"kube-scheduler {kube_row.get('reason', 'not measured')}")
            continue
        hoss_p50, kube_p50 = row["decision_p50_ms"], kube_row["decision_p50_ms"]
        add(target, hoss_p50 <= kube_p50, f"{hoss_p50:.3f} ms vs {kube_p50:.3f} ms")

    kube_p99 = _row_value(tput, "kube-scheduler", "p99_ms")
    worst_p99 = _worst(tput, lambda row: row.get("p99_ms"))
    if kube_p99 is not None and worst_p99 is not None:
        add("hoss p99 latency <= kube-scheduler's", worst_p99[1] <= kube_p99,
            f"{worst_p99[1]:.1f} ms ({worst_p99[0]}) vs {kube_p99:.1f} ms", [*hoss_rows, "kube-scheduler"])
    else:
        add("hoss p99 latency <= kube-scheduler's", None, "n/a")

    churned = scenarios.get("gpu_churn", {})
    anchor = churned.get("kube-scheduler MostAllocated")
    moved = churned.get("hoss (gpu policy) + rescheduler")
    if isinstance(anchor, dict) and isinstance(moved, dict):
        met = (moved["stranded_gpus"] * 2 <= anchor["stranded_gpus"]
               and moved["fully_free_gpu_nodes"] >= anchor["fully_free_gpu_nodes"] and moved["pods_lost"] == 0
               and moved["max_oversold_during_moves"] == 0)
        add("GPU churn: rescheduler <= half the anchor's stranded GPUs, >= its free nodes", met,
            f"{moved['stranded_gpus']} vs {anchor['stranded_gpus']} stranded, {moved['fully_free_gpu_nodes']} vs "
            f"{anchor['fully_free_gpu_nodes']} free nodes, {moved['pods_lost']} lost, "
            f"{moved['max_oversold_during_moves']} oversold during moves")
    runs = [(f"throughput {name}", row) for name, row in tput.items()]
    runs += [(f"contention {name}", row) for name, row in scenarios.get("contention", {}).items()
             if isinstance(row, dict) and name != "2x kube-scheduler"]
    runs += [(f"GPU mix {name}", row) for name, row in scenarios.get("gpu_mix", {}).items() if isinstance(row, dict)]
    runs += [(f"GPU churn {name}", row) for name, row in churned.items() if isinstance(row, dict)]
    counted = [(name, row["oversold_nodes"]) for name, row in runs if isinstance(row.get("oversold_nodes"), int)]
    oversold = [f"{name}: {n}" for name, n in counted if n]
    unguarded = scenarios.get("contention", {}).get("2x kube-scheduler", {}).get("oversold_nodes")
    aside = f"; unguarded 2x kube-scheduler (not a target): {unguarded}" if unguarded is not None else ""
    add("0 oversold nodes in every run", (not oversold) if counted else None,
        (", ".join(oversold) if oversold else f"0 in {len(counted)} runs") + aside)
    return found


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
    """Throughput per system, CPU per 1,000 pods per process per system (stacked), latency percentiles."""
    tput = results["scenarios"].get("throughput", {})
    systems = [s for s in tput if "ceiling" not in s]
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(18, 5))
    colours = ["#7f7f7f" if s == "kube-scheduler" else "#1f77b4" for s in systems]
    left.bar(systems, [tput[s]["pods_per_second"] for s in systems], color=colours)
    for name, style in (("apiserver-ceiling", "--"), ("apiserver-ceiling+webhook", ":")):
        if name in tput:
            left.axhline(tput[name]["pods_per_second"], linestyle=style, color="#d62728", label=name)
    left.set_ylabel("pods bound per second")
    left.set_title("Throughput (first create -> last bound)")
    left.legend(loc="upper left", fontsize=8)

    everyone = list(tput)
    bottom = [0.0] * len(everyone)
    palette = plt.get_cmap("tab10")
    for index, group in enumerate(PROCESS_GROUPS):
        values = [float(tput[s].get("cpu_per_1000_pods", {}).get(group, 0.0)) for s in everyone]
        if any(values):
            middle.bar(everyone, values, bottom=bottom, label=group, color=palette(index))
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    middle.set_ylabel("CPU seconds per 1,000 pods (= CPU ms per pod)")
    middle.set_title("Where the CPU goes, per process")
    middle.legend(fontsize=7, ncol=2)

    width = 0.25
    positions = range(len(systems))
    for offset, key in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        right.bar([p + (offset - 1) * width for p in positions], [tput[s].get(key, 0) for s in systems],
                  width=width, label=key.replace("_ms", ""))
    right.set_xticks(list(positions), systems)
    right.set_ylabel("ms, pod created -> bound")
    right.set_title("Scheduling latency percentiles")
    right.legend(fontsize=8)
    for axis in (left, middle, right):
        axis.tick_params(axis="x", labelrotation=30, labelsize=7)
        plt.setp(axis.get_xticklabels(), horizontalalignment="right", rotation_mode="anchor")
    figure.suptitle(f"hoss vs kube-scheduler on {results['machine']['cpus']} cores, {results['date']}", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
