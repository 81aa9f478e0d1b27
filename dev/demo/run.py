"""The demo from start to end: the plane and the hoss processes up, the stage set, the six stories told in order,
the whole plane checked for oversold nodes, and the report printed (or written as one line of JSON)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict

from dev.demo.observe import dispatcher_status, dispatcher_url, webhook_denials
from dev.demo.printing import print_report
from dev.demo.report import DemoReport
from dev.demo.stage import NAMESPACES, STORY_NODES, TENANT_POOL, create_demo_nodes, create_story_nodes, worker_layout
from dev.demo.stories.devices import device_story
from dev.demo.stories.gangs import gang_story
from dev.demo.stories.gpu import gpu_story
from dev.demo.stories.pools import pool_story
from dev.demo.stories.race import race_story
from dev.demo.stories.throughput import mix_story
from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import LocalPlane
from dispatcher.settings import DispatcherSettings

PACK_DEPTH: int = DispatcherSettings.model_fields["pack_depth"].default
"""The demo's dispatcher runs with the default --pack-depth, given on its command line so that the report can name
the figure its routing used."""


def start_hoss(plane: LocalPlane, workers: int, progress: Callable[[str], None]) -> None:
    """The dispatcher and the workers of `worker_layout`, each started unless it already runs."""
    names = {p.name for p in plane.state().processes}
    if "hoss-dispatcher" not in names:
        progress(f"starting hoss-dispatcher (--pack-depth {PACK_DEPTH})")
        plane.start_dispatcher(extra_args=[f"--pack-depth={PACK_DEPTH}"])
    for worker_id, policies in worker_layout(workers):
        if f"hoss-worker-{worker_id}" not in names:
            progress(f"starting hoss-worker {worker_id} (policies: {', '.join(policies)})")
            plane.start_worker(worker_id, policies=policies)


async def run_demo(
    *, plane: LocalPlane, nodes: int, pods: int, workers: int, as_json: bool, progress: Callable[[str], None]
) -> int:
    """Exit code 0 when no node of the plane is oversold after all the stories and no device is in two claims, 1
    otherwise."""
    plane.up(progress=progress)
    start_hoss(plane, workers, progress)
    status_url = dispatcher_url(plane)
    async with await Cluster.connect(plane.kubeconfig("admin")) as cluster:
        for namespace in NAMESPACES:
            await cluster.ensure_namespace(namespace)
            await cluster.delete_pods(namespace)
        old = [n["metadata"]["name"] for n in await cluster.raw_list("list_node")]
        await cluster.delete_nodes(n for n in old if n.startswith("demo-"))
        began = time.monotonic()
        progress(f"creating {nodes} fake nodes (CPU nodes in pool-a and {TENANT_POOL}, 8-GPU nodes in pool-gpu) "
                 f"and {STORY_NODES} more for the stories")
        node_names = await create_demo_nodes(cluster, nodes)
        story_nodes = await create_story_nodes(cluster)
        await cluster.wait_nodes_ready([*node_names, *(n for ns in story_nodes.values() for n in ns)], timeout=180)
        denials_before = await webhook_denials(plane)
        conflicts_before = int((await dispatcher_status(plane)).get("conflicts") or 0)

        mix = await mix_story(cluster, plane, pods, pack_depth=PACK_DEPTH, as_json=as_json, progress=progress)
        conflicts = int((await dispatcher_status(plane)).get("conflicts") or 0) - conflicts_before
        gangs = await gang_story(cluster, progress)
        gpu = await gpu_story(cluster, progress)
        pools = await pool_story(cluster, progress, pods=min(30, max(5, pods // 10)))
        race = await race_story(cluster, plane, progress)
        devices = await device_story(cluster, progress)
        demo_seconds = time.monotonic() - began

        everything = await cluster.raw_list("list_pod_for_all_namespaces")
        oversold = oversold_nodes(await cluster.raw_list("list_node"), everything, dra=await cluster.dra_resources())
        denials = await webhook_denials(plane) - denials_before
    report = DemoReport(
        pods_total=pods,
        pods_bound=mix.bound,
        pods_pending=pods - mix.bound,
        seconds=round(mix.seconds, 2),
        pods_per_second=round(mix.bound / mix.seconds, 1),
        ledger_conflicts=conflicts,
        webhook_denials=denials,
        oversold_nodes=len(oversold),
        per_worker=mix.per_worker,
        nodes=len(node_names),
        workers=workers,
        status_url=status_url,
        pending_reasons=mix.pending_reasons,
        dashboard_url=status_url.removesuffix("status"),
        per_worker_why=mix.worker_notes,
        pods_by_policy=mix.asked,
        gangs=gangs,
        gpu=gpu,
        pools=pools,
        race=race,
        devices=devices,
        demo_seconds=round(demo_seconds, 1),
    )
    if as_json:
        print(json.dumps(asdict(report)))
    else:
        print_report(report, plane)
    return 0 if report.oversold_nodes == 0 and devices.devices_in_two_claims == 0 else 1
