"""Scenario 1, throughput: pods per second and latency of each system alone on the same nodes and pods, the
apiserver's own ceiling (bindings posted straight, with and without the webhook), hoss with each worker count and
with workers pinned to cores; the rows the targets compare made again in interleaved rounds, each row its median."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from bench.measure import create_pods, post_bindings
from bench.scenarios.cpu import cpu_figures
from bench.scenarios.harness import NODE, Bench, small_pods
from bench.scenarios.sizes import Size

THROUGHPUT_TIMEOUT = 600.0
# More hoss-side throughput rows (name -> row), run while hoss runs alone, after the hoss rows: the pipeline
# ceiling (bench/pipeline.py), see run.PIPELINE_CEILING.
ThroughputHook = Callable[["Bench", Size], Awaitable[dict[str, Any]]]


async def throughput_kube(bench: Bench, size: Size) -> dict[str, Any]:
    """kube-scheduler alone, then the apiserver's own ceiling without the webhook (call with ``kube_alone``)."""
    results: dict[str, Any] = {"kube-scheduler": await _kube_run(bench, size)}
    bench.progress("throughput: apiserver ceiling (pre-chosen nodes, no webhook)", 0, size.pods)
    results["apiserver-ceiling"] = await ceiling(bench, size)
    return results


async def throughput_hoss(bench: Bench, size: Size, *, pipeline_ceiling: ThroughputHook | None = None
                          ) -> dict[str, Any]:
    """The apiserver's ceiling with the webhook, hoss with each worker count, and hoss with workers pinned to
    one core each (call with ``hoss_alone``)."""
    results: dict[str, Any] = {}
    bench.progress("throughput: apiserver ceiling (pre-chosen nodes, with the webhook)", 0, size.pods)
    results["apiserver-ceiling+webhook"] = await ceiling(bench, size)
    runs: list[tuple[str, int, list[int] | None]] = [(f"hoss-{n}w", n, None) for n in size.worker_counts]
    runs += [(f"hoss-{n}w-pinned", n, list(range(n))) for n in size.pinned_worker_counts]
    for label, workers, cpus in runs:
        results[label] = await _hoss_run(bench, size, workers, cpus)
    if pipeline_ceiling is not None:
        results.update(await pipeline_ceiling(bench, size))
    return results


async def throughput_again(bench: Bench, size: Size) -> dict[str, list[dict[str, Any]]]:
    """The throughput rows the targets compare with each other (hoss-1w against kube-scheduler, hoss-4w against
    hoss-1w, the apiserver's ceiling with the webhook against without) made again ``size.repeats - 1`` times; the
    runs of each row in order. Each round has kube-scheduler alone (and the ceiling without the webhook) and hoss
    alone (the ceiling with the webhook, 1 and 4 workers). The order alternates: round 2 hoss first (4 workers
    before 1), round 3 kube-scheduler first (1 worker before 4), and so on, so that neither system always runs
    on a plane that has run longer (the first round, the main pass, has kube-scheduler first and 1 worker before
    4). Leaves hoss alone on the plane."""
    again: dict[str, list[dict[str, Any]]] = {}

    async def kube_side(round_: int) -> None:
        bench.kube_alone()
        again.setdefault("kube-scheduler", []).append(await _kube_run(bench, size, again=round_))
        bench.progress(f"throughput{_round(size, round_)}: apiserver ceiling, no webhook", 0, size.pods)
        again.setdefault("apiserver-ceiling", []).append(await ceiling(bench, size))

    async def hoss_side(round_: int, worker_counts: Sequence[int]) -> None:
        bench.hoss_alone()
        bench.progress(f"throughput{_round(size, round_)}: apiserver ceiling, with the webhook", 0, size.pods)
        again.setdefault("apiserver-ceiling+webhook", []).append(await ceiling(bench, size))
        for workers in worker_counts:
            if workers in size.worker_counts:
                again.setdefault(f"hoss-{workers}w", []).append(
                    await _hoss_run(bench, size, workers, None, again=round_))

    for round_ in range(2, size.repeats + 1):
        if round_ % 2 == 0:
            await hoss_side(round_, (4, 1))
            await kube_side(round_)
        else:
            await kube_side(round_)
            await hoss_side(round_, (1, 4))
    bench.hoss_alone()
    return again


def take_medians(throughput: dict[str, Any], again: Mapping[str, Sequence[dict[str, Any]]]) -> None:
    """Each row of ``throughput`` measured again becomes its run with the median pods/s (of an even count, the
    lower of the middle two), all its figures from that one run, with every run's pods/s in ``runs_pods_per_second``
    (in the order they ran), and, for rows with latencies, every run's p50 and p99 in ``runs_p50_ms`` and
    ``runs_p99_ms``: the median run by pods/s need not be the median by latency."""
    for name, later in again.items():
        if name not in throughput or not later:
            continue
        runs = [throughput[name], *later]
        ranked = sorted(runs, key=lambda row: float(row.get("pods_per_second") or 0.0))
        row = {**ranked[(len(ranked) - 1) // 2], "runs_pods_per_second": [run.get("pods_per_second") for run in runs]}
        for key in ("p50_ms", "p99_ms"):
            if all(isinstance(run.get(key), int | float) for run in runs):
                row[f"runs_{key}"] = [run[key] for run in runs]
        throughput[name] = row


def _round(size: Size, again: int) -> str:
    """How a progress line names a repeated run's round (nothing for the first)."""
    return f" again ({again} of {size.repeats})" if again else ""


async def _kube_run(bench: Bench, size: Size, *, again: int = 0) -> dict[str, Any]:
    bench.progress(f"throughput{_round(size, again)}: kube-scheduler (alone)", 0, size.pods)
    namespace, nodes = await bench.fresh("tput-kube", size.nodes, NODE)
    try:
        return await bench.timed_run(namespace, small_pods(size.pods, "default-scheduler"), nodes,
                                     timeout=THROUGHPUT_TIMEOUT)
    finally:
        await bench.cleanup(namespace, nodes)


async def _hoss_run(bench: Bench, size: Size, workers: int, cpus: list[int] | None, *,
                    again: int = 0) -> dict[str, Any]:
    pinned = f", pinned to core{'s' if workers > 1 else ''} {','.join(map(str, cpus))}" if cpus else ""
    bench.progress(f"throughput{_round(size, again)}: hoss, {workers} worker(s){pinned}", 0, size.pods)
    namespace, nodes = await bench.fresh(f"tput-hoss{workers}", size.nodes, NODE)
    processes = bench.start_hoss(workers, cpus=cpus)
    try:
        row = await bench.timed_run(namespace, small_pods(size.pods, "hoss"), nodes, timeout=THROUGHPUT_TIMEOUT)
        return {**row, "workers": workers, "pinned_cpus": cpus}
    finally:
        bench.stop(processes)
        await bench.cleanup(namespace, nodes)


async def ceiling(bench: Bench, size: Size) -> dict[str, Any]:
    """Bindings posted straight to round-robin nodes: the most the apiserver (and webhook) can take."""
    namespace, nodes = await bench.fresh("ceiling", size.nodes, NODE)
    try:
        # Pods for a scheduler that does not exist stay pending until we bind them ourselves.
        await create_pods(bench.cluster, small_pods(size.pods, "nobody"), namespace=namespace)
        pods = await bench.cluster.raw_list("list_namespaced_pod", namespace)
        meter = bench.meter()
        meter.start()
        started = time.monotonic()
        refused = await post_bindings(bench.cluster, pods, nodes, namespace=namespace)
        seconds = time.monotonic() - started
        bound = len(pods) - refused
        return {"pods": len(pods), "bound": bound, "pods_per_second": round(bound / seconds, 1), "refused": refused,
                "oversold_nodes": await bench.oversold(namespace, nodes), **cpu_figures(meter.stop(), bound)}
    finally:
        await bench.cleanup(namespace, nodes)

