"""``hoss demo``: the whole system on a real local plane, told as five short stories, with a final report.

Brings up the plane (etcd, kube-apiserver, kwok, kube-scheduler, redis, the resolver webhook), starts a dispatcher
and K workers, creates fake nodes, and runs, one after another:

1. throughput: a mix of CPU and GPU pods on CPU nodes in two pools and 8-GPU nodes (pods bound and pending, pods/s,
   ledger conflicts retried, pods per worker, why pods wait);
2. gangs: a gang held with ``GangIncomplete`` until its last member exists, then bound all together; a second gang
   that cannot fit binds nothing (not even the member that would fit) and starts once the first one leaves;
3. GPU packing: the same 1/2/4-GPU pods on two identical sets of 8-GPU nodes, under the ``gpu`` policy and under
   the spreading ``default`` policy: whole GPU nodes left free and GPUs stranded, then one 8-GPU job on each;
4. pools: a tenant's pods (label ``hoss.io/pool``) land only on their pool's nodes;
5. a foreign scheduler: kube-scheduler and hoss race for the same nodes with more pods than room; the resolver
   denies kube-scheduler's conflicting bindings, and no node is oversold.

Each story's nodes carry a taint its pods tolerate (and a label they select), so the stories do not mix. Oversold
nodes are counted from the apiserver alone (every bound pod's requests against its node's allocatable). The plane
and the hoss processes keep running afterwards, for ``hoss status``, the dashboard and kubectl.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from redis.asyncio import Redis

from dev.local.cluster import Cluster, WaitTimeout, oversold_nodes, pod_manifest, wait_until
from dev.local.plane import LocalPlane
from hoss.model.objects import Json
from hoss.model.resources import gpu_spread, node_allocatable, pod_requests
from hoss.queue import WorkQueue

DEMO_NAMESPACE = "hoss-demo"
GANGS_NAMESPACE = "hoss-demo-gangs"
GPU_NAMESPACE = "hoss-demo-gpu"
TENANT_NAMESPACE = "hoss-demo-tenant"
RACE_NAMESPACE = "hoss-demo-race"
NAMESPACES = (DEMO_NAMESPACE, GANGS_NAMESPACE, GPU_NAMESPACE, TENANT_NAMESPACE, RACE_NAMESPACE)
SCHEDULER_NAME = "hoss"
GPU = "nvidia.com/gpu"
STORY_KEY = "demo.hoss.io/story"
"""Taint and label of a story's nodes; the story's pods tolerate the taint and select the label."""
GANG_NAME_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
GANG_MIN_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"
TENANT_POOL = "pool-b"
ALLOWED_VERDICTS = ("reserved", "fits", "not-enforced", "not-a-binding")
STORY_TIMEOUT_SECONDS = 90.0


@dataclass
class GangStory:
    gang_nodes: int
    """Nodes of the story, each with room for exactly one member (8 cpu, members request 8)."""
    first_gang: str
    first_min_available: int
    held_with: int
    """Members of the first gang created before the last one: fewer than min-available."""
    held_reason: str
    """The PodScheduled=False reason the held members showed (the dispatcher's ``GangIncomplete``)."""
    held_message: str
    first_bound_when_complete: int
    """Members of the first gang bound once its last member was created (all of them: all or nothing)."""
    second_gang: str
    second_members: int
    second_fit_alone: int
    """Members of the second gang that would fit on their own while the first gang runs (free nodes)."""
    second_bound_while_blocked: int
    """Members of the second gang bound while it could not fit as a whole (0: all or nothing)."""
    second_message: str
    """What the second gang's members said while they waited."""
    second_bound_after_room: int
    """Members of the second gang bound after the first gang's pods were deleted."""
    seconds_to_start_after_room: float


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


@dataclass
class PoolStory:
    pool: str
    pool_nodes: int
    pods: int
    in_pool: int
    elsewhere: int


@dataclass
class RaceStory:
    nodes: int
    cpu_capacity: int
    """Cores over the story's nodes; every pod requests one core, so this is also the most pods that fit."""
    hoss_pods: int
    kube_pods: int
    hoss_bound: int
    kube_bound: int
    denials: int
    """Bindings the resolver denied during the story (its verdict counters, before and after)."""
    denial_message: str
    """The message kube-scheduler recorded for a denied binding (its FailedScheduling event), as users see it."""
    oversold_nodes: int


@dataclass
class DemoReport:
    pods_total: int
    pods_bound: int
    pods_pending: int
    seconds: float
    pods_per_second: float
    ledger_conflicts: int
    """Ledger conflicts the workers retried during the throughput story."""
    webhook_denials: int
    """Bindings the resolver denied over the whole demo (the foreign-scheduler story's among them)."""
    oversold_nodes: int
    """Over every node and every bound pod of the plane, checked from the apiserver after all the stories."""
    per_worker: dict[str, int]
    nodes: int
    workers: int
    status_url: str
    pending_reasons: dict[str, int] = field(default_factory=dict)
    dashboard_url: str = ""
    gangs: GangStory | None = None
    gpu: GpuStory | None = None
    pools: PoolStory | None = None
    race: RaceStory | None = None
    demo_seconds: float = 0.0
    """From the first node created to the end of the last story."""


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
                           labels={"hoss.io/policy": policy, "app": "hoss-demo"})
        if GPU in requests:
            pod["spec"]["containers"][0]["resources"]["limits"] = {GPU: requests[GPU]}
        pods.append(pod)
    return pods


def story_pod(name: str, story: str, *, requests: dict[str, str], policy: str = "default",
              scheduler_name: str = SCHEDULER_NAME, labels: dict[str, str] | None = None) -> Json:
    """A pod that tolerates the story's taint and selects its nodes."""
    pod = pod_manifest(name, requests=requests, scheduler_name=scheduler_name,
                       labels={"hoss.io/policy": policy, "app": f"hoss-demo-{story}", **(labels or {})})
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
        gpu_nodes, prefix="demo-gpu", capacity={"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"},
        labels={"hoss.io/pool": "pool-gpu", "nvidia.com/gpu.present": "true"})
    return names


GANG_NODES = 4
GPU_STORY_NODES = 8
RACE_NODES = 10
RACE_NODE_CPU = 4
GPU_NODE = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"}


async def create_story_nodes(cluster: Cluster) -> dict[str, list[str]]:
    """Each story's nodes, tainted and labelled with its name."""
    async def story_nodes(story: str, count: int, capacity: dict[str, str]) -> list[str]:
        taint = {"key": STORY_KEY, "value": story, "effect": "NoSchedule"}
        return await cluster.create_nodes(count, prefix=f"demo-{story}", capacity=capacity,
                                          labels={STORY_KEY: story}, taints=[taint])

    return {
        "gangs": await story_nodes("gangs", GANG_NODES, {"cpu": "8", "memory": "32Gi", "pods": "110"}),
        "gpu-pack": await story_nodes("gpu-pack", GPU_STORY_NODES, GPU_NODE),
        "gpu-spread": await story_nodes("gpu-spread", GPU_STORY_NODES, GPU_NODE),
        "race": await story_nodes("race", RACE_NODES,
                                  {"cpu": str(RACE_NODE_CPU), "memory": "64Gi", "pods": "110"}),
    }


def _bar(done: int, total: int, rate: float, width: int = 40) -> str:
    filled = int(width * done / total) if total else width
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} bound  {rate:7.1f} pods/s"


async def _cluster_counters(redis: Redis) -> tuple[dict[str, int], int, int]:
    """Per-worker bound counts, ledger conflicts, webhook denials — from heartbeats and resolver stats."""
    live, _dead = await WorkQueue(redis).workers()
    per_worker = {w.id: w.counters.get("bound", 0) for w in live}
    conflicts = sum(w.counters.get("conflicts", 0) for w in live)
    denials = 0
    async for key in redis.scan_iter(match="{hoss}:resolver:*"):
        verdicts = json.loads(await redis.hget(key, "verdicts") or "{}")
        denials += sum(n for reason, n in verdicts.items() if reason not in ALLOWED_VERDICTS)
    return per_worker, conflicts, denials


def _bound(pods: Sequence[Json]) -> list[Json]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName")]


def _scheduled_condition(pod: Json) -> tuple[str, str]:
    """Reason and message of the pod's PodScheduled=False condition ('' when it has none)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("reason") or ""), str(condition.get("message") or "")
    return "", ""


async def _list(cluster: Cluster, namespace: str, selector: str = "") -> list[Json]:
    if selector:
        return await cluster.raw_list("list_namespaced_pod", namespace, label_selector=selector)
    return await cluster.raw_list("list_namespaced_pod", namespace)


async def _wait_bound(cluster: Cluster, namespace: str, selector: str, count: int, *, what: str) -> None:
    async def check() -> tuple[bool, str]:
        bound = len(_bound(await _list(cluster, namespace, selector)))
        return bound >= count, f"{bound}/{count} bound"

    await wait_until(check, timeout=STORY_TIMEOUT_SECONDS, what=what)


async def _wait_condition(cluster: Cluster, namespace: str, selector: str, *, contains: str,
                          what: str) -> tuple[str, str]:
    """Wait until a pod of ``selector`` says (reason or message) ``contains``; its reason and message."""
    found: list[tuple[str, str]] = []

    async def check() -> tuple[bool, str]:
        for pod in await _list(cluster, namespace, selector):
            reason, message = _scheduled_condition(pod)
            if contains in reason or contains in message:
                found.append((reason, message))
                return True, message
        return False, "no pod says it yet"

    await wait_until(check, timeout=STORY_TIMEOUT_SECONDS, what=what)
    return found[-1]


# --- 1. throughput ---------------------------------------------------------------------------------------------


@dataclass
class MixResult:
    bound: int
    seconds: float
    pending_reasons: dict[str, int]


async def mix_story(cluster: Cluster, pods: int, *, as_json: bool, progress: Callable[[str], None]) -> MixResult:
    progress(f"throughput: creating {pods} pods (schedulerName {SCHEDULER_NAME}; policies default and binpack)")
    started = time.monotonic()
    creating = asyncio.create_task(cluster.create_pods(demo_pods(pods), namespace=DEMO_NAMESPACE))
    last_change, bound, last_bound_at = time.monotonic(), -1, started
    while True:
        await asyncio.sleep(1)
        listed = await cluster.raw_list("list_namespaced_pod", DEMO_NAMESPACE)
        now_bound = len(_bound(listed))
        if now_bound != bound:
            bound, last_change, last_bound_at = now_bound, time.monotonic(), time.monotonic()
        elapsed = max(last_bound_at - started, 1e-6)
        if not as_json:
            print(_bar(bound, pods, bound / elapsed), end="", file=sys.stderr, flush=True)
        # Done when everything is bound, or nothing has moved for a while after creation finished.
        if creating.done() and (bound >= pods or time.monotonic() - last_change > 10):
            break
    await creating
    if not as_json:
        print(file=sys.stderr)
    listed = await cluster.raw_list("list_namespaced_pod", DEMO_NAMESPACE)
    reasons: Counter[str] = Counter()
    for pod in listed:
        if not pod["spec"].get("nodeName"):
            _reason, message = _scheduled_condition(pod)
            if message:
                reasons[message] += 1
    return MixResult(bound=bound, seconds=max(last_bound_at - started, 1e-6),
                     pending_reasons=dict(reasons.most_common(5)))


# --- 2. gangs --------------------------------------------------------------------------------------------------


def gang_member(gang: str, index: int, min_available: int) -> Json:
    return story_pod(f"{gang}-{index}", "gangs", requests={"cpu": "8", "memory": "8Gi"},
                     labels={GANG_NAME_LABEL: gang, GANG_MIN_LABEL: str(min_available)})


async def gang_story(cluster: Cluster, progress: Callable[[str], None]) -> GangStory:
    """train-a needs 3 of the 4 nodes; it is created one member short, then completed. train-b needs 2 nodes while
    only one is free: nothing of it is bound until train-a is deleted."""
    first, second = "train-a", "train-b"
    first_size, second_size = GANG_NODES - 1, 2
    progress(f"gangs: {first} ({first_size} members of 8 cpu, min-available {first_size}) created one member short")
    await cluster.create_pods([gang_member(first, i, first_size) for i in range(first_size - 1)],
                              namespace=GANGS_NAMESPACE)
    held_reason, held_message = await _wait_condition(
        cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={first}", contains="GangIncomplete",
        what=f"{first}'s members to say GangIncomplete")
    progress(f"gangs: {first} waits ({held_reason}); creating its last member")
    await cluster.create_pods([gang_member(first, first_size - 1, first_size)], namespace=GANGS_NAMESPACE)
    await _wait_bound(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={first}", first_size,
                      what=f"{first} to be bound")
    first_bound = len(_bound(await _list(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={first}")))

    progress(f"gangs: {second} ({second_size} members of 8 cpu) while one node is free")
    await cluster.create_pods([gang_member(second, i, second_size) for i in range(second_size)],
                              namespace=GANGS_NAMESPACE)
    _reason, second_message = await _wait_condition(
        cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={second}", contains="members fit",
        what=f"{second}'s members to say how many fit")
    blocked = len(_bound(await _list(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={second}")))
    progress(f"gangs: {second} holds nothing ({blocked} bound); deleting {first} to free its nodes")
    freed = time.monotonic()
    for i in range(first_size):
        await cluster.call(cluster.core.delete_namespaced_pod, f"{first}-{i}", GANGS_NAMESPACE, grace_period_seconds=0)
    await _wait_bound(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={second}", second_size,
                      what=f"{second} to start once {first} left")
    started = time.monotonic() - freed
    second_bound = len(_bound(await _list(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={second}")))
    return GangStory(
        gang_nodes=GANG_NODES, first_gang=first, first_min_available=first_size, held_with=first_size - 1,
        held_reason=held_reason, held_message=held_message, first_bound_when_complete=first_bound,
        second_gang=second, second_members=second_size, second_fit_alone=GANG_NODES - first_size,
        second_bound_while_blocked=blocked, second_message=second_message, second_bound_after_room=second_bound,
        seconds_to_start_after_room=round(started, 1),
    )


# --- 3. GPU packing --------------------------------------------------------------------------------------------


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
    for pod in _bound(pods):
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
        await _wait_bound(cluster, GPU_NAMESPACE, f"app=hoss-demo-{story}", len(pods[story]),
                          what=f"the {story} pods to be bound")
    all_nodes = await cluster.raw_list("list_node", label_selector=STORY_KEY)
    result: dict[str, GpuArm] = {}
    for story, policy in arms.items():
        nodes = [n for n in all_nodes if n["metadata"]["labels"].get(STORY_KEY) == story]
        listed = await _list(cluster, GPU_NAMESPACE, f"app=hoss-demo-{story}")
        free, partly, stranded = _gpu_figures(nodes, listed)
        result[story] = GpuArm(policy=policy, pods=len(listed), placed=len(_bound(listed)), fully_free_nodes=free,
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
            reason, message = _scheduled_condition(pod)
            return bool(pod["spec"].get("nodeName") or reason), message or "no decision yet"

        await wait_until(decided, timeout=STORY_TIMEOUT_SECONDS, what=f"{name} to be bound or refused")
        job = await request_pod(cluster, name)
        result[story].whole_node_job_bound = bool(job and job["spec"].get("nodeName"))
    return GpuStory(gpu_nodes=GPU_STORY_NODES, gpus_requested=gpus, packed=result["gpu-pack"],
                    spread=result["gpu-spread"])


async def request_pod(cluster: Cluster, name: str, namespace: str = GPU_NAMESPACE) -> Json | None:
    listed = await cluster.raw_list("list_namespaced_pod", namespace, field_selector=f"metadata.name={name}")
    return listed[0] if listed else None


# --- 4. pools --------------------------------------------------------------------------------------------------


async def pool_story(cluster: Cluster, progress: Callable[[str], None], *, pods: int) -> PoolStory:
    progress(f"pools: {pods} pods of tenant namespace {TENANT_NAMESPACE} labelled hoss.io/pool={TENANT_POOL}")
    manifests = [pod_manifest(f"tenant-{i:03d}", requests={"cpu": "250m", "memory": "256Mi"},
                              scheduler_name=SCHEDULER_NAME,
                              labels={"hoss.io/pool": TENANT_POOL, "app": "hoss-demo-tenant"})
                 for i in range(pods)]
    await cluster.create_pods(manifests, namespace=TENANT_NAMESPACE)
    await _wait_bound(cluster, TENANT_NAMESPACE, "app=hoss-demo-tenant", pods, what="the tenant's pods to be bound")
    pool_nodes = {n["metadata"]["name"]
                  for n in await cluster.raw_list("list_node", label_selector=f"hoss.io/pool={TENANT_POOL}")}
    bound = _bound(await _list(cluster, TENANT_NAMESPACE, "app=hoss-demo-tenant"))
    inside = sum(1 for p in bound if p["spec"]["nodeName"] in pool_nodes)
    return PoolStory(pool=TENANT_POOL, pool_nodes=len(pool_nodes), pods=pods, in_pool=inside,
                     elsewhere=len(bound) - inside)


# --- 5. a foreign scheduler ------------------------------------------------------------------------------------


def _denied_message(events: Sequence[Json]) -> str:
    """A denied binding as kube-scheduler reported it; one for want of room first (the race's usual loser)."""
    denied = [str(e.get("message") or "") for e in events
              if e.get("reason") == "FailedScheduling" and "hoss:" in str(e.get("message") or "")]
    return next((m for m in denied if "has no room" in m), denied[0] if denied else "")


async def race_story(cluster: Cluster, redis: Redis, progress: Callable[[str], None]) -> RaceStory:
    capacity = RACE_NODES * RACE_NODE_CPU
    per_scheduler = capacity
    progress(f"foreign scheduler: {per_scheduler} pods for kube-scheduler and {per_scheduler} for hoss, one core "
             f"each, on {RACE_NODES} nodes with {capacity} cores in all")
    _, _, denials_before = await _cluster_counters(redis)
    pods: list[Json] = []
    for i in range(per_scheduler):  # interleaved, so both schedulers start at once
        pods.append(story_pod(f"kube-{i:03d}", "race", requests={"cpu": "1", "memory": "1Gi"},
                              scheduler_name="default-scheduler", labels={"demo.hoss.io/by": "kube-scheduler"}))
        pods.append(story_pod(f"hoss-{i:03d}", "race", requests={"cpu": "1", "memory": "1Gi"},
                              labels={"demo.hoss.io/by": "hoss"}))
    await cluster.create_pods(pods, namespace=RACE_NAMESPACE)

    async def full() -> tuple[bool, str]:
        bound = len(_bound(await _list(cluster, RACE_NAMESPACE)))
        return bound >= capacity, f"{bound}/{capacity} cores taken"

    try:
        await wait_until(full, timeout=STORY_TIMEOUT_SECONDS, what="the race nodes to fill")
    except WaitTimeout as error:
        progress(f"foreign scheduler: {error}")
    listed = await _list(cluster, RACE_NAMESPACE)
    by = Counter(p["metadata"]["labels"]["demo.hoss.io/by"] for p in _bound(listed))
    nodes = await cluster.raw_list("list_node", label_selector=f"{STORY_KEY}=race")
    _, _, denials_after = await _cluster_counters(redis)
    events = await cluster.raw_list("list_namespaced_event", RACE_NAMESPACE)
    return RaceStory(
        nodes=RACE_NODES, cpu_capacity=capacity, hoss_pods=per_scheduler, kube_pods=per_scheduler,
        hoss_bound=by["hoss"], kube_bound=by["kube-scheduler"], denials=denials_after - denials_before,
        denial_message=_denied_message(events), oversold_nodes=len(oversold_nodes(nodes, listed)),
    )


# --- the demo --------------------------------------------------------------------------------------------------


async def run_demo(
    *, plane: LocalPlane, nodes: int, pods: int, workers: int, as_json: bool, progress: Callable[[str], None]
) -> int:
    plane.up(progress=progress)
    state = plane.state()
    names = {p.name for p in state.processes}
    if "hoss-dispatcher" not in names:
        progress("starting hoss-dispatcher")
        plane.start_dispatcher()
    for worker_id, policies in worker_layout(workers):
        if f"hoss-worker-{worker_id}" not in names:
            progress(f"starting hoss-worker {worker_id} (policies: {', '.join(policies)})")
            plane.start_worker(worker_id, policies=policies)
    state = plane.state()
    dispatcher = next(p for p in state.processes if p.name == "hoss-dispatcher")
    status_url = f"http://127.0.0.1:{dispatcher.port}/status"

    redis = Redis.from_url(state.redis_url, decode_responses=True)
    try:
        async with await Cluster.connect(plane.kubeconfig("admin")) as cluster:
            for namespace in NAMESPACES:
                await cluster.ensure_namespace(namespace)
                await cluster.delete_pods(namespace)
            old = [n["metadata"]["name"] for n in await cluster.raw_list("list_node")]
            await cluster.delete_nodes(n for n in old if n.startswith("demo-"))
            began = time.monotonic()
            progress(f"creating {nodes} fake nodes (CPU nodes in pool-a and {TENANT_POOL}, 8-GPU nodes in pool-gpu) "
                     f"and {GANG_NODES + 2 * GPU_STORY_NODES + RACE_NODES} more for the stories")
            node_names = await create_demo_nodes(cluster, nodes)
            story_nodes = await create_story_nodes(cluster)
            await cluster.wait_nodes_ready([*node_names, *(n for ns in story_nodes.values() for n in ns)],
                                           timeout=180)
            baseline, _, _ = await _cluster_counters(redis)

            mix = await mix_story(cluster, pods, as_json=as_json, progress=progress)
            per_worker, conflicts, _ = await _cluster_counters(redis)
            gangs = await gang_story(cluster, progress)
            gpu = await gpu_story(cluster, progress)
            pools = await pool_story(cluster, progress, pods=min(30, max(5, pods // 10)))
            race = await race_story(cluster, redis, progress)
            demo_seconds = time.monotonic() - began

            everything = await cluster.raw_list("list_pod_for_all_namespaces")
            oversold = oversold_nodes(await cluster.raw_list("list_node"), everything)
            _, _, denials = await _cluster_counters(redis)
    finally:
        await redis.aclose()
    report = DemoReport(
        pods_total=pods,
        pods_bound=mix.bound,
        pods_pending=pods - mix.bound,
        seconds=round(mix.seconds, 2),
        pods_per_second=round(mix.bound / mix.seconds, 1),
        ledger_conflicts=conflicts,
        webhook_denials=denials,
        oversold_nodes=len(oversold),
        per_worker={w: n - baseline.get(w, 0) for w, n in sorted(per_worker.items())},
        nodes=len(node_names),
        workers=workers,
        status_url=status_url,
        pending_reasons=mix.pending_reasons,
        dashboard_url=status_url.removesuffix("status"),
        gangs=gangs,
        gpu=gpu,
        pools=pools,
        race=race,
        demo_seconds=round(demo_seconds, 1),
    )
    if as_json:
        print(json.dumps(asdict(report)))
    else:
        print_report(report, plane)
    return 0 if report.oversold_nodes == 0 else 1


def story_lines(report: DemoReport) -> list[tuple[str, str]]:
    """One line per story with its figure."""
    lines = [("throughput", f"{report.pods_bound} of {report.pods_total} pods bound in {report.seconds} s "
                            f"({report.pods_per_second} pods/s, {report.workers} workers, {report.ledger_conflicts} "
                            f"ledger conflicts retried); {report.pods_pending} wait (more GPUs asked than exist)")]
    if (g := report.gangs) is not None:
        lines.append(("gangs", f"{g.first_gang} held with {g.held_with} of {g.first_min_available} members "
                               f"({g.held_reason}), then {g.first_bound_when_complete}/{g.first_min_available} "
                               f"bound together; {g.second_gang} bound {g.second_bound_while_blocked} of "
                               f"{g.second_members} while only {g.second_fit_alone} fit, then "
                               f"{g.second_bound_after_room}/{g.second_members} {g.seconds_to_start_after_room} s "
                               f"after {g.first_gang} left"))
    if (gpu := report.gpu) is not None:
        p, s = gpu.packed, gpu.spread
        lines.append(("GPU packing", f"{gpu.gpus_requested} GPUs on {gpu.gpu_nodes} 8-GPU nodes: gpu policy left "
                                     f"{p.fully_free_nodes} nodes whole and {p.stranded_gpus} GPUs stranded, "
                                     f"spreading left {s.fully_free_nodes} whole and {s.stranded_gpus} stranded; "
                                     f"then an 8-GPU job {'is bound' if p.whole_node_job_bound else 'WAITS'} "
                                     f"(gpu) and {'is bound' if s.whole_node_job_bound else 'waits'} (spreading)"))
    if (pool := report.pools) is not None:
        lines.append(("pools", f"{pool.in_pool}/{pool.pods} tenant pods on {pool.pool}'s {pool.pool_nodes} nodes, "
                               f"{pool.elsewhere} elsewhere (hoss pods only: other schedulers ignore pools)"))
    if (r := report.race) is not None:
        lines.append(("foreign scheduler", f"kube-scheduler and hoss raced {r.kube_pods}+{r.hoss_pods} pods for "
                                           f"{r.cpu_capacity} cores: kube-scheduler bound {r.kube_bound}, hoss "
                                           f"{r.hoss_bound}; {r.denials} conflicting bindings denied; "
                                           f"{r.oversold_nodes} oversold"))
    lines.append(("oversold nodes", f"{report.oversold_nodes} (every bound pod against its node's allocatable, "
                                    "from the apiserver)"))
    return lines


def print_report(report: DemoReport, plane: LocalPlane) -> None:
    print(f"\nhoss demo report ({report.demo_seconds} s from the first node to the last story)")
    for label, text in story_lines(report):
        print(f"  {label:<18} {text}")
        if label == "foreign scheduler" and report.race is not None and report.race.denial_message:
            print(f"  {'':<18} what kube-scheduler reports for a denied binding: {report.race.denial_message}")
    print("  pods per worker (throughput story)")
    for worker, count in report.per_worker.items():
        print(f"    {worker:<24} {count}")
    if report.pending_reasons:
        print("  why pods wait (kubectl describe pod shows the same)")
        for message, count in report.pending_reasons.items():
            print(f"    {count:>4} x {message}")
    print(f"\ndashboard: {report.dashboard_url}   status: {report.status_url}   (or: .venv/bin/hoss status)")
    print("The plane keeps running. To look around from this shell:")
    print(plane.exports())
    print(f"kubectl get pods -n {GANGS_NAMESPACE} -o wide            # the gangs")
    print(f"kubectl get events -n {GANGS_NAMESPACE}                  # GangIncomplete, then Scheduled")
    print(f"kubectl get pods -n {GPU_NAMESPACE} -o wide --sort-by=.spec.nodeName")
    print(f"kubectl get pods -n {TENANT_NAMESPACE} -o wide           # all on hoss.io/pool={TENANT_POOL} nodes")
    print(f"kubectl get events -n {RACE_NAMESPACE} --field-selector reason=FailedScheduling   # denied bindings")
    print(f"kubectl describe pod -n {DEMO_NAMESPACE} | grep -A3 PodScheduled")
    print("Tear it down with: make down   (or .venv/bin/hoss local down)")
