"""`hoss bench --quick` runs end to end and reports every figure (their values are not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SYSTEMS = {"kube-scheduler", "apiserver-ceiling", "apiserver-ceiling+webhook", "hoss-1w", "hoss-2w"}


@pytest.mark.timeout(900)
def test_quick_bench_reports_every_scenario_and_figure(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "bench", "--quick", "--dir", str(tmp_path / "plane"),
         "--json", str(tmp_path / "bench.json"), "--chart", str(tmp_path / "bench.png")],
        capture_output=True, text=True, timeout=840, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert {"date", "machine", "versions", "scenarios"} <= figures.keys()
    assert figures["versions"]["kubernetes"].startswith("v1.")

    throughput = figures["scenarios"]["throughput"]
    assert set(throughput) == SYSTEMS
    for system, row in throughput.items():
        assert {"pods", "bound", "pods_per_second"} <= row.keys(), system
        if "ceiling" not in system:
            assert {"p50_ms", "p90_ms", "p99_ms"} <= row.keys(), system

    contention = figures["scenarios"]["contention"]
    assert {"2x kube-scheduler", "hoss 4w + kube-scheduler, resolver"} <= contention.keys()
    assert all({"placed", "oversold_nodes"} <= contention[s].keys()
               for s in ("2x kube-scheduler", "hoss 4w + kube-scheduler, resolver"))

    core = figures["scenarios"]["core_scale"]
    assert set(core) == {"1000", "5000"}
    assert all({"decision_p50_ms", "decision_p99_ms", "decisions_per_second"} <= row.keys() for row in core.values())

    gpu = figures["scenarios"]["gpu_mix"]
    systems = [k for k, v in gpu.items() if isinstance(v, dict)]
    assert len(systems) == 2
    assert all({"placed", "fully_free_gpu_nodes", "stranded_gpus"} <= gpu[s].keys() for s in systems)

    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for heading in ("1. throughput", "2. contention", "3. worker core", "4. GPU mix"):
        assert heading in result.stdout
