"""Story 3, GPU packing: the same 1/2/4-GPU pods on two identical sets of 8-GPU nodes, under the ``gpu`` policy and
under the spreading ``default`` policy: whole GPU nodes left free and GPUs stranded, then one 8-GPU job on each set."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dev.demo.observe import bound, list_pods, scheduled_condition, wait_bound
from dev.demo.stage import GPU, GPU_NAMESPACE, GPU_STORY_NODES, STORY_KEY, STORY_TIMEOUT_SECONDS, story_pod
from dev.local.cluster import Cluster, wait_until
from hoss.model.objects import Json
from hoss.model.resources import gpu_spread, node_allocatable, pod_requests


@dataclass
class GpuArm:
    policy: str
    pods: int
    placed: int
    fully_free_nodes: int
    partly_used_nodes: int
    stranded_gpus: int
    """Free GPUs on partly used nodes: too few together for a job that needs a whole node."""
    whole_node_job_bound: bool
    """An 8-GPU job created after the others were placed found a whole free node."""


@dataclass
class GpuStory:
    gpu_nodes: int
    """8-GPU nodes per arm (two identical sets)."""
    gpus_requested: int
    packed: GpuArm
    spread: GpuArm


def gpu_story_pods(story: str, policy: str, *, gpus: int, seed: int = 11) -> list[Json]:
    """1/2/4-GPU pods adding up to ``gpus``, in a fixed random order (the same for both arms)."""
    rng = random.Random(seed)
    pods: list[Json] = []
    total = 0
    while total < gpus:
        size = min(rng.choice([1, 1, 2, 2, 4]), gpus - total)
        pods.append(story_pod(f"{story}-{len(pods):03d}", story, policy=policy,
                              requests={"cpu": "1", "memory": "4Gi", GPU: str(size)}))
        total += size
    return pods


def _gpu_figures(nodes: Sequence[Json], pods: Sequence[Json]) -> tuple[int, int, int]:
    used: dict[str, int] = {}
    for pod in bound(pods):
        node = pod["spec"]["nodeName"]
        used[node] = used.get(node, 0) + pod_requests(pod).get(GPU, 0)
    spread = gpu_spread((node_allocatable(n).get(GPU, 0), used.get(n["metadata"]["name"], 0)) for n in nodes)
    return spread.fully_free_nodes, spread.partly_used_nodes, spread.stranded_gpus


async def gpu_story(cluster: Cluster, progress: Callable[[str], None]) -> GpuStory:
    gpus = GPU_STORY_NODES * 8 // 2
    arms = {"gpu-pack": "gpu", "gpu-spread": "default"}
    progress(f"GPU packing: {gpus} GPUs of 1/2/4-GPU pods on {GPU_STORY_NODES} 8-GPU nodes, twice: "
             "the gpu policy, and the spreading default policy")
    pods = {story: gpu_story_pods(story, policy, gpus=gpus) for story, policy in arms.items()}
    for story in arms:
        await cluster.create_pods(pods[story], namespace=GPU_NAMESPACE)
    for story in arms:
        await wait_bound(cluster, GPU_NAMESPACE, f"app=hoss-demo-{story}", len(pods[story]),
                         what=f"the {story} pods to be bound")
    all_nodes = await cluster.raw_list("list_node", label_selector=STORY_KEY)
    result: dict[str, GpuArm] = {}
    for story, policy in arms.items():
        nodes = [n for n in all_nodes if n["metadata"]["labels"].get(STORY_KEY) == story]
        listed = await list_pods(cluster, GPU_NAMESPACE, f"app=hoss-demo-{story}")
        free, partly, stranded = _gpu_figures(nodes, listed)
        result[story] = GpuArm(policy=policy, pods=len(listed), placed=len(bound(listed)), fully_free_nodes=free,
                               partly_used_nodes=partly, stranded_gpus=stranded, whole_node_job_bound=False)
    progress("GPU packing: one 8-GPU job on each set")
    jobs = {story: story_pod(f"{story}-whole-node-job", story, policy=policy,
                             requests={"cpu": "1", "memory": "4Gi", GPU: "8"}, labels={"demo.hoss.io/job": "big"})
            for story, policy in arms.items()}
    await cluster.create_pods(jobs.values(), namespace=GPU_NAMESPACE)
    for story in arms:
        name = jobs[story]["metadata"]["name"]

        async def decided(job: str = name) -> tuple[bool, str]:
            pod = await request_pod(cluster, job)
            if pod is None:
                return False, "not found"
            reason, message = scheduled_condition(pod)
            return bool(pod["spec"].get("nodeName") or reason), message or "no decision yet"

        await wait_until(decided, timeout=STORY_TIMEOUT_SECONDS, what=f"{name} to be bound or refused")
        job = await request_pod(cluster, name)
        result[story].whole_node_job_bound = bool(job and job["spec"].get("nodeName"))
    return GpuStory(gpu_nodes=GPU_STORY_NODES, gpus_requested=gpus, packed=result["gpu-pack"],
                    spread=result["gpu-spread"])


async def request_pod(cluster: Cluster, name: str, namespace: str = GPU_NAMESPACE) -> Json | None:
    listed = await cluster.raw_list("list_namespaced_pod", namespace, field_selector=f"metadata.name={name}")
    return listed[0] if listed else None
