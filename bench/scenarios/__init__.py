"""The benchmark scenarios: hoss and kube-scheduler on the same plane, nodes and pods, each system alone.

Every scenario gets a fresh set of kwok nodes and pods and cleans up after itself. Each system runs with only
what it needs (``Bench.kube_alone`` / ``Bench.hoss_alone``): kube-scheduler without hoss's dispatcher, workers,
resolver and webhook; hoss without the plane's kube-scheduler. Figures are returned as plain dicts per system;
the report turns them into ratios against kube-scheduler and into the targets.

One module per scenario (`throughput`, `contention`, `core_scale`, `gpu_mix`; the GPU churn scenario is
bench/churn.py), on what they share: `harness` (`Bench` and its helpers), `sizes` (how big each scenario is) and
`cpu` (CPU accounting per process group). This package's names are what bench/run.py drives.
"""

from __future__ import annotations

from bench.scenarios.contention import contention_header, contention_hoss, contention_kube
from bench.scenarios.core_scale import core_scale, core_scale_kube, kube_feasible_nodes_sought
from bench.scenarios.cpu import PROCESS_GROUPS, cpu_figures
from bench.scenarios.gpu_mix import gpu_header, gpu_mix_hoss, gpu_mix_kube
from bench.scenarios.harness import Bench
from bench.scenarios.sizes import FULL, QUICK, Size
from bench.scenarios.throughput import (
    ThroughputHook,
    take_medians,
    throughput_again,
    throughput_hoss,
    throughput_kube,
)

__all__ = [
    "FULL",
    "PROCESS_GROUPS",
    "QUICK",
    "Bench",
    "Size",
    "ThroughputHook",
    "contention_header",
    "contention_hoss",
    "contention_kube",
    "core_scale",
    "core_scale_kube",
    "cpu_figures",
    "gpu_header",
    "gpu_mix_hoss",
    "gpu_mix_kube",
    "kube_feasible_nodes_sought",
    "take_medians",
    "throughput_again",
    "throughput_hoss",
    "throughput_kube",
]
