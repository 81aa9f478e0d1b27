"""`hoss why` on the real plane (through `python -m dev why`): a pending pod of each kind the demo makes -- too big
for any node, GPU pods while the GPU nodes are full, gang members waiting (a gang one member short, a gang that only
half fits), a pod confined to a full pool, an untolerated taint, a node selector no node matches -- is explained
with the message the worker (or the dispatcher) wrote on it and the figures per node; where room appears, the
worker then puts the pod where `hoss why` said it would; and `--what-if` on a manifest names the node the worker
then chooses for the pod created from it. The pods are made with the demo's own factories (dev/demo)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from dev.demo.stage import GPU, GPU_NODE, STORY_KEY, story_pod
from dev.demo.stories.gangs import GANG_NAME_LABEL, gang_member
from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import NODE_CAPACITY, hoss_why, scheduled_condition, wait_all_bound, why_json, workers
from tests.waiting import until

_stories = iter(range(1000))


@pytest.fixture(scope="module")
def default_worker(plane: LocalPlane, dispatcher: Process) -> Iterator[Process]:
    """One worker serving the default policy, for the tests that do not stop theirs."""
    process = plane.start_worker("why-default", policies=["default"])
    yield process
    plane.stop_process(process.name)


def verdicts_on(answer: Json, nodes: Sequence[str]) -> dict[str, Json]:
    """The answer's verdict of each of `nodes` (other nodes of the plane may be there too)."""
    return {v["node"]: v for v in answer["verdicts"] if v["node"] in nodes}


async def explained_as_hoss_said(plane: LocalPlane, cluster: Cluster, namespace: str, pod: str, *,
                                 reason: str = "Unschedulable") -> Json:
    """Wait until the pod carries PodScheduled=False with `reason`, then until `hoss why` gives the same message
    (the worker wrote it from the table it held then; `hoss why` reads the ledger now: they agree once both saw the
    same nodes). The last answer."""
    async def told() -> tuple[bool, str]:
        got = await scheduled_condition(cluster, namespace, pod)
        return got[0] == reason, f"condition {got}"

    await until(told, timeout=90, what=f"{namespace}/{pod} to be {reason}")
    answer: Json = {}

    async def agrees() -> tuple[bool, str]:
        nonlocal answer
        _reason, message = await scheduled_condition(cluster, namespace, pod)
        answer = await why_json(plane, f"{namespace}/{pod}")
        return answer["message"] == message, f"hoss said {message!r}, hoss why says {answer['message']!r}"

    await until(agrees, timeout=60, what=f"hoss why to explain {namespace}/{pod} as hoss did")
    assert answer["condition"]["reason"] == reason
    return answer


@asynccontextmanager
async def story_nodes(cluster: Cluster, count: int, *, capacity: Mapping[str, str] = NODE_CAPACITY,
                      story: str | None = None, labels: Mapping[str, str] | None = None,
                      tainted: bool = True) -> AsyncIterator[tuple[str, list[str]]]:
    """`count` nodes of a story of their own, as the demo makes them (dev/demo/stage.py: labelled and tainted with
    the story's name), for the length of the block: the story's name and the nodes."""
    name = story or f"why-{next(_stories)}"
    taints = [{"key": STORY_KEY, "value": name, "effect": "NoSchedule"}] if tainted else []
    names = await cluster.create_nodes(count, prefix=name, capacity=capacity,
                                       labels={STORY_KEY: name, **(labels or {})}, taints=taints)
    try:
        await cluster.wait_nodes_ready(names)
        yield name, names
    finally:
        await cluster.delete_nodes(names)


def on_node(pod: Json, node: str) -> Json:
    """The pod to be created bound to `node` (filling room; the resolver judges such a create like a binding)."""
    pod["spec"]["nodeName"] = node
    return pod


async def create_bound(cluster: Cluster, namespace: str, pods: Sequence[Json]) -> None:
    """Create pods bound to their nodes one by one: the resolver lets one user's creates that the sync has not yet
    seen bound hold at most one node's room, and says to retry (429) beyond that."""
    for pod in pods:
        async def created(pod: Json = pod) -> tuple[bool, str]:
            try:
                await cluster.create_pods([pod], namespace=namespace)
            except ApiException as error:
                if error.status != 429:
                    raise
                return False, str(error.body)
            return True, ""

        await until(created, timeout=60, what=f"{pod['metadata']['name']} to be created on its node")


@pytest.mark.usefixtures("default_worker")
async def test_a_pod_too_big_for_any_node_is_explained_by_its_resources(plane: LocalPlane, cluster: Cluster,
                                                                        namespace: str) -> None:
    async with story_nodes(cluster, 2) as (story, nodes):
        pod = story_pod("huge", story, requests={"cpu": "100", "memory": "1Gi"})
        await cluster.create_pods([pod], namespace=namespace)
        answer = await explained_as_hoss_said(plane, cluster, namespace, "huge")
        assert answer["summary"].startswith("fits no node now: 0/")
        for verdict in verdicts_on(answer, nodes).values():
            assert (verdict["filter"], verdict["reasons"]) == ("NodeResourcesFit", ["Insufficient cpu"])
            assert verdict["figures"]["cpu"] == {"asked": 100_000, "free": 8000, "allocatable": 8000}
        [resources] = [c for c in answer["classes"] if set(c["nodes"]) == set(nodes)]
        assert resources["group"] == "cpu: asked 100, allocatable 8"
        table = await hoss_why(plane, f"{namespace}/huge")
        assert "NodeResourcesFit  Insufficient cpu" in table
        assert "cpu: asked 100, free 8 of 8" in table


async def test_gpu_pods_wait_while_gpu_nodes_are_full_and_go_where_hoss_why_says_when_room_appears(
        plane: LocalPlane, cluster: Cluster, namespace: str, dispatcher: Process) -> None:
    def gpu_pod(name: str, story: str, gpus: int) -> Json:
        # The demo's GPU pod (dev/demo/stage.py demo_pods): 4 cpu, 16Gi, N GPUs, under binpack.
        return story_pod(name, story, requests={"cpu": "4", "memory": "16Gi", GPU: str(gpus)}, policy="binpack")

    async with story_nodes(cluster, 2, capacity=GPU_NODE) as (story, (first, second)), \
            workers(plane, [("why-gpu-a", ["binpack"])]) as [worker]:
        await create_bound(cluster, namespace, [
            on_node(gpu_pod("a-4", story, 4), first), on_node(gpu_pod("b-4", story, 4), first),
            on_node(gpu_pod("c-4", story, 4), second), on_node(gpu_pod("d-2", story, 2), second),
            on_node(gpu_pod("e-2", story, 2), second),
        ])
        await cluster.create_pods([gpu_pod("wants-2", story, 2)], namespace=namespace)
        answer = await explained_as_hoss_said(plane, cluster, namespace, "wants-2")
        on_gpus = verdicts_on(answer, [first, second])
        assert {v["filter"] for v in on_gpus.values()} == {"NodeResourcesFit"}
        assert {node: v["figures"][GPU] for node, v in on_gpus.items()} == {
            first: {"asked": 2, "free": 0, "allocatable": 8}, second: {"asked": 2, "free": 0, "allocatable": 8}}

        # Room appears on both nodes while no worker serves binpack: 4 GPUs on the first, 2 on the second.
        plane.stop_process(worker.name)
        for gone in ("a-4", "e-2"):
            await cluster.call(cluster.core.delete_namespaced_pod, gone, namespace, grace_period_seconds=0)

        async def predicted() -> tuple[bool, str]:
            now = await why_json(plane, f"{namespace}/wants-2")
            return now["feasible"] == 2, f"{now['summary']}"

        await until(predicted, timeout=60, what="hoss why to see the room freed on both GPU nodes")
        answer = await why_json(plane, f"{namespace}/wants-2")
        # binpack: the second node, full after it, beats the first, half empty after it.
        assert [c["node"] for c in answer["candidates"]] == [second, first]
        assert answer["chosen"] == second
        async with workers(plane, [("why-gpu-b", ["binpack"])]):
            [bound] = [p for p in await wait_all_bound(cluster, namespace, 4) if p["metadata"]["name"] == "wants-2"]
        assert bound["spec"]["nodeName"] == answer["chosen"]


@pytest.mark.usefixtures("default_worker")
async def test_gang_members_waiting_are_explained_by_their_gang(plane: LocalPlane, cluster: Cluster,
                                                                namespace: str) -> None:
    # The demo's gang story: each node has room for exactly one member (8 cpu; members request 8).
    async with story_nodes(cluster, 2, story="gangs") as (_story, nodes):
        await cluster.create_pods([gang_member("short", i, 3) for i in range(2)], namespace=namespace)
        short = await explained_as_hoss_said(plane, cluster, namespace, "short-0", reason="GangIncomplete")
        assert short["summary"] == f"gang {namespace}/short: 2 of 3 required members are pending; none is " \
            "scheduled until min-available are there"
        assert short["gang"] == {"name": f"{namespace}/short", "minAvailable": 3, "pending": 2, "bound": 0}
        assert {v["fits"] for v in verdicts_on(short, nodes).values()} == {True}  # the member alone would fit

        await cluster.create_pods([gang_member("wide", i, 3) for i in range(3)], namespace=namespace)
        wide = await explained_as_hoss_said(plane, cluster, namespace, "wide-1")
        assert wide["summary"].startswith(f"its gang does not fit: gang {namespace}/wide: only 2 of 3 members fit "
                                          "(min-available 3)")
        assert wide["chosen"] is None
        bound = [p for p in await cluster.raw_list("list_namespaced_pod", namespace,
                                                   label_selector=f"{GANG_NAME_LABEL}=wide")
                 if p["spec"].get("nodeName")]
        assert bound == []


@pytest.mark.usefixtures("default_worker")
async def test_a_pod_confined_to_a_full_pool_is_explained_by_the_pool_and_its_room(plane: LocalPlane,
                                                                                   cluster: Cluster,
                                                                                   namespace: str) -> None:
    async with story_nodes(cluster, 1, labels={"hoss.io/pool": f"pool-{namespace}"}, tainted=False) as (_s, [full]), \
            story_nodes(cluster, 1, labels={"hoss.io/pool": f"other-{namespace}"}, tainted=False) as (_o, [other]):
        await create_bound(cluster, namespace, [on_node(pod_manifest(
            "filler", requests={"cpu": "8", "memory": "1Gi"}, scheduler_name="hoss"), full)])
        # The demo's tenant pod (dev/demo/stories/pools.py), in a pool whose nodes are full.
        tenant = pod_manifest("tenant", requests={"cpu": "250m", "memory": "256Mi"}, scheduler_name="hoss",
                              labels={"hoss.io/pool": f"pool-{namespace}", "app": "hoss-demo-tenant"})
        await cluster.create_pods([tenant], namespace=namespace)
        answer = await explained_as_hoss_said(plane, cluster, namespace, "tenant")
        verdicts = verdicts_on(answer, [full, other])
        assert verdicts[other]["filter"] == "NodePool"
        assert verdicts[other]["text"] == (f"pod's pool pool-{namespace} (pod label hoss.io/pool); node in pool "
                                           f"other-{namespace}")
        assert verdicts[full]["filter"] == "NodeResourcesFit"
        assert verdicts[full]["text"] == "cpu: asked 250m, free 0 of 8"


@pytest.mark.usefixtures("default_worker")
async def test_an_untolerated_taint_and_an_unmatched_node_selector_are_named_with_the_nodes_values(
        plane: LocalPlane, cluster: Cluster, namespace: str) -> None:
    async with story_nodes(cluster, 1) as (story, [tainted]), \
            story_nodes(cluster, 1, labels={"zone": "why-a"}, tainted=False) as (_plain, [plain]):
        intolerant = story_pod("intolerant", story, requests={"cpu": "1", "memory": "1Gi"})
        del intolerant["spec"]["tolerations"]
        elsewhere = story_pod("elsewhere", story, requests={"cpu": "1", "memory": "1Gi"})
        elsewhere["spec"]["nodeSelector"] = {"zone": "why-b"}
        await cluster.create_pods([intolerant, elsewhere], namespace=namespace)

        taint = await explained_as_hoss_said(plane, cluster, namespace, "intolerant")
        verdicts = verdicts_on(taint, [tainted, plain])
        assert verdicts[tainted]["filter"] == "TaintToleration"
        assert verdicts[tainted]["text"] == f"taint {STORY_KEY}={story}:NoSchedule not tolerated"
        assert verdicts[plain]["text"] == f"nodeSelector {STORY_KEY}={story}: node has {STORY_KEY}={_plain}"

        affinity = await explained_as_hoss_said(plane, cluster, namespace, "elsewhere")
        verdicts = verdicts_on(affinity, [tainted, plain])
        assert verdicts[plain]["filter"] == "NodeAffinity"
        assert verdicts[plain]["reasons"] == ["node(s) didn't match Pod's node affinity/selector"]
        assert verdicts[plain]["text"] == "nodeSelector zone=why-b: node has zone=why-a"
        assert verdicts[tainted]["filter"] == "NodeAffinity"  # the taint is tolerated: the label is missing
        assert verdicts[tainted]["text"] == "nodeSelector zone=why-b: node has no label zone"


@pytest.mark.usefixtures("default_worker")
async def test_what_if_names_the_node_the_worker_then_chooses(plane: LocalPlane, cluster: Cluster,
                                                              namespace: str, tmp_path: Path) -> None:
    async with story_nodes(cluster, 3) as (story, nodes):
        fill = {nodes[0]: "5", nodes[1]: "1", nodes[2]: "7"}
        await create_bound(cluster, namespace, [
            on_node(story_pod(f"fill-{i}", story, requests={"cpu": cpu, "memory": "1Gi"}), node)
            for i, (node, cpu) in enumerate(fill.items())])
        manifest = story_pod("next", story, requests={"cpu": "2", "memory": "1Gi"})
        manifest["metadata"]["namespace"] = namespace
        path = tmp_path / "next.yaml"
        path.write_text(json.dumps(manifest))

        async def sees_the_fill() -> tuple[bool, str]:
            answer = await why_json(plane, "--what-if", str(path))
            return answer["feasible"] == 2, answer["summary"]

        await until(sees_the_fill, timeout=60, what="the ledger to count the filling pods")
        answer = await why_json(plane, "--what-if", str(path))
        assert answer["whatIf"] is True
        # default (spreading): the emptiest node that fits; the third has 1 cpu free.
        assert answer["chosen"] == nodes[1]
        assert verdicts_on(answer, nodes)[nodes[2]]["text"] == "cpu: asked 2, free 1 of 8"
        table = await hoss_why(plane, "--what-if", str(path))
        assert f"the worker would choose {nodes[1]}" in table and "best nodes" in table
        await cluster.create_pods([manifest], namespace=namespace)
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in await wait_all_bound(cluster, namespace, 4)}
        assert placed["next"] == answer["chosen"]


@pytest.mark.usefixtures("default_worker")
async def test_a_pod_whose_claim_is_missing_is_explained_by_the_claim_as_hoss_said(plane: LocalPlane,
                                                                                    cluster: Cluster,
                                                                                    namespace: str) -> None:
    async with story_nodes(cluster, 2) as (story, _nodes):
        pod = story_pod("claimed", story, requests={"cpu": "100m", "memory": "64Mi"})
        pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "absent"}}]
        await cluster.create_pods([pod], namespace=namespace)
        answer = await explained_as_hoss_said(plane, cluster, namespace, "claimed")
        assert answer["message"].endswith('nodes are available: persistentvolumeclaim "absent" not found.')
