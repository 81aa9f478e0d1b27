"""The shipped monitoring against the running components, on the real plane: a worker places pods and finds one
that fits nowhere, the dispatcher routes them, the resolver judges the bindings and a rescheduler runs its rounds.
Each component's /metrics then shows the figures that work made under the names the Grafana dashboard and the alert
rules read, and holds every series they read; the rescheduler's /metrics is guarded like every component's."""

from __future__ import annotations

import ssl
import time

from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from dev.local.state import Process
from tests.e2e.hoss import hoss_pods, metric_total, metrics_text, node_set, pinned, status_access, wait_all_bound
from tests.monitoring import exposition_series, shipped_expressions, unexported
from tests.waiting import until

FITTING = 6


async def test_the_dashboard_and_the_rules_read_what_the_running_components_export(
    plane: LocalPlane, cluster: Cluster, namespace: str, dispatcher: Process
) -> None:
    resolver = plane.running("hoss-resolver")
    assert resolver is not None
    tls = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    lease = f"hoss-rescheduler-{namespace}"[:60]
    # A dry run on a Lease of its own: it plans (nothing here) and changes nothing another test made.
    rescheduler = plane.start_rescheduler(name=lease, extra_args=[f"--lease-name={lease}", "--dry-run=true",
                                                                  "--interval-seconds=1"])
    worker = plane.start_worker(f"mon-{namespace}"[:40], policies=["default"])
    urls = {"dispatcher": f"http://127.0.0.1:{dispatcher.port}/metrics",
            "worker": f"http://127.0.0.1:{worker.port}/metrics",
            "resolver": f"https://127.0.0.1:{resolver.port}/metrics",
            "rescheduler": f"http://127.0.0.1:{rescheduler.port}/metrics"}

    async def scrape(component: str) -> str:
        return await metrics_text(urls[component], tls=tls if component == "resolver" else None)

    worker_id = f"mon-{namespace}"[:40]
    try:
        async with node_set(cluster, 2, labels={"monitoring": namespace}):
            pods = pinned(hoss_pods("fits", FITTING, cpu="1") + hoss_pods("huge", 1, cpu="64"), "monitoring",
                          namespace)
            await cluster.create_pods(pods, namespace=namespace)
            await wait_all_bound(cluster, namespace, FITTING)

            async def huge_waits_unschedulable() -> tuple[bool, str]:
                text = await scrape("worker")
                queued = metric_total(text, "scheduler_pending_pods", queue="unschedulable")
                tried = metric_total(text, "scheduler_schedule_attempts_total", result="unschedulable")
                return queued == 1 and tried >= 1, f"unschedulable queue {queued}, attempts {tried}"

            await until(huge_waits_unschedulable, timeout=60, what="the huge pod to wait in the unschedulable queue")

            async def rescheduler_ran() -> tuple[bool, str]:
                rounds = metric_total(await scrape("rescheduler"), "hoss_rescheduler_rounds_total")
                return rounds >= 1, f"{rounds:g} rounds"

            await until(rescheduler_ran, timeout=60, what="the rescheduler's first round")
            texts = {component: await scrape(component) for component in urls}
    finally:
        plane.stop_processes([worker.name, rescheduler.name])

    work = texts["worker"]
    assert metric_total(work, "scheduler_schedule_attempts_total", result="scheduled", profile="default") == FITTING
    assert metric_total(work, "scheduler_scheduling_attempt_duration_seconds_count", result="scheduled") == FITTING
    assert metric_total(work, "scheduler_pod_scheduling_sli_duration_seconds_count") == FITTING
    assert metric_total(work, "scheduler_framework_extension_point_duration_seconds_count", extension_point="Bind",
                        status="Success", profile="default") == FITTING
    assert metric_total(work, "scheduler_preemption_attempts_total") >= 1  # the huge pod went through PostFilter
    assert time.time() - metric_total(work, "hoss_worker_last_heartbeat_timestamp_seconds") < 30
    routing = texts["dispatcher"]
    assert metric_total(routing, "hoss_dispatcher_pods_routed_total", worker=worker_id) >= FITTING + 1
    assert metric_total(routing, "hoss_dispatcher_oldest_pending_pod_age_seconds") > 0
    guard = texts["resolver"]
    assert metric_total(guard, "hoss_resolver_ready") == 1
    assert metric_total(guard, "hoss_resolver_verdicts_total", allowed="true") >= FITTING
    assert metric_total(texts["rescheduler"], "hoss_rescheduler_leader") == 1

    exported = set().union(*(exposition_series(text) for text in texts.values()))
    assert unexported(shipped_expressions(), exported) == {}


async def test_the_reschedulers_metrics_need_a_token_of_a_hoss_viewer(plane: LocalPlane, namespace: str) -> None:
    outcomes = await status_access(plane, namespace)
    assert {who: outcomes[f"rescheduler {who} /metrics"] for who in ("nobody", "forged", "stranger", "viewer")} == \
        {"nobody": 401, "forged": 401, "stranger": 403, "viewer": 200}
