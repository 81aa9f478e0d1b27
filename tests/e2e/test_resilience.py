"""hoss survives a kube-apiserver restart in the middle of a run: every watch resumes (or re-lists), every pod is
bound, the ledger agrees with the apiserver, and no node is oversold."""

from __future__ import annotations

import asyncio

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.ledger.client import Ledger
from tests.e2e.hoss import hoss_pods, wait_all_bound, workers
from tests.waiting import until

NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}
BEFORE, AFTER = 120, 80


async def test_an_apiserver_restart_mid_run_loses_no_pod_and_oversells_nothing(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    nodes = await cluster.create_nodes(4, prefix="restart", capacity=NODE_CAPACITY)
    try:
        await cluster.wait_nodes_ready(nodes)
        async with workers(plane, [("restart-1", ["default"]), ("restart-2", ["default"])]):
            await cluster.create_pods(hoss_pods("before", BEFORE, cpu="100m"), namespace=namespace)

            async def under_way() -> tuple[bool, str]:
                pods = await cluster.raw_list("list_namespaced_pod", namespace)
                done = sum(1 for p in pods if p["spec"].get("nodeName"))
                return done >= 10, f"{done} bound"

            await until(under_way, timeout=60, what="the run to be under way")
            # The restart drops every connection: watches end mid-stream, bindings in flight fail or get lost.
            await asyncio.to_thread(plane.restart_apiserver)
            resolver = next(p for p in plane.state().processes if p.name == "hoss-resolver")
            assert plane.status().get("hoss-resolver"), f"the resolver must survive the restart; see {resolver.log}"
            # Pods created after the restart reach hoss only through the resumed (or re-listed) watches.
            await cluster.create_pods(hoss_pods("after", AFTER, cpu="100m"), namespace=namespace)
            pods = await wait_all_bound(cluster, namespace, BEFORE + AFTER, timeout=240)

        assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)
        assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}
        pending = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
        assert pending == [], "no schedulable pod may be left pending"

        # The resolver's sync followed the apiserver through the restart: every binding is a bound entry.
        expected = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods}
        ledger = Ledger.from_url(plane.state().redis_url)
        try:
            async def ledger_agrees() -> tuple[bool, str]:
                entries = {e.uid: (e.node, e.state) for e in await ledger.entries() if e.uid in expected}
                wrong = [uid for uid, node in expected.items() if entries.get(uid) != (node, "bound")]
                return not wrong, f"{len(wrong)} pods not bound in the ledger where the apiserver has them"

            await until(ledger_agrees, timeout=60, what="the ledger to agree with the apiserver")
        finally:
            await ledger.close()
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)
