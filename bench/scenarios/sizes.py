"""How big each benchmark scenario is: the full run, and --quick, which shrinks everything."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    """How big each scenario is; --quick shrinks everything."""

    nodes: int
    pods: int
    worker_counts: tuple[int, ...]
    pinned_worker_counts: tuple[int, ...]
    contention_nodes: int
    contention_pods_per_system: int
    core_nodes: tuple[int, ...]
    core_decisions: int
    kube_core_pods: int
    gpu_nodes: int
    repeats: int = 1
    """How many times the throughput runs the targets compare with each other are made, interleaved
    (`throughput_again`); each of those rows is the run with the median pods/s. This machine's speed drifts by up
    to 2x within minutes, and one draw of each system made the ratio between them a lottery."""


FULL = Size(nodes=500, pods=5000, worker_counts=(1, 2, 4, 8), pinned_worker_counts=(1, 2), contention_nodes=40,
            contention_pods_per_system=120, core_nodes=(1000, 5000, 20000), core_decisions=200, kube_core_pods=300,
            gpu_nodes=32, repeats=3)
QUICK = Size(nodes=50, pods=300, worker_counts=(1, 2, 4), pinned_worker_counts=(1, 2), contention_nodes=10,
             contention_pods_per_system=30, core_nodes=(1000, 5000), core_decisions=50, kube_core_pods=100,
             gpu_nodes=8, repeats=2)
