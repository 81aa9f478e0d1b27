"""Workload policies on the real plane: gangs, GPU packing, node pools, leaf topology, plugins and extenders."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio import client

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import POLICIES_FILE, LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.dist_info import install_dist_info
from tests.e2e.hoss import hoss_pods, wait_all_bound, worker_tries_again, workers
from tests.waiting import until

GPU = "nvidia.com/gpu"
_sets = itertools.count()
EXAMPLE_PLUGIN = Path(__file__).resolve().parents[1] / "plugins_example"


@asynccontextmanager
async def node_set(cluster: Cluster, count: int, capacity: dict[str, str], **labels: str) -> AsyncIterator[list[str]]:
    names = await cluster.create_nodes(count, prefix=f"pol{next(_sets)}", capacity=capacity, labels=labels)
    try:
        await cluster.wait_nodes_ready(names)
        yield names
    finally:
        await cluster.delete_nodes(names)


def policies_file(tmp_path: Path, edit: dict[str, Any]) -> str:
    """configs/policies.yaml with top-level keys replaced or profiles appended (a worker's own file)."""
    config = yaml.safe_load(POLICIES_FILE.read_text())
    config["profiles"] += edit.pop("profiles", [])
    config.update(edit)
    path = tmp_path / "policies.yaml"
    path.write_text(yaml.safe_dump(config))
    return f"--policies-file={path}"


def gang(prefix: str, count: int, *, min_available: int, cpu: str, policy: str | None = None) -> list[Json]:
    labels = {"pod-group.scheduling.sigs.k8s.io/name": prefix,
              "pod-group.scheduling.sigs.k8s.io/min-available": str(min_available)}
    return hoss_pods(prefix, count, cpu=cpu, labels=labels, policy=policy)


async def bound_pods(cluster: Cluster, namespace: str) -> list[Json]:
    return [p for p in await cluster.raw_list("list_namespaced_pod", namespace) if p["spec"].get("nodeName")]


async def condition_message(cluster: Cluster, namespace: str, pod: str) -> str:
    raw = await cluster.core.read_namespaced_pod(pod, namespace)
    for condition in raw.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return str(condition.message or "")
    return ""


# --- gangs -----------------------------------------------------------------------------------------------------

async def test_gang_of_8_where_only_6_fit_binds_none_and_all_8_once_room_is_added(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    async with node_set(cluster, 3, capacity), workers(plane, [("gang-1", ["default"])]) as [worker]:
        await cluster.create_pods(gang("train", 8, min_available=8, cpu="4"), namespace=namespace)

        async def explained() -> tuple[bool, str]:
            message = await condition_message(cluster, namespace, "train-0000")
            return "only 6 of 8 members fit" in message, message

        await until(explained, timeout=60, what="the gang to be reported unschedulable")
        await worker_tries_again(worker)  # the gang is its only waiting work: it tried the whole gang once more
        assert await bound_pods(cluster, namespace) == [], "a gang that does not fit whole must bind nothing"
        for i in range(8):
            assert "gang" in await condition_message(cluster, namespace, f"train-{i:04d}")

        async with node_set(cluster, 1, capacity):
            pods = await wait_all_bound(cluster, namespace, 8, timeout=90)
        assert len({p["spec"]["nodeName"] for p in pods}) == 4
        await cluster.delete_pods(namespace)


async def test_min_available_below_the_group_size_binds_at_least_that_many_at_once(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    async with node_set(cluster, 3, capacity), workers(plane, [("gang-2", ["default"])]):
        await cluster.create_pods(gang("elastic", 8, min_available=5, cpu="4"), namespace=namespace)

        async def enough() -> tuple[bool, str]:
            count = len(await bound_pods(cluster, namespace))
            return count >= 5, f"{count} bound"

        await until(enough, timeout=60, what="at least min-available members to be bound")
        await wait_all_bound(cluster, namespace, 6)  # everything that fits, all in one reservation
        bound = await bound_pods(cluster, namespace)
        remaining = sorted({f"elastic-{i:04d}" for i in range(8)} - {p["metadata"]["name"] for p in bound})
        assert len(remaining) == 2
        # The two that did not fit stay unbound (no room: the three nodes are full), and are placed as soon as
        # room appears: the gang has started, so they go one by one.
        assert oversold_nodes(await cluster.raw_list("list_node"), bound) == {}
        async with node_set(cluster, 1, capacity) as extra:
            pods = await wait_all_bound(cluster, namespace, 8, timeout=150)
        late = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["metadata"]["name"] in remaining}
        assert late == dict.fromkeys(remaining, extra[0]), late
        await cluster.delete_pods(namespace)


async def test_podgroup_gang_waits_for_min_member_reports_its_timeout_then_binds_together(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    podgroup = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": "job-pg", "namespace": namespace},
                "spec": {"minMember": 3, "scheduleTimeoutSeconds": 2}}
    custom: Any = client.CustomObjectsApi(cluster.api)
    await custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", podgroup)
    members = hoss_pods("job-pg", 3, labels={"scheduling.x-k8s.io/pod-group": "job-pg"})
    async with node_set(cluster, 2, capacity), workers(plane, [("pg-1", ["default"])]):
        await cluster.create_pods(members[:2], namespace=namespace)

        async def timed_out() -> tuple[bool, str]:
            events = await cluster.events_for(namespace, "job-pg-0000")
            reasons = sorted({e.reason for e in events})
            return "GangTimeout" in reasons, ", ".join(reasons)

        await until(timed_out, timeout=60, what="the incomplete gang to report its timeout")
        assert await bound_pods(cluster, namespace) == []
        await cluster.create_pods(members[2:], namespace=namespace)
        await wait_all_bound(cluster, namespace, 3, timeout=60)
        await cluster.delete_pods(namespace)


async def test_gang_of_16_on_4_leaf_switches_uses_the_fewest_leaves(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    leaves = []
    try:
        for leaf in ("leaf-a", "leaf-b", "leaf-c", "leaf-d"):
            names = await cluster.create_nodes(4, prefix=f"pol{next(_sets)}-{leaf}", capacity=capacity,
                                               labels={"topology.hoss.io/leaf": leaf})
            leaves.extend(names)
        await cluster.wait_nodes_ready(leaves)
        async with workers(plane, [("topo-1", ["gang-topology"])]):
            # 16 members of 4 cpu: two per node, so 8 nodes, which two leaves of 4 nodes hold exactly.
            await cluster.create_pods(gang("allreduce", 16, min_available=16, cpu="4", policy="gang-topology"),
                                      namespace=namespace)
            pods = await wait_all_bound(cluster, namespace, 16, timeout=90)
        used_leaves = {node.rsplit("-", 1)[0] for node in (p["spec"]["nodeName"] for p in pods)}
        print(f"gang of 16 placed on leaves: {sorted(used_leaves)}")
        assert len(used_leaves) == 2
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(leaves)


# --- GPU packing -----------------------------------------------------------------------------------------------

async def place_gpu_stream(plane: LocalPlane, cluster: Cluster, namespace: str, policy: str) -> dict[str, int]:
    """1, 2, 3 and 4-GPU pods, one after another, on 8 fresh 8-GPU nodes; the GPU figures after placement."""
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "110", GPU: "8"}
    async with node_set(cluster, 8, capacity) as nodes, workers(plane, [(f"gpu-{policy}", [policy])]):
        sizes = [1, 2, 3, 4] * 3  # 30 of the 64 GPUs
        for i, gpus in enumerate(sizes):
            await cluster.create_pods(hoss_pods(f"{policy}-{i:02d}", 1, policy=policy, extra={GPU: str(gpus)}),
                                      namespace=namespace)
            await wait_all_bound(cluster, namespace, i + 1, timeout=60)
        used: Counter[str] = Counter()
        for placed in await bound_pods(cluster, namespace):
            used[placed["spec"]["nodeName"]] += int(placed["spec"]["containers"][0]["resources"]["requests"][GPU])
        await cluster.delete_pods(namespace)

        async def deleted() -> tuple[bool, str]:
            left = len(await cluster.raw_list("list_namespaced_pod", namespace))
            return left == 0, f"{left} pods left"

        await until(deleted, timeout=60, what=f"the {policy} pods to be deleted")
        free_nodes = sum(1 for n in nodes if used[n] == 0)
        stranded = sum(8 - used[n] for n in nodes if 0 < used[n] < 8)
        return {"fully_free_gpu_nodes": free_nodes, "stranded_gpus": stranded}


async def test_gpu_policy_leaves_more_whole_gpu_nodes_than_spread_and_no_fewer_than_binpack(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    packed = await place_gpu_stream(plane, cluster, namespace, "gpu")
    spread = await place_gpu_stream(plane, cluster, namespace, "default")
    binpack = await place_gpu_stream(plane, cluster, namespace, "binpack")
    print(f"same 12 GPU pods on 8 8-GPU nodes: gpu policy {packed}, binpack (MostAllocated) {binpack}, "
          f"default spread {spread}")
    assert packed["fully_free_gpu_nodes"] > spread["fully_free_gpu_nodes"]
    assert packed["stranded_gpus"] < spread["stranded_gpus"]
    # Against generic bin-packing (MostAllocated on cpu, memory and GPUs), GPU packing is at least as good.
    assert packed["fully_free_gpu_nodes"] >= binpack["fully_free_gpu_nodes"]
    assert packed["stranded_gpus"] <= binpack["stranded_gpus"]


# --- node pools --------------------------------------------------------------------------------------------------

async def test_pool_pods_stay_in_their_pool_and_a_tenant_namespace_stays_in_its_mapped_pool(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    tenant = f"{namespace}-tenant"
    await cluster.ensure_namespace(tenant)
    extra = [policies_file(tmp_path, {"namespacePools": {tenant: "pool-b"}})]
    try:
        async with node_set(cluster, 3, capacity, **{"hoss.io/pool": "pool-a"}) as pool_a, \
                node_set(cluster, 3, capacity, **{"hoss.io/pool": "pool-b"}) as pool_b, \
                node_set(cluster, 3, capacity) as no_pool, \
                workers(plane, [("pools-1", ["default"])], extra_args=extra):
            await cluster.create_pods(hoss_pods("in-a", 20, labels={"hoss.io/pool": "pool-a"}), namespace=namespace)
            await cluster.create_pods(hoss_pods("tenant", 20), namespace=tenant)
            in_a = await wait_all_bound(cluster, namespace, 20)
            in_tenant = await wait_all_bound(cluster, tenant, 20)
            assert {p["spec"]["nodeName"] for p in in_a} <= set(pool_a)
            assert {p["spec"]["nodeName"] for p in in_tenant} <= set(pool_b)
            assert not {p["spec"]["nodeName"] for p in in_a + in_tenant} & set(no_pool)
    finally:
        await cluster.delete_pods(tenant)


# --- custom plugins and extenders --------------------------------------------------------------------------------

async def test_entry_point_plugin_installed_for_the_worker_changes_placement(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = tmp_path / "site"
    example = EXAMPLE_PLUGIN
    (site / "hoss_example_plugin").mkdir(parents=True)
    (site / "hoss_example_plugin" / "__init__.py").write_text(
        (example / "hoss_example_plugin" / "__init__.py").read_text())
    install_dist_info(site, name="hoss-example-plugin", version="0.1.0",
                      entry_points={"prefer-label": "hoss_example_plugin:PreferLabel"})
    monkeypatch.setenv("PYTHONPATH", str(site))  # what `pip install` would give the worker's interpreter
    profile = {"name": "ssd-first", "filters": [{"name": "NodeResourcesFit"}],
               "scores": [{"name": "prefer-label", "weight": 10, "args": {"label": "disktype", "value": "ssd"}},
                          {"name": "LeastAllocated", "weight": 1}]}
    extra = [policies_file(tmp_path, {"profiles": [profile]})]
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    async with node_set(cluster, 4, capacity) as plain, node_set(cluster, 2, capacity, disktype="ssd") as ssd, \
            workers(plane, [("plugin-1", ["ssd-first", "default"])], extra_args=extra):
        await cluster.create_pods(hoss_pods("ssd", 10, policy="ssd-first"), namespace=namespace)
        pods = await wait_all_bound(cluster, namespace, 10)
        assert {p["spec"]["nodeName"] for p in pods} <= set(ssd), "the plugin's score must win"
        # The control: the same pods without the plugin (the default profile, LeastAllocated) go to the plain
        # nodes, which are emptier, so it was the plugin, not a filter, that kept them off those nodes.
        await cluster.create_pods(hoss_pods("control", 10, policy="default"), namespace=namespace)
        pods = await wait_all_bound(cluster, namespace, 20)
    control = {p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith("control-")}
    assert control and control <= set(plain), control


class Extender:
    """A kube-scheduler HTTP extender in the test process: filter keeps ``allowed`` nodes, prioritize ranks."""

    def __init__(self, allowed: set[str], *, delay: float = 0.0, fail: bool = False) -> None:
        self.allowed, self.delay, self.fail = allowed, delay, fail
        self.calls: Counter[str] = Counter()

    async def filter(self, request: web.Request) -> web.Response:
        self.calls["filter"] += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            return web.Response(status=500, text="extender is broken")
        args = await request.json()
        names = args.get("NodeNames") or [n["metadata"]["name"] for n in args["Nodes"]["items"]]
        keep = [n for n in names if n in self.allowed]
        return web.json_response({"NodeNames": keep, "FailedNodes": {n: "not allowed by extender"
                                                                    for n in names if n not in self.allowed},
                                  "Error": ""})

    async def prioritize(self, request: web.Request) -> web.Response:
        self.calls["prioritize"] += 1
        args = await request.json()
        names = args.get("NodeNames") or [n["metadata"]["name"] for n in args["Nodes"]["items"]]
        return web.json_response([{"Host": n, "Score": 10 if n in self.allowed else 0} for n in names])


@asynccontextmanager
async def serve_extender(extender: Extender) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/filter", extender.filter)
    app.router.add_post("/prioritize", extender.prioritize)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def extender_profile(name: str, url: str, *, ignorable: bool, timeout: float = 2.0) -> dict[str, Any]:
    return {"name": name, "filters": [{"name": "NodeResourcesFit"}], "scores": [{"name": "LeastAllocated",
                                                                                 "weight": 1}],
            "extenders": [{"urlPrefix": url, "filterVerb": "filter", "prioritizeVerb": "prioritize", "weight": 5,
                           "nodeCacheCapable": True, "ignorable": ignorable, "timeoutSeconds": timeout}]}


async def test_extender_changes_placement_and_an_ignorable_failing_one_does_not_stop_scheduling(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    async with node_set(cluster, 4, capacity) as nodes:
        chosen = Extender({nodes[3]})
        broken = Extender(set(nodes), delay=5.0)
        async with serve_extender(chosen) as good_url, serve_extender(broken) as slow_url:
            profiles = [extender_profile("ext-good", good_url, ignorable=False),
                        extender_profile("ext-slow", slow_url, ignorable=True, timeout=0.5)]
            extra = [policies_file(tmp_path, {"profiles": profiles})]
            async with workers(plane, [("ext-1", ["ext-good", "ext-slow"])], extra_args=extra):
                await cluster.create_pods(hoss_pods("good", 5, policy="ext-good"), namespace=namespace)
                good = await wait_all_bound(cluster, namespace, 5)
                await cluster.create_pods(hoss_pods("slow", 5, policy="ext-slow"), namespace=namespace)
                both = await wait_all_bound(cluster, namespace, 10)
    assert {p["spec"]["nodeName"] for p in good} == {nodes[3]}
    assert chosen.calls["filter"] >= 5
    assert broken.calls["filter"] >= 1, "the slow extender was asked (and timed out)"
    assert len(both) == 10
    print(json.dumps({"good_extender_calls": dict(chosen.calls), "slow_extender_calls": dict(broken.calls)}))
