"""The demo's stage: its namespaces, the nodes of the throughput story and of each other story, the pods' manifests,
and which policies each worker serves."""

from __future__ import annotations

import random

from dev.local.cluster import Cluster, pod_manifest
from dev.local.devices import GPUS_LABEL, MODEL_LABEL
from hoss.model.objects import Json

DEMO_NAMESPACE = "hoss-demo"
GANGS_NAMESPACE = "hoss-demo-gangs"
GPU_NAMESPACE = "hoss-demo-gpu"
TENANT_NAMESPACE = "hoss-demo-tenant"
RACE_NAMESPACE = "hoss-demo-race"
DEVICES_NAMESPACE = "hoss-demo-devices"
NAMESPACES = (DEMO_NAMESPACE, GANGS_NAMESPACE, GPU_NAMESPACE, TENANT_NAMESPACE, RACE_NAMESPACE, DEVICES_NAMESPACE)
SCHEDULER_NAME = "hoss"
GPU = "nvidia.com/gpu"
POLICY_LABEL = "hoss.io/policy"
STORY_KEY = "demo.hoss.io/story"
"""Taint and label of a story's nodes; the story's pods tolerate the taint and select the label."""
TENANT_POOL = "pool-b"
STORY_TIMEOUT_SECONDS = 90.0

GANG_NODES = 4
GPU_STORY_NODES = 8
RACE_NODES = 4
RACE_NODE_CPU = 4
"""The foreign-scheduler story's nodes are few and small, so both schedulers aim at the same room at once."""
GPU_NODE = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"}
DRA_GPUS = 8
DRA_MODELS = ("h100", "a100")
"""The devices story's nodes: one per model, each publishing ``DRA_GPUS`` fake GPUs through the plane's fake DRA
driver (dev/local/devices.py), none in its allocatable."""
STORY_NODES = GANG_NODES + 2 * GPU_STORY_NODES + RACE_NODES + len(DRA_MODELS)


def worker_layout(count: int) -> list[tuple[str, list[str]]]:
    """K workers over three policies: the first serves default, the last binpack and gpu, the others all three."""
    layout = []
    for i in range(1, count + 1):
        if count == 1:
            policies = ["default", "binpack", "gpu"]
        elif i == 1:
            policies = ["default"]
        elif i == count:
            policies = ["binpack", "gpu"]
        else:
            policies = ["default", "binpack", "gpu"]
        layout.append((f"w{i}", policies))
    return layout


def demo_pods(count: int, *, seed: int = 7) -> list[Json]:
    """A mix: small and medium CPU pods under the default (spread) policy, GPU pods under binpack."""
    rng = random.Random(seed)
    pods = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.1:
            gpus = rng.choice([1, 1, 2, 2, 4, 8])
            requests = {"cpu": "4", "memory": "16Gi", GPU: str(gpus)}
            policy = "binpack"
        elif roll < 0.4:
            requests = {"cpu": rng.choice(["1", "2"]), "memory": rng.choice(["2Gi", "4Gi"])}
            policy = "binpack"
        else:
            requests = {"cpu": rng.choice(["250m", "500m", "1"]), "memory": rng.choice(["512Mi", "1Gi"])}
            policy = "default"
        pod = pod_manifest(f"demo-{i:05d}", requests=requests, scheduler_name=SCHEDULER_NAME,
                           labels={POLICY_LABEL: policy, "app": "hoss-demo"})
        if GPU in requests:
            pod["spec"]["containers"][0]["resources"]["limits"] = {GPU: requests[GPU]}
        pods.append(pod)
    return pods


def story_pod(name: str, story: str, *, requests: dict[str, str], policy: str = "default",
              scheduler_name: str = SCHEDULER_NAME, labels: dict[str, str] | None = None) -> Json:
    """A pod that tolerates the story's taint and selects its nodes."""
    pod = pod_manifest(name, requests=requests, scheduler_name=scheduler_name,
                       labels={POLICY_LABEL: policy, "app": f"hoss-demo-{story}", **(labels or {})})
    pod["spec"]["tolerations"] = [{"key": STORY_KEY, "operator": "Equal", "value": story, "effect": "NoSchedule"}]
    pod["spec"]["nodeSelector"] = {STORY_KEY: story}
    if GPU in requests:
        pod["spec"]["containers"][0]["resources"]["limits"] = {GPU: requests[GPU]}
    return pod


async def create_demo_nodes(cluster: Cluster, count: int) -> list[str]:
    """80% CPU nodes, 20% 8-GPU nodes; two pools."""
    gpu_nodes = max(1, count // 5)
    cpu_nodes = count - gpu_nodes
    names = await cluster.create_nodes(
        cpu_nodes // 2, prefix="demo-cpu-a", capacity={"cpu": "16", "memory": "64Gi", "pods": "110"},
        labels={"hoss.io/pool": "pool-a"})
    names += await cluster.create_nodes(
        cpu_nodes - cpu_nodes // 2, prefix="demo-cpu-b", capacity={"cpu": "16", "memory": "64Gi", "pods": "110"},
        labels={"hoss.io/pool": TENANT_POOL})
    names += await cluster.create_nodes(
        gpu_nodes, prefix="demo-gpu", capacity=GPU_NODE,
        labels={"hoss.io/pool": "pool-gpu", "nvidia.com/gpu.present": "true"})
    return names


async def create_story_nodes(cluster: Cluster) -> dict[str, list[str]]:
    """Each story's nodes, tainted and labelled with its name; the devices story's also ask the plane's fake DRA
    driver for GPUs."""
    async def story_nodes(story: str, count: int, capacity: dict[str, str], *, prefix: str = "",
                          labels: dict[str, str] | None = None) -> list[str]:
        taint = {"key": STORY_KEY, "value": story, "effect": "NoSchedule"}
        return await cluster.create_nodes(count, prefix=prefix or f"demo-{story}", capacity=capacity,
                                          labels={STORY_KEY: story, **(labels or {})}, taints=[taint])

    devices: list[str] = []
    for model in DRA_MODELS:
        devices += await story_nodes("devices", 1, {"cpu": "64", "memory": "512Gi", "pods": "110"},
                                     prefix=f"demo-dra-{model}", labels={GPUS_LABEL: str(DRA_GPUS), MODEL_LABEL: model})
    return {
        "gangs": await story_nodes("gangs", GANG_NODES, {"cpu": "8", "memory": "32Gi", "pods": "110"}),
        "gpu-pack": await story_nodes("gpu-pack", GPU_STORY_NODES, GPU_NODE),
        "gpu-spread": await story_nodes("gpu-spread", GPU_STORY_NODES, GPU_NODE),
        "race": await story_nodes("race", RACE_NODES,
                                  {"cpu": str(RACE_NODE_CPU), "memory": "64Gi", "pods": "110"}),
        "devices": devices,
    }
