"""``hoss demo``: a local plane with fake nodes, and pods placed on it by a real scheduler.

The demo leaves the plane running so that it can be explored with kubectl; ``hoss local down`` stops it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from deploy.local.cluster import Cluster, pod_manifest, wait_until
from deploy.local.plane import LocalPlane

DEMO_NAMESPACE = "hoss-demo"
NODE_PREFIX = "demo-node"
NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}


async def run_demo(*, plane: LocalPlane, nodes: int, pods: int, progress: Callable[[str], None]) -> int:
    plane.up(progress=progress)
    async with await Cluster.connect(plane.kubeconfig("admin")) as cluster:
        await cluster.ensure_namespace(DEMO_NAMESPACE)
        await cluster.delete_pods(DEMO_NAMESPACE)
        existing = [n.metadata.name for n in (await cluster.core.list_node()).items]
        await cluster.delete_nodes(n for n in existing if n.startswith(NODE_PREFIX))

        progress(f"creating {nodes} fake nodes ({NODE_CAPACITY['cpu']} cpu, {NODE_CAPACITY['memory']} each)")
        names = await cluster.create_nodes(nodes, prefix=NODE_PREFIX, capacity=NODE_CAPACITY)
        await cluster.wait_nodes_ready(names, timeout=120)
        print(plane.kubectl("get", "nodes", "-o", "wide", "--sort-by=.metadata.name"))

        progress(f"creating {pods} pods for the real kube-scheduler (default-scheduler)")
        manifests = [
            pod_manifest(f"demo-{i:03d}", requests={"cpu": "500m", "memory": "1Gi"}) for i in range(pods)
        ]
        await cluster.create_pods(manifests, namespace=DEMO_NAMESPACE)

        async def running() -> tuple[bool, str]:
            listed = await cluster.pods(DEMO_NAMESPACE)
            phases = Counter(p.status.phase for p in listed)
            return phases.get("Running", 0) == pods, ", ".join(f"{k}: {v}" for k, v in sorted(phases.items()))

        seen = await wait_until(running, timeout=120, what=f"{pods} demo pods to run")
        progress(f"pods: {seen}")
        print(plane.kubectl("get", "pods", "-n", DEMO_NAMESPACE, "-o", "wide"))
    print("The plane keeps running. To use it from this shell:")
    print(plane.exports())
    print("Tear it down with: .venv/bin/hoss local down")
    return 0
