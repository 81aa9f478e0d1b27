"""The benchmark's arithmetic: kube-scheduler's histograms, CPU per process, and the targets judged from figures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bench import report, scenarios
from bench.measure import ALGORITHM_METRIC, cpu_seconds, parse_histogram
from bench.scenarios.core_scale import kube_feasible_nodes_sought
from bench.scenarios.cpu import cpu_figures

METRICS = f"""# HELP {ALGORITHM_METRIC} Scheduling algorithm latency in seconds
# TYPE {ALGORITHM_METRIC} histogram
{ALGORITHM_METRIC}_bucket{{le="0.001"}} 10
{ALGORITHM_METRIC}_bucket{{le="0.002"}} 30
{ALGORITHM_METRIC}_bucket{{le="0.004"}} 40
{ALGORITHM_METRIC}_bucket{{le="+Inf"}} 40
{ALGORITHM_METRIC}_sum 0.06
{ALGORITHM_METRIC}_count 40
scheduler_other_bucket{{le="0.001"}} 99
"""


def test_histogram_p50_interpolates_inside_its_bucket_and_differences_subtract() -> None:
    histogram = parse_histogram(METRICS, ALGORITHM_METRIC)
    assert histogram.count == 40 and histogram.total == pytest.approx(0.06)
    # rank 20 lies in (1 ms, 2 ms], which holds ranks 11..30: halfway.
    assert histogram.quantile(0.5) == pytest.approx(0.0015)
    assert histogram.bucket_of(0.0015) == (0.001, 0.002)
    earlier = parse_histogram(METRICS.replace("} 30", "} 20").replace("} 40", "} 30")
                              .replace("_count 40", "_count 30").replace("_sum 0.06", "_sum 0.04"), ALGORITHM_METRIC)
    delta = histogram.minus(earlier)
    assert delta.count == 10 and delta.buckets[0.001] == 0 and delta.buckets[0.002] == 10
    assert delta.quantile(0.5) == pytest.approx(0.0015)
    assert parse_histogram("", ALGORITHM_METRIC).quantile(0.5) is None


def test_cpu_seconds_of_this_process_and_of_none() -> None:
    assert (cpu_seconds(os.getpid()) or 0) > 0
    assert cpu_seconds(2**22 + 1) is None


def test_cpu_figures_group_processes_per_thousand_pods() -> None:
    spent = {"kube-apiserver": 2.0, "etcd": 1.0, "hoss-dispatcher-bench": 0.5, "hoss-worker-b1-1": 0.25,
             "hoss-worker-b1-2": 0.75, "redis-server": 0.5, "hoss-resolver": 0.2, "bench": 1.0}
    figures = cpu_figures(spent, pods=500)
    per = figures["cpu_per_1000_pods"]
    assert per["kube-apiserver"] == 4.0 and per["workers"] == 2.0 and per["kube-scheduler"] == 0.0
    assert per["hoss-side"] == pytest.approx(1.0 + 2.0 + 1.0)
    assert per["total"] == pytest.approx(2 * sum(spent.values()))
    assert figures["cpu_per_1000_pods_per_worker"] == {"b1-1": 0.5, "b1-2": 1.5}


def _row(pods_per_second: float, p99: float, **cpu: float) -> dict[str, Any]:
    return {"pods": 100, "bound": 100, "pods_per_second": pods_per_second, "p50_ms": p99 / 3, "p90_ms": p99 / 2,
            "p99_ms": p99, "oversold_nodes": 0, "cpu_per_1000_pods": cpu}


def _results() -> dict[str, Any]:
    core = {"decision_p50_ms": 0.2, "decision_p99_ms": 0.3, "decisions_per_second": 5000.0}
    return {
        "quick": True, "date": "today", "machine": {"cpus": 2},
        "scenarios": {
            "throughput": {
                "kube-scheduler": _row(200, 1000, **{"kube-scheduler": 2.0}),
                "apiserver-ceiling": _row(600, 0),
                "apiserver-ceiling+webhook": _row(450, 0),
                "hoss-1w": _row(220, 900, **{"hoss-side": 1.5, "resolver": 0.4}),
                "hoss-4w": _row(200, 1200, **{"hoss-side": 2.5, "resolver": 0.3}),
                "hoss-1w-pinned": _row(100, 900),
                "hoss-2w-pinned": _row(190, 900),
                "pipeline-1w-pinned": _row(1000, 0),
                "pipeline-2w-pinned": _row(1700, 0),
            },
            "contention": {"capacity_cpu": 8, "demand_cpu": 12, "2x kube-scheduler": {"placed": 9, "oversold_nodes": 3},
                           "hoss 4w + kube-scheduler, resolver": {"placed": 8, "oversold_nodes": 0}},
            "core_scale": {
                "1000": {**core, "kube_scheduler": {"measured": True, "decision_p50_ms": 0.5, "decision_mean_ms": 0.6,
                                                    "p50_bucket_ms": [0.0, 1.0], "pods": 100,
                                                    "all_nodes_ready_seconds": 9.0, "feasible_nodes_sought": 420}},
                "5000": {**core, "kube_scheduler": {"measured": False, "reason": "not measured: too slow"}},
            },
            "gpu_mix": {"gpu_nodes": 8, "gpus_requested": 38,
                        "kube-scheduler": {"placed": 9, "fully_free_gpu_nodes": 2, "partly_used_gpu_nodes": 5,
                                           "stranded_gpus": 6, "oversold_nodes": 0}},
        },
    }


def test_targets_are_judged_from_the_figures() -> None:
    found = {t["target"]: t for t in report.targets(_results())}
    assert len(found) == 12
    assert found["hoss-1w pods/s >= 1.0x kube-scheduler"]["met"] is True
    assert found["hoss-4w pods/s >= 0.95x hoss-1w"]["met"] is False  # 200 / 220 = 0.91
    side = found["hoss-side CPU/pod (dispatcher+workers+redis) <= kube-scheduler's"]
    assert side["met"] is False and "hoss-4w" in side["value"]  # the worst run is the one judged
    assert found["resolver CPU/pod <= 0.5 ms"]["met"] is True
    assert found["apiserver ceiling with webhook >= 80% of without"]["met"] is False  # 75%
    assert found["hoss 2 workers pinned >= 1.8x 1 worker pinned"]["met"] is True
    assert found["pipeline ceiling >= 2,000 pods/s"]["met"] is False and "pipeline-2w-pinned" in \
        found["pipeline ceiling >= 2,000 pods/s"]["value"]
    assert found["pipeline: 2 workers pinned >= 1.8x 1 worker pinned"]["met"] is False  # 1.70x
    assert found["decision p50 <= kube-scheduler's at 5000 nodes"]["met"] is None
    assert "too slow" in found["decision p50 <= kube-scheduler's at 5000 nodes"]["value"]
    assert found["decision p50 <= kube-scheduler's at 20000 nodes"]["met"] is None
    assert found["hoss p99 latency <= kube-scheduler's"]["met"] is False  # hoss-4w: 1200 > 1000
    oversold = found["0 oversold nodes in every run"]
    assert oversold["met"] is True and "unguarded 2x kube-scheduler (not a target): 3" in oversold["value"]


def test_table_and_chart_render(tmp_path: Path) -> None:
    results = _results()
    text = report.table(results)
    assert "targets" in text and "NOT MET" in text
    assert "pinned-core scaling: hoss-2w-pinned / hoss-1w-pinned = 1.90x" in text
    report.chart(results, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"


def test_kube_scheduler_feasible_nodes_follow_its_adaptive_percentage() -> None:
    assert [kube_feasible_nodes_sought(n) for n in (50, 150, 1000, 5000, 20000)] == [50, 100, 420, 500, 1000]


def test_a_target_read_from_an_incomplete_run_is_not_measured() -> None:
    results = _results()
    results["scenarios"]["throughput"]["hoss-1w-pinned"]["bound"] = 0
    found = {t["target"]: t for t in report.targets(results)}
    pinned = found["hoss 2 workers pinned >= 1.8x 1 worker pinned"]
    assert pinned["met"] is None and pinned["value"] == "incomplete run: hoss-1w-pinned bound 0 of 100 pods"
    assert found["hoss-1w pods/s >= 1.0x kube-scheduler"]["met"] is True
    assert "! hoss-1w-pinned: only 0 of 100 pods bound" in report.table(results)


def test_the_churn_target_reads_the_anchor_and_the_rescheduler_rows() -> None:
    anchor = {"placed": 29, "fully_free_gpu_nodes": 7, "partly_used_gpu_nodes": 6, "stranded_gpus": 21,
              "oversold_nodes": 0}
    moved = {"placed": 29, "fully_free_gpu_nodes": 9, "partly_used_gpu_nodes": 1, "stranded_gpus": 5,
             "oversold_nodes": 0, "pods_lost": 0, "max_oversold_during_moves": 0, "plans": 2, "completed_plans": 2,
             "pods_moved": 4, "oversold_checks": 20, "seconds": 23.2}
    results = {"scenarios": {"gpu_churn": {"kube-scheduler MostAllocated": anchor,
                                           "hoss (gpu policy) + rescheduler": moved}}}
    (target,) = [t for t in report.targets(results) if t["target"].startswith("GPU churn")]
    assert target["met"] is True
    results["scenarios"]["gpu_churn"]["hoss (gpu policy) + rescheduler"] = {**moved, "stranded_gpus": 11}
    (target,) = [t for t in report.targets(results) if t["target"].startswith("GPU churn")]
    assert target["met"] is False


def test_a_row_measured_again_is_its_median_run_and_the_targets_read_that() -> None:
    results = _results()
    throughput = results["scenarios"]["throughput"]
    first_kube = throughput["kube-scheduler"]
    again = {"kube-scheduler": [_row(260, 800, **{"kube-scheduler": 1.0}), _row(230, 700, **{"kube-scheduler": 3.0})],
             "hoss-1w": [_row(180, 900, **{"hoss-side": 1.5}), _row(240, 900, **{"hoss-side": 1.5}),
                         _row(210, 900, **{"hoss-side": 1.5})],
             "hoss-9w": [_row(1, 1)]}  # a row the first round did not have is left out
    scenarios.take_medians(throughput, again)
    kube = throughput["kube-scheduler"]
    # 200, 260, 230: the median run is the third, every figure of the row from it.
    assert kube["pods_per_second"] == 230 and kube["p99_ms"] == 700
    assert kube["cpu_per_1000_pods"] == {"kube-scheduler": 3.0}
    assert kube["runs_pods_per_second"] == [200, 260, 230] and "runs_pods_per_second" not in first_kube
    # Every run's latencies too, in the order they ran (the first run's p99 comes from _results()).
    assert kube["runs_p99_ms"] == [first_kube["p99_ms"], 800, 700]
    assert kube["runs_p50_ms"] == [first_kube["p50_ms"], 800 / 3, 700 / 3]
    # 220, 180, 240, 210 (even): the lower of the middle two.
    assert throughput["hoss-1w"]["pods_per_second"] == 210
    assert "hoss-9w" not in throughput and "runs_pods_per_second" not in throughput["hoss-4w"]
    found = {t["target"]: t for t in report.targets(results)}
    assert found["hoss-1w pods/s >= 1.0x kube-scheduler"]["value"].startswith("0.91x (210.0 vs 230.0)")
    text = report.table(results)
    assert "kube-scheduler, hoss-1w: the run with the median pods/s of 4" in text
    assert "     kube-scheduler: 200.0 / 260.0 / 230.0" in text
    kube_line = next(line for line in text.splitlines() if line.startswith("     kube-scheduler: "))
    assert kube_line.endswith(f"(p50 {first_kube['p50_ms']:,.0f} / 267 / 233 ms, "
                              f"p99 {first_kube['p99_ms']:,.0f} / 800 / 700 ms)"), kube_line
    assert "     hoss-1w: 220.0 / 180.0 / 240.0 / 210.0" in text


def test_a_ratio_target_of_rows_made_in_the_same_rounds_is_the_median_of_the_per_round_ratios() -> None:
    results = _results()
    throughput = results["scenarios"]["throughput"]
    # Medians: kube 230, hoss-1w 240 (1.04x). Per round: 190/200 0.95x, 240/260 0.92x, 250/230 1.09x: median
    # 0.95x, so the medians' ratio (a fast hoss draw against a slow kube one) would call it met and it is not.
    again = {"kube-scheduler": [_row(260, 800, **{"kube-scheduler": 1.0}), _row(230, 700, **{"kube-scheduler": 3.0})],
             "hoss-1w": [_row(240, 900, **{"hoss-side": 1.5}), _row(250, 900, **{"hoss-side": 1.5})],
             "hoss-4w": [_row(250, 900), _row(240, 900)],
             "apiserver-ceiling": [_row(500, 0), _row(700, 0)],
             "apiserver-ceiling+webhook": [_row(420, 0), _row(520, 0)]}
    throughput["hoss-1w"] = _row(190, 900, **{"hoss-side": 1.5, "resolver": 0.4})
    scenarios.take_medians(throughput, again)
    assert throughput["hoss-1w"]["pods_per_second"] == 240 and throughput["kube-scheduler"]["pods_per_second"] == 230
    assert report.per_round(throughput, "hoss-1w", "kube-scheduler") == pytest.approx([0.95, 240 / 260, 250 / 230])
    found = {t["target"]: t for t in report.targets(results)}
    one = found["hoss-1w pods/s >= 1.0x kube-scheduler"]
    assert one["met"] is False
    assert one["value"] == ("0.95x, the median of 3 rounds (0.95x / 0.92x / 1.09x); of the median runs "
                            "1.04x (240.0 vs 230.0)")
    # hoss-4w 200/190 1.05x, 250/240 1.04x, 240/250 0.96x: median 1.04x, met; the medians' ratio (240/240) too.
    assert found["hoss-4w pods/s >= 0.95x hoss-1w"]["met"] is True
    assert found["hoss-4w pods/s >= 0.95x hoss-1w"]["value"].startswith("1.04x, the median of 3 rounds")
    # Ceiling 450/600 75%, 420/500 84%, 520/700 74%: median 75%, not met, though the median runs give 450/600 too.
    ceiling = found["apiserver ceiling with webhook >= 80% of without"]
    assert ceiling["met"] is False and ceiling["value"].startswith("75%, the median of 3 rounds (75% / 84% / 74%)")
    text = report.table(results)
    assert "     hoss-1w / kube-scheduler in each round: 0.95x / 0.92x / 1.09x (median 0.95x; the targets read this)" \
        in text


def test_rows_not_made_in_the_same_rounds_are_compared_by_their_median_runs() -> None:
    throughput = {"kube-scheduler": {"runs_pods_per_second": [200, 210]},
                  "hoss-1w": {"runs_pods_per_second": [220, 230, 240]}}
    assert report.per_round(throughput, "hoss-1w", "kube-scheduler") is None
    assert report.per_round({"hoss-1w": {"runs_pods_per_second": [1]}, "kube-scheduler":
                             {"runs_pods_per_second": [1]}}, "hoss-1w", "kube-scheduler") is None
    assert report.per_round({"hoss-1w": {"runs_pods_per_second": [1, 2]}, "kube-scheduler":
                             {"runs_pods_per_second": [0, 2]}}, "hoss-1w", "kube-scheduler") is None
