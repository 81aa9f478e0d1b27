"""The operator dashboard in a real browser (Debian's headless Chromium) on the whole running system.

The page must show what the dispatcher's /status says: the workers, the bound count, the nodes with their GPUs,
the pending pod and the reason it waits, the resolver's latest denial. Screenshots land in artifacts/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from dispatcher.status import GPU_RESOURCE, SystemStatus
from tests.e2e.browser import Page
from tests.e2e.hoss import hoss_pods, wait_all_bound, workers
from tests.waiting import until

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
WIDTH, HEIGHT = 1366, 768
CPU_NODE = {"cpu": "8", "memory": "32Gi", "pods": "110"}
GPU_NODE = {"cpu": "32", "memory": "256Gi", "pods": "110", GPU_RESOURCE: "8"}

# What a person sees, read from the elements the dashboard marks for tests.
READ_PAGE = """(() => {
  const q = (testid) => document.querySelector(`[data-testid="${testid}"]`);
  if (!q("bound-total") || !q("throughput-chart")) {
    // The page is still loading: report "not loaded" and let the caller read again.
    return {loaded: false, bound: null, banner: "", workers: {}, nodes: {}, pending: {}, denials: [],
            stranded: null, chart_samples: 0, chart_peak: 0};
  }
  const rows = (testid, selector) => [...q(testid).querySelectorAll(selector)];
  const chart = q("throughput-chart");
  return {
    loaded: document.body.dataset.loaded === "true",
    bound: q("bound-total").dataset.value ?? null,
    banner: q("banner").hidden ? "" : q("banner").textContent,
    workers: Object.fromEntries(rows("workers", "tr[data-worker]").map((r) => [r.dataset.worker, r.dataset.alive])),
    nodes: Object.fromEntries(rows("nodes", "[data-node]").map((n) => [n.dataset.node, n.dataset.gpu])),
    pending: Object.fromEntries(rows("pending", "tr[data-pod]").map(
      (r) => [r.dataset.pod, r.querySelector('[data-testid="pending-message"]').textContent])),
    denials: rows("denials", "tr[data-pod]").map((r) => r.dataset.pod),
    stranded: q("gpu-summary").dataset.stranded ?? null,
    chart_samples: Number(chart.dataset.samples || 0),
    chart_peak: Number(chart.dataset.peak || 0),
  };
})()"""


@dataclass(frozen=True)
class Dashboard:
    loaded: bool
    bound: int | None
    banner: str
    workers: dict[str, str]
    nodes: dict[str, str]
    pending: dict[str, str]
    denials: list[str]
    stranded: int | None
    chart_samples: int
    chart_peak: float

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Dashboard:
        def number(value: Any) -> int | None:
            return int(value) if value not in (None, "") else None

        return cls(**{**raw, "bound": number(raw["bound"]), "stranded": number(raw["stranded"])})


async def read_status(http: aiohttp.ClientSession, url: str) -> SystemStatus:
    async with http.get(f"{url}/status") as response:
        assert response.status == 200, await response.text()
        return SystemStatus.model_validate(await response.json())


async def foreign_binding_refused(cluster: Cluster, namespace: str, *, node: str) -> str:
    """Bind a pod that cannot fit, as another scheduler would: the resolver must deny it. Its namespace/name."""
    (name,) = await cluster.create_pods(
        [pod_manifest("dash-foreign", requests={"cpu": "30"}, scheduler_name="nobody")], namespace=namespace)
    pod = await cluster.core.read_namespaced_pod(name, namespace)
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "uid": pod.metadata.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    response = await cluster.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
    assert response.status == 409, f"the resolver let {name} onto {node}: {await response.text()}"
    return f"{namespace}/{name}"


async def test_dashboard_shows_the_running_system_as_status_reports_it(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, browser: Page
) -> None:
    url = f"http://127.0.0.1:{dispatcher.port}"
    cpu_nodes = await cluster.create_nodes(2, prefix="dash-cpu", capacity=CPU_NODE, labels={"hoss.io/pool": "dash"})
    gpu_nodes = await cluster.create_nodes(2, prefix="dash-gpu", capacity=GPU_NODE,
                                           labels={"hoss.io/pool": "dash-gpu"})
    try:
        await cluster.wait_nodes_ready(cpu_nodes + gpu_nodes)
        async with workers(plane, [("dash-1", ["default"]), ("dash-2", ["default", "binpack"])]), \
                aiohttp.ClientSession() as http:
            # 14 CPU pods, 6 two-GPU pods packed on the GPU nodes (one full, one half used), one pod too big for
            # any node, which waits with kube-scheduler's kind of reason.
            await cluster.create_pods(
                hoss_pods("dash", 14) + hoss_pods("dash-gpu", 6, policy="binpack", extra={GPU_RESOURCE: "2"})
                + hoss_pods("dash-huge", 1, cpu="64"),
                namespace=namespace,
            )
            await wait_all_bound(cluster, namespace, 20)
            huge = f"{namespace}/dash-huge-0000"
            foreign = await foreign_binding_refused(cluster, namespace, node=cpu_nodes[0])

            async def status_has_it_all() -> tuple[bool, str]:
                status = await read_status(http, url)
                waits = {p.pod: p for p in status.pending.pods}
                denied = [d.pod for d in status.resolver.recent_denials] if status.resolver else []
                alive = {w.id for w in status.workers if w.alive}
                done = (status.throughput.bound_total >= 20 and huge in waits
                        and waits[huge].reason == "Unschedulable" and foreign in denied
                        and {"dash-1", "dash-2"} <= alive)
                return done, (f"bound {status.throughput.bound_total}, waiting {waits.get(huge)}, "
                              f"denied {denied[:3]}, alive {sorted(alive)}")

            await until(status_has_it_all, timeout=60, what="/status to show the bound pods, the waiting "
                        "pod's reason, the denial and both workers")

            await browser.open(f"{url}/", width=WIDTH, height=HEIGHT)
            seen: list[tuple[SystemStatus, Dashboard]] = []

            async def page_agrees_with_status() -> tuple[bool, str]:
                # The page refreshes every 2 s: it agrees with one of two reads of /status around its own.
                before = await read_status(http, url)
                page = Dashboard.parse(await browser.evaluate(READ_PAGE))
                after = await read_status(http, url)
                seen[:] = [(after, page)]
                totals = {before.throughput.bound_total, after.throughput.bound_total}
                waiting = {p.pod: p.message for p in after.pending.pods}
                done = (page.loaded and page.bound in totals and huge in page.pending
                        and page.pending[huge] == waiting.get(huge) and foreign in page.denials
                        and page.chart_samples > 0)
                return done, f"page {page}; /status bound_total {sorted(totals)}"

            await until(page_agrees_with_status, timeout=30, what="the dashboard to show what /status says")
            status, page = seen[0]
            await browser.screenshot(ARTIFACTS / "dashboard.png")
            await browser.screenshot(ARTIFACTS / "dashboard-full.png", full_page=True)
            async with http.get(f"{url}/status/schema") as response:
                schema = await response.json()

        assert page.bound is not None and page.bound >= 20
        assert page.workers.get("dash-1") == page.workers.get("dash-2") == "true", page.workers
        assert {name: page.nodes.get(name) for name in cpu_nodes + gpu_nodes} == {
            **dict.fromkeys(cpu_nodes, "false"), **dict.fromkeys(gpu_nodes, "true")}
        assert page.pending[huge].startswith("0/") and "Insufficient cpu" in page.pending[huge], page.pending
        assert page.stranded is not None and page.stranded == (status.gpu.stranded_gpus if status.gpu else None)
        assert page.chart_peak > 0
        assert page.banner == "", "a leader with Redis up shows no warning banner"
        assert browser.errors == [], browser.errors
        assert schema == SystemStatus.model_json_schema()
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(cpu_nodes + gpu_nodes)
