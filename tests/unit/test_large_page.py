"""The large-cluster bench's pods and page (bench/scenarios/large.py, bench/large_page.py), without a plane."""

from __future__ import annotations

import json
from collections import Counter

from bench.large_page import DEFAULT_JSON, DEFAULT_PAGE, render
from bench.scenarios.large import large_pods
from hoss.model.resources import pod_requests

GPU = "nvidia.com/gpu"


def test_the_pods_are_the_same_mix_for_every_run_and_gpu_pods_carry_limits() -> None:
    pods = large_pods(800, "hoss")
    assert [p["metadata"]["name"] for p in pods] == [p["metadata"]["name"] for p in large_pods(800, "other")]
    shapes = Counter(p["metadata"]["name"].split("-")[0] for p in pods)
    assert set(shapes) == {"small", "medium", "large", "gpu"}
    assert 400 < shapes["small"] < 600 and 60 < shapes["gpu"] < 140, shapes
    for pod in pods:
        gpus = pod_requests(pod).get(GPU, 0)
        assert (gpus in (1, 2, 4, 8)) == pod["metadata"]["name"].startswith("gpu-")
        if gpus:
            assert pod["spec"]["containers"][0]["resources"]["limits"] == {GPU: str(gpus)}
        assert pod["spec"]["schedulerName"] == "hoss"


def _run(pods_per_second: float, **cpu: float) -> dict[str, object]:
    return {"pods": 100, "bound": 100, "pods_per_second": pods_per_second, "p50_ms": 10.0, "p99_ms": 20.0,
            "oversold_nodes": 0, "cpu_per_1000_pods": {"total": 9.0, **cpu}, "decision_mean_ms": 1.5}


def test_the_page_sets_each_size_s_runs_against_kube_scheduler_s_default() -> None:
    results = {"date": "2026-11-27 22:00 UTC", "machine": {"cpus": 2}, "versions": {"kubernetes": "v1.36.3"},
               "sizes": {"5000": {"nodes": 5000, "gpu_nodes": 625, "pods": 100, "nodes_ready_seconds": 40.0,
                                  "kube_feasible_nodes_sought": 500, "idle_cpu_per_second": {"hoss": {"etcd": 0.01}},
                                  "hoss_decision_mean_ms": 0.4,
                                  "kube-scheduler": _run(100.0, **{"kube-scheduler": 2.0}),
                                  "kube-scheduler 100%": _run(50.0), "hoss-1w": _run(120.0, workers=1.0),
                                  "hoss-2w": _run(130.0)}}}
    page = render(results)
    assert "### 5,000 nodes" in page
    assert "| hoss-1w | 100/100 | 120.0 | 1.20x |" in page
    assert "| kube-scheduler 100% | 100/100 | 50.0 | 0.50x |" in page
    assert "| 5,000 | 1.50 | 1.50 | 0.40 | 2.00 | 1.00 |" in page
    assert "with hoss running (nothing scheduled), CPU seconds per second: etcd 0.010." in page


def test_the_checked_in_page_is_what_the_checked_in_figures_render_to() -> None:
    """docs/benchmarks-large.md is never edited by hand: `python -m bench.large_page` writes it from the JSON."""
    assert DEFAULT_PAGE.read_text() == render(json.loads(DEFAULT_JSON.read_text())), \
        "docs/benchmarks-large.md is stale: run python -m bench.large_page"
