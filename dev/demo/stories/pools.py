"""Story 4, pools: a tenant's pods (label ``hoss.io/pool``) land only on their pool's nodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dev.demo.observe import bound, list_pods, wait_bound
from dev.demo.stage import SCHEDULER_NAME, TENANT_NAMESPACE, TENANT_POOL
from dev.local.cluster import Cluster, pod_manifest


@dataclass
class PoolStory:
    pool: str
    pool_nodes: int
    pods: int
    in_pool: int
    elsewhere: int


async def pool_story(cluster: Cluster, progress: Callable[[str], None], *, pods: int) -> PoolStory:
    progress(f"pools: {pods} pods of tenant namespace {TENANT_NAMESPACE} labelled hoss.io/pool={TENANT_POOL}")
    manifests = [pod_manifest(f"tenant-{i:03d}", requests={"cpu": "250m", "memory": "256Mi"},
                              scheduler_name=SCHEDULER_NAME,
                              labels={"hoss.io/pool": TENANT_POOL, "app": "hoss-demo-tenant"})
                 for i in range(pods)]
    await cluster.create_pods(manifests, namespace=TENANT_NAMESPACE)
    await wait_bound(cluster, TENANT_NAMESPACE, "app=hoss-demo-tenant", pods, what="the tenant's pods to be bound")
    pool_nodes = {n["metadata"]["name"]
                  for n in await cluster.raw_list("list_node", label_selector=f"hoss.io/pool={TENANT_POOL}")}
    placed = bound(await list_pods(cluster, TENANT_NAMESPACE, "app=hoss-demo-tenant"))
    inside = sum(1 for p in placed if p["spec"]["nodeName"] in pool_nodes)
    return PoolStory(pool=TENANT_POOL, pool_nodes=len(pool_nodes), pods=pods, in_pool=inside,
                     elsewhere=len(placed) - inside)

