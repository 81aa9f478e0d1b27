"""`hoss bench --quick` runs end to end and reports every figure, each present and sane (their values against the
targets are not judged here: the targets block reports them), with no node oversold where the resolver guards."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HOSS_RUNS = {"hoss-1w", "hoss-2w", "hoss-4w", "hoss-1w-pinned", "hoss-2w-pinned"}
PIPELINE_RUNS = {"pipeline-1w", "pipeline-2w", "pipeline-4w", "pipeline-1w-pinned", "pipeline-2w-pinned"}
SYSTEMS = {"kube-scheduler", "apiserver-ceiling", "apiserver-ceiling+webhook", *HOSS_RUNS, *PIPELINE_RUNS}
PROCESS_GROUPS = {"kube-apiserver", "etcd", "kwok", "kube-scheduler", "dispatcher", "workers", "resolver",
                  "redis-server", "bench"}
TARGETS = 12
pytestmark = pytest.mark.bench  # minutes of benchmark runs: `make bench-test`, not `make test`


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_pipeline_row(system: str, row: dict[str, Any]) -> None:
    """Dispatcher + workers + ledger with the binding into a sink: no apiserver, so no latency or oversell."""
    assert row["bound"] == row["pods"] and row["pods"] >= 1000, system
    assert _finite(row["pods_per_second"]) and row["pods_per_second"] > 0, system
    cpu = row["cpu_per_1000_pods"]
    assert cpu["dispatcher"] > 0 and cpu["workers"] > 0 and cpu["redis-server"] > 0, (system, cpu)
    assert math.isclose(cpu["hoss-side"], cpu["dispatcher"] + cpu["workers"] + cpu["redis-server"], abs_tol=0.01)
    assert len(row["cpu_per_1000_pods_per_worker"]) == row["workers"], system


def _check_throughput_row(system: str, row: dict[str, Any]) -> None:
    if system.startswith("pipeline-"):
        _check_pipeline_row(system, row)
        return
    assert row["bound"] == row["pods"], system
    assert _finite(row["pods_per_second"]) and row["pods_per_second"] > 0, system
    assert row["oversold_nodes"] == 0, system
    if "ceiling" not in system:
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"], system
    cpu = row["cpu_per_1000_pods"]
    assert {*PROCESS_GROUPS, "hoss-side", "total"} <= cpu.keys(), system
    assert all(_finite(v) and v >= 0 for v in cpu.values()), (system, cpu)
    # Whatever ran did work: the apiserver and etcd always, the bench (load generator) always.
    assert cpu["kube-apiserver"] > 0 and cpu["etcd"] > 0 and cpu["bench"] > 0, (system, cpu)
    assert cpu["total"] >= max(cpu[g] for g in PROCESS_GROUPS), (system, cpu)
    assert math.isclose(cpu["hoss-side"], cpu["dispatcher"] + cpu["workers"] + cpu["redis-server"], abs_tol=0.01)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_contention(contention: dict[str, Any]) -> None:
    """Demand above capacity (else nothing could be oversold); hoss with the resolver oversells nothing and so
    places no more than fits; unguarded kube-schedulers place something (their oversold nodes are reported)."""
    assert contention["demand_cpu"] > contention["capacity_cpu"] > 0, contention
    for system in ("2x kube-scheduler", "hoss 4w + kube-scheduler, resolver"):
        row = contention[system]
        assert 0 < row["placed"] <= row["pods"], system
        assert _count(row["oversold_nodes"]), system
    hoss = contention["hoss 4w + kube-scheduler, resolver"]
    assert hoss["oversold_nodes"] == 0
    per_pod = contention["demand_cpu"] / hoss["pods"]
    assert hoss["placed"] * per_pod <= contention["capacity_cpu"], hoss


PACKING = ("kube-scheduler MostAllocated", "hoss (gpu policy)", "hoss (binpack policy)")


def check_gpu_mix(gpu: dict[str, Any]) -> None:
    """Every figure a count that adds up; every packing system leaves at least the whole nodes and at most the
    stranded GPUs of kube-scheduler's default (spreading) profile, and hoss's gpu policy does no worse than
    kube-scheduler configured for bin-packing (MostAllocated) or hoss's own binpack policy."""
    systems = {k for k, v in gpu.items() if isinstance(v, dict)}
    assert systems == {"kube-scheduler", *PACKING}
    assert gpu["gpu_nodes"] > 0 and gpu["gpus_requested"] > 0
    for system in systems:
        row = gpu[system]
        assert all(_count(row[k]) for k in ("pods", "placed", "fully_free_gpu_nodes", "partly_used_gpu_nodes",
                                            "stranded_gpus", "oversold_nodes")), (system, row)
        assert 0 < row["placed"] <= row["pods"], system
        assert row["oversold_nodes"] == 0, system
        assert row["fully_free_gpu_nodes"] + row["partly_used_gpu_nodes"] <= gpu["gpu_nodes"], system
        assert row["stranded_gpus"] <= 8 * row["partly_used_gpu_nodes"], system
    spread = gpu["kube-scheduler"]
    for system in PACKING:
        assert gpu[system]["placed"] == gpu[system]["pods"], system
        assert gpu[system]["fully_free_gpu_nodes"] >= spread["fully_free_gpu_nodes"], system
        assert gpu[system]["stranded_gpus"] <= spread["stranded_gpus"], system
    ours = gpu["hoss (gpu policy)"]
    for rival in ("kube-scheduler MostAllocated", "hoss (binpack policy)"):
        assert ours["fully_free_gpu_nodes"] >= gpu[rival]["fully_free_gpu_nodes"], (rival, gpu)
        assert ours["stranded_gpus"] <= gpu[rival]["stranded_gpus"], (rival, gpu)


@pytest.mark.timeout(900)
def test_quick_bench_reports_every_scenario_and_figure(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dev", "bench", "--quick", "--dir", str(tmp_path / "plane"),
         "--json", str(tmp_path / "bench.json"), "--chart", str(tmp_path / "bench.png")],
        capture_output=True, text=True, timeout=840, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert {"date", "machine", "versions", "scenarios", "targets", "seconds"} <= figures.keys()
    assert figures["versions"]["kubernetes"].startswith("v1.")

    throughput = figures["scenarios"]["throughput"]
    assert set(throughput) == SYSTEMS
    for system, row in throughput.items():
        _check_throughput_row(system, row)
    # Each system ran alone: no hoss process during kube-scheduler's run, no kube-scheduler during hoss's.
    kube = throughput["kube-scheduler"]["cpu_per_1000_pods"]
    assert kube["kube-scheduler"] > 0
    assert kube["dispatcher"] == kube["workers"] == kube["resolver"] == 0
    for system in HOSS_RUNS:
        cpu, row = throughput[system]["cpu_per_1000_pods"], throughput[system]
        assert cpu["kube-scheduler"] == 0, system
        assert cpu["dispatcher"] > 0 and cpu["workers"] > 0 and cpu["resolver"] > 0, system
        per_worker = throughput[system]["cpu_per_1000_pods_per_worker"]
        assert len(per_worker) == row["workers"], system
        assert math.isclose(sum(per_worker.values()), cpu["workers"], abs_tol=0.01), system
    assert throughput["hoss-2w-pinned"]["pinned_cpus"] == [0, 1]
    # The rows the targets compare were measured twice, interleaved; each is its median run (of two, the slower).
    for system in ("kube-scheduler", "apiserver-ceiling", "apiserver-ceiling+webhook", "hoss-1w", "hoss-4w"):
        runs = throughput[system]["runs_pods_per_second"]
        assert len(runs) == 2 and throughput[system]["pods_per_second"] == min(runs), system
        if "ceiling" not in system:  # every run's latencies beside its pods/s
            assert len(throughput[system]["runs_p99_ms"]) == 2 and throughput[system]["p99_ms"] in \
                throughput[system]["runs_p99_ms"], system
    assert "runs_pods_per_second" not in throughput["hoss-2w"]
    assert "the run with the median pods/s of 2" in result.stdout
    # ...and the targets comparing them read the ratio of each round's two runs.
    assert "hoss-1w / kube-scheduler in each round: " in result.stdout
    (one,) = [t for t in figures["targets"] if t["target"] == "hoss-1w pods/s >= 1.0x kube-scheduler"]
    assert "the median of 2 rounds" in one["value"], one
    assert throughput["apiserver-ceiling"]["cpu_per_1000_pods"]["resolver"] == 0
    assert throughput["apiserver-ceiling+webhook"]["cpu_per_1000_pods"]["resolver"] > 0

    check_contention(figures["scenarios"]["contention"])

    core = figures["scenarios"]["core_scale"]
    assert set(core) == {"1000", "5000"}
    for nodes, row in core.items():
        assert 0 < row["decision_p50_ms"] <= row["decision_p99_ms"], nodes
        assert row["decisions_per_second"] > 0, nodes
        kube_core = row["kube_scheduler"]
        if kube_core["measured"]:
            assert kube_core["pods"] > 0 and kube_core["decision_p50_ms"] > 0 and kube_core["decision_mean_ms"] > 0
            low, high = kube_core["p50_bucket_ms"]
            assert low <= kube_core["decision_p50_ms"] <= high, nodes
        else:
            assert kube_core["reason"].startswith("not measured: "), nodes

    check_gpu_mix(figures["scenarios"]["gpu_mix"])

    targets = figures["targets"]
    assert len(targets) == TARGETS
    assert all({"target", "met", "value"} <= t.keys() and t["met"] in (True, False, None) for t in targets)
    # Every target is judged from figures of this run, except decisions at 20,000 nodes (not in --quick), and at
    # 5,000 when creating that many kwok nodes was over the bench's cap (which the core scenario then says).
    unjudged = {t["target"] for t in targets if t["met"] is None}
    allowed = {"decision p50 <= kube-scheduler's at 20000 nodes"}
    if not core["5000"]["kube_scheduler"]["measured"]:
        allowed.add("decision p50 <= kube-scheduler's at 5000 nodes")
    assert unjudged == allowed, unjudged
    oversold = next(t for t in targets if t["target"] == "0 oversold nodes in every run")
    assert oversold["met"] is True, oversold

    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for heading in ("1. throughput", "2. contention", "3. worker core", "4. GPU mix", "targets"):
        assert heading in result.stdout


LARGE_SYSTEMS = ("kube-scheduler", "kube-scheduler 100%", "hoss-1w", "hoss-2w")


@pytest.mark.timeout(600)
def test_large_cluster_bench_runs_each_system_alone_at_a_small_size(tmp_path: Path) -> None:
    """`python -m dev bench --large` at a size that fits a test (80 nodes, 120 pods, all of which fit): every run's
    figures, each system alone, nothing oversold, and the per-pod costs it reports beside the runs."""
    result = subprocess.run(
        [sys.executable, "-m", "dev", "bench", "--large", "--large-nodes", "80", "--large-pods", "120",
         "--dir", str(tmp_path / "plane"), "--json", str(tmp_path / "large.json")],
        capture_output=True, text=True, timeout=540, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "large.json").read_text())
    row = figures["sizes"]["80"]
    assert row["gpu_nodes"] == 10 and row["pods"] == 120
    idle = row["idle_cpu_per_second"]
    assert idle["kube-scheduler"]["kube-scheduler"] >= 0 and idle["hoss"]["workers"] >= 0, idle
    assert "kube-scheduler" not in idle["hoss"] or idle["hoss"]["kube-scheduler"] == 0, "hoss idle alone"
    for system in LARGE_SYSTEMS:
        run = row[system]
        assert run["bound"] == run["pods"] == 120, system
        assert run["oversold_nodes"] == 0, system
        assert _finite(run["pods_per_second"]) and 0 < run["p50_ms"] <= run["p99_ms"], system
        cpu = run["cpu_per_1000_pods"]
        hoss = cpu["dispatcher"] + cpu["workers"] + cpu["resolver"]
        assert (cpu["kube-scheduler"] > 0 and hoss == 0) if system.startswith("kube") else \
            (cpu["kube-scheduler"] == 0 and cpu["workers"] > 0), (system, cpu)
    assert row["kube-scheduler"]["decision_mean_ms"] > 0 and row["kube-scheduler 100%"]["decision_mean_ms"] > 0
    assert row["hoss_decision_mean_ms"] > 0
    assert "| kube-scheduler 100% | 120/120 |" in result.stdout, "the page's table of runs"
