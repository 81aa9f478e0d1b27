"""Pods with ResourceClaims (Dynamic Resource Allocation, resource.k8s.io/v1) on the real plane: each scenario runs
under kube-scheduler and under hoss, on nodes of their own with the same devices, and both must agree -- the node
chosen (by its place in the set), the devices' properties in the claim's allocation, the reason of a pod that
waits. The devices are published as a DRA driver would, in ResourceSlices the test writes for its kwok nodes; the
plane's kube-controller-manager runs the resourceclaim controller (the claims of ResourceClaimTemplates). The race
of two workers for the last devices is hoss's alone. Each test ends with the oversell check (no device allocated
to two claims among them) and checks which pods are left Pending."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.ledger.client import Ledger
from hoss.model.devices.counters import CounterDraw
from hoss.model.objects import Json
from tests.e2e.devices import DRIVER, Devices, allocated, device_objects, gpu, request, with_claim
from tests.e2e.hoss import (
    NODE_CAPACITY,
    hoss_pods,
    node_set,
    pending,
    pinned,
    wait_bound,
    wait_reason,
    why_json,
    workers,
)
from tests.waiting import until

SCHEDULERS = (("default-scheduler", "k"), ("hoss", "h"))
TWO = [("dra-0", ["default"]), ("dra-1", ["binpack"])]
"""Two workers, each serving one policy: pods of both policies make them race for the same devices."""
_tags = itertools.count()


@asynccontextmanager
async def two_sets(cluster: Cluster, count: int) -> AsyncIterator[dict[str, tuple[str, list[str]]]]:
    """`count` nodes for kube-scheduler and `count` for hoss: scheduler -> (the set's label value, its nodes)."""
    tag = f"dra{next(_tags)}"
    sets: dict[str, tuple[str, list[str]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for scheduler, prefix in SCHEDULERS:
            names = await stack.enter_async_context(node_set(cluster, count, labels={"dra-set": f"{tag}{prefix}"}))
            sets[scheduler] = (f"{tag}{prefix}", list(names))
        yield sets


def for_scheduler(pods: list[Json], scheduler: str, set_label: str) -> list[Json]:
    for pod in pinned(pods, "dra-set", set_label):
        pod["spec"]["schedulerName"] = scheduler
    return pods


def claim_of(claims: Sequence[Json], pod: str) -> Json:
    """The claim reserved for `pod`."""
    [found] = [claim for claim in claims
               if any(ref.get("name") == pod for ref in (claim.get("status") or {}).get("reservedFor") or [])]
    return found


async def test_claims_and_templates_get_the_devices_kube_scheduler_gives_them_or_wait_with_its_reason(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Node 0 has one a100, node 1 two h100 (NVLink domain 1), node 2 four h100 (domain 2). A ResourceClaim for one
    a100 (a CEL selector on the model) takes node 0; a pod's template asking three GPUs of 80Gi or more takes node
    2, the only one with three; a template asking eight waits with kube-scheduler's reason; a claim that does not
    exist waits with kube-scheduler's reason until it is made."""
    async with two_sets(cluster, 3) as sets, device_objects(cluster) as devices, workers(plane, TWO):
        gpus = await devices.device_class(f"{namespace}-gpu")
        outcomes: dict[str, Any] = {}
        reasons: dict[str, list[str]] = {}
        for scheduler, prefix in SCHEDULERS:
            tag, nodes = sets[scheduler]
            await devices.publish(nodes[0], [gpu("gpu-0")])
            await devices.publish(nodes[1], [gpu(f"gpu-{i}", model="h100", memory="80Gi", nvlink=1) for i in range(2)])
            await devices.publish(nodes[2], [gpu(f"gpu-{i}", model="h100", memory="80Gi", nvlink=2) for i in range(4)])
            await devices.claim(namespace, f"{prefix}-a100", [request(
                "gpu", gpus, expression=f'device.attributes["{DRIVER}"].model == "a100"')])
            await devices.template(namespace, f"{prefix}-three", [request(
                "gpu", gpus, count=3,
                expression=f'device.capacity["{DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0')])
            await devices.template(namespace, f"{prefix}-eight", [request("gpu", gpus, count=8)])
            one, three, eight, later = hoss_pods(f"{prefix}dra", 4)
            with_claim(one, claim=f"{prefix}-a100")
            with_claim(three, template=f"{prefix}-three")
            with_claim(eight, template=f"{prefix}-eight")
            with_claim(later, claim=f"{prefix}-later")
            names = await cluster.create_pods(for_scheduler([one, three, eight, later], scheduler, tag),
                                              namespace=namespace)
            where = await wait_bound(cluster, namespace, names[:2])
            claims = await devices.claims(namespace)
            placed = []
            for name in names[:2]:
                claim = claim_of(claims, name)
                results = claim["status"]["allocation"]["devices"]["results"]
                placed.append((nodes.index(where[name]), sorted(r["device"] for r in results),
                               {r["pool"] for r in results} == {where[name]}))
            outcomes[scheduler] = placed
            reasons[scheduler] = [
                (await wait_reason(cluster, namespace, names[2], "cannot allocate all claims"))
                .split(" preemption:")[0].replace(f"{prefix}-", "X-")]
            if scheduler == "hoss":
                # `hoss why` explains it from the workers' own filters, what its claims need read as the
                # dispatcher reads it
                answer = await why_json(plane, f"{namespace}/{names[2]}")
                rejected = {v["node"]: v for v in answer["verdicts"] if v["node"] in nodes}
                assert all("cannot allocate all claims" in json.dumps(v) for v in rejected.values()), rejected
            if scheduler == "hoss":
                # kube-scheduler holds a pod whose claim does not exist back before any attempt (PreEnqueue), with
                # no condition; so does hoss's dispatcher, which says kube-scheduler's words in PodScheduled=False,
                # so describe tells why it waits
                reasons[scheduler].append(await wait_reason(
                    cluster, namespace, names[3], f'resourceclaim.resource.k8s.io "{prefix}-later" not found'))
        assert outcomes["hoss"] == outcomes["default-scheduler"], outcomes
        assert outcomes["hoss"][0] == (0, ["gpu-0"], True) and outcomes["hoss"][1][0] == 2, outcomes
        assert reasons["default-scheduler"][0].startswith(reasons["hoss"][0]), reasons
        assert reasons["hoss"][0].startswith("0/"), reasons
        assert reasons["hoss"][1] == 'resourceclaim.resource.k8s.io "h-later" not found', reasons
        assert await pending(cluster, namespace) == ["hdra-0002", "hdra-0003", "kdra-0002", "kdra-0003"]

        for _scheduler, prefix in SCHEDULERS:
            await devices.claim(namespace, f"{prefix}-later", [request("gpu", gpus)])
            await wait_bound(cluster, namespace, [f"{prefix}dra-0003"])
        assert await pending(cluster, namespace) == ["hdra-0002", "kdra-0002"]
        held = allocated(await devices.claims(namespace))
        assert len(held) == len(set(held)) == 2 * (1 + 3 + 1), held


async def test_match_attribute_keeps_two_requests_on_one_nvlink_domain(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Node 0 has two GPUs in two NVLink domains, node 1 two in one domain: a claim with two requests constrained
    to match the nvlink attribute can only be allocated on node 1; without the constraint, on either."""
    async with two_sets(cluster, 2) as sets, device_objects(cluster) as devices, workers(plane, TWO):
        gpus = await devices.device_class(f"{namespace}-gpu")
        outcomes = {}
        for scheduler, prefix in SCHEDULERS:
            tag, nodes = sets[scheduler]
            await devices.publish(nodes[0], [gpu("gpu-0", nvlink=0), gpu("gpu-1", nvlink=1)])
            await devices.publish(nodes[1], [gpu("gpu-0", nvlink=7), gpu("gpu-1", nvlink=7)])
            await devices.claim(namespace, f"{prefix}-pair", [request("a", gpus), request("b", gpus)],
                                constraints=[{"requests": ["a", "b"], "matchAttribute": f"{DRIVER}/nvlink"}])
            [pod] = hoss_pods(f"{prefix}pair", 1)
            with_claim(pod, claim=f"{prefix}-pair")
            names = await cluster.create_pods(for_scheduler([pod], scheduler, tag), namespace=namespace)
            where = await wait_bound(cluster, namespace, names)
            claim = claim_of(await devices.claims(namespace), names[0])
            results = claim["status"]["allocation"]["devices"]["results"]
            outcomes[scheduler] = (nodes.index(where[names[0]]), sorted((r["request"], r["device"]) for r in results))
        assert outcomes["hoss"] == outcomes["default-scheduler"] == (1, [("a", "gpu-0"), ("b", "gpu-1")]), outcomes
        assert await pending(cluster, namespace) == []


async def test_two_workers_racing_for_the_last_devices_never_allocate_one_twice(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Three GPUs on three nodes and eight pods of two policies, served by two workers, each with a template for
    one GPU: three pods are bound, each device is in one claim's allocation, the other five wait with
    kube-scheduler's reason."""
    async with node_set(cluster, 3, labels={"dra-set": f"race{next(_tags)}"}) as nodes, \
            device_objects(cluster) as devices, workers(plane, TWO):
        gpus = await devices.device_class(f"{namespace}-gpu")
        for node in nodes:
            await devices.publish(node, [gpu("gpu-0")])
        await devices.template(namespace, "one", [request("gpu", gpus)])
        pods = hoss_pods("race-a", 4, policy="default") + hoss_pods("race-b", 4, policy="binpack")
        for pod in pods:
            with_claim(pod, template="one")
        names = await cluster.create_pods(pods, namespace=namespace)

        async def three_bound() -> tuple[bool, str]:
            raw = await cluster.raw_list("list_namespaced_pod", namespace)
            bound = [p["metadata"]["name"] for p in raw if p["spec"].get("nodeName")]
            return len(bound) >= 3, str(bound)

        await until(three_bound, timeout=120, what="three pods to be bound")
        waiting = await pending(cluster, namespace)
        for name in waiting[:2]:
            # a pod that lost the device in PreBind says so, and backs off (up to a minute) before its next attempt
            # says kube-scheduler's reason
            await wait_reason(cluster, namespace, name, "cannot allocate all claims", timeout=300)
        claims = await devices.claims(namespace)
        held = allocated(claims)
        assert len(held) == len(set(held)) == 3, held
        bound = sorted(set(names) - set(await pending(cluster, namespace)))
        assert len(bound) == 3, bound
        assert Counter(pool for _driver, pool, _device in held) == Counter(nodes), held


async def refused_to_kube_scheduler(cluster: Cluster, namespace: str, node: str, text: str) -> str:
    """A kube-scheduler pod on `node` using the claim "theirs", once an event on it says the resolver refused its
    allocation with `text`; its name."""
    [pod] = hoss_pods("foreign", 1)
    pod["spec"]["schedulerName"] = "default-scheduler"
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    with_claim(pod, claim="theirs")
    [name] = await cluster.create_pods([pod], namespace=namespace)

    async def refused() -> tuple[bool, str]:
        events = await cluster.raw_list("list_namespaced_event", namespace,
                                        field_selector=f"involvedObject.name={name}")
        messages = [event.get("message") or "" for event in events]
        return any(text in message for message in messages), str(messages)

    await until(refused, timeout=60, what="kube-scheduler's allocation to be refused by the resolver")
    return name


async def test_the_resolver_refuses_another_scheduler_a_device_a_hoss_pod_is_being_given(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    """A device promised in the ledger to a hoss pod whose claims are being written (as a worker promises it before
    writing) is refused to kube-scheduler: its allocation of that device is denied by the resolver, its pod waits
    and is tried again, and once the promise is gone it gets the device."""
    async with node_set(cluster, 1, labels={"dra-set": f"foreign{next(_tags)}"}) as [node], \
            device_objects(cluster) as devices:
        gpus = await devices.device_class(f"{namespace}-gpu")
        await devices.publish(node, [gpu("gpu-0")])
        device = f"{DRIVER}/{node}/gpu-0"
        assert await ledger.promise_devices(uid="a-hoss-pod", devices=[device], ttl_seconds=600) is None
        await devices.claim(namespace, "theirs", [request("gpu", gpus)])
        name = await refused_to_kube_scheduler(cluster, namespace, node, f"device {device} is being allocated for pod "
                                               "a-hoss-pod")
        raw = await cluster.core.read_namespaced_pod(name, namespace)
        assert not raw.spec.node_name
        assert allocated(await devices.claims(namespace)) == []
        assert await ledger.unpromise_devices(uid="a-hoss-pod", devices=[device]) == 1
        await wait_bound(cluster, namespace, [name], timeout=90)
        assert allocated(await devices.claims(namespace)) == [(DRIVER, node, "gpu-0")]


async def test_hoss_and_kube_scheduler_racing_for_the_same_devices_never_allocate_one_twice(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Four GPUs on two nodes, and eight pods -- four for kube-scheduler, four for hoss (two workers), created
    together -- each with a template for one GPU: four are bound, each device is in one allocation, and the other
    four wait."""
    async with node_set(cluster, 2, labels={"dra-set": f"mixed{next(_tags)}"}) as nodes, \
            device_objects(cluster) as devices, workers(plane, TWO):
        gpus = await devices.device_class(f"{namespace}-gpu")
        for node in nodes:
            await devices.publish(node, [gpu("gpu-0"), gpu("gpu-1")])
        await devices.template(namespace, "one", [request("gpu", gpus)])
        theirs = hoss_pods("mixed-k", 4)
        for pod in theirs:
            pod["spec"]["schedulerName"] = "default-scheduler"
        ours = hoss_pods("mixed-a", 2, policy="default") + hoss_pods("mixed-b", 2, policy="binpack")
        pods = [pod for pair in zip(theirs, ours, strict=True) for pod in pair]
        for pod in pods:
            with_claim(pod, template="one")
        await cluster.create_pods(pods, namespace=namespace)

        async def four_bound() -> tuple[bool, str]:
            raw = await cluster.raw_list("list_namespaced_pod", namespace)
            bound = [p["metadata"]["name"] for p in raw if p["spec"].get("nodeName")]
            return len(bound) >= 4, str(bound)

        await until(four_bound, timeout=120, what="four pods to be bound")
        held = allocated(await devices.claims(namespace))
        assert len(held) == len(set(held)) == 4, held
        assert len(await pending(cluster, namespace)) == 4


async def test_partitions_sharing_a_gpu_s_counters_are_never_overdrawn(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """One GPU of 80Gi published as three partitions drawing on its memory counter (the whole GPU, and two halves):
    a claim for a half takes one, a claim for the whole GPU then waits with kube-scheduler's reason (40Gi are left),
    and a second half still fits."""
    async with two_sets(cluster, 1) as sets, device_objects(cluster) as devices, workers(plane, TWO):
        gpus = await devices.device_class(f"{namespace}-gpu")
        outcomes = {}
        for scheduler, prefix in SCHEDULERS:
            tag, [node] = sets[scheduler]
            await devices.publish_partitioned(node, memory="80Gi", parts={"whole": "80Gi", "half-a": "40Gi",
                                                                          "half-b": "40Gi"})
            half = f'device.attributes["{DRIVER}"].profile == "half"'
            await devices.claim(namespace, f"{prefix}-half-1", [request("gpu", gpus, expression=half)])
            await devices.claim(namespace, f"{prefix}-whole", [request(
                "gpu", gpus, expression=f'device.attributes["{DRIVER}"].profile == "whole"')])
            await devices.claim(namespace, f"{prefix}-half-2", [request("gpu", gpus, expression=half)])
            first, whole, second = hoss_pods(f"{prefix}part", 3)
            with_claim(first, claim=f"{prefix}-half-1")
            with_claim(whole, claim=f"{prefix}-whole")
            with_claim(second, claim=f"{prefix}-half-2")
            [first_name] = await cluster.create_pods(for_scheduler([first], scheduler, tag), namespace=namespace)
            await wait_bound(cluster, namespace, [first_name])
            names = await cluster.create_pods(for_scheduler([whole, second], scheduler, tag), namespace=namespace)
            await wait_bound(cluster, namespace, names[1:])
            reason = await wait_reason(cluster, namespace, names[0], "cannot allocate all claims")
            claims = await devices.claims(namespace)
            outcomes[scheduler] = (sorted(claim_of(claims, name)["status"]["allocation"]["devices"]["results"][0]
                                          ["device"] for name in (first_name, names[1])),
                                   reason.split(" preemption:")[0].split(": ", 1)[1])
        assert outcomes["hoss"][0] == outcomes["default-scheduler"][0] == ["half-a", "half-b"], outcomes
        assert outcomes["default-scheduler"][1].startswith(outcomes["hoss"][1]), outcomes
        assert await pending(cluster, namespace) == ["hpart-0001", "kpart-0001"]


async def test_a_gang_whose_members_each_want_a_device_of_one_node_binds_whole_with_different_devices(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A node with two GPUs and a gang of two (min-available 2), each member with a template for one GPU: both
    members land there, all or nothing, each allocated a device of its own."""
    async with node_set(cluster, 1, labels={"dra-set": f"gang{next(_tags)}"}) as [node], \
            device_objects(cluster) as devices, workers(plane, TWO):
        gpus = await devices.device_class(f"{namespace}-gpu")
        await devices.publish(node, [gpu("gpu-0"), gpu("gpu-1")])
        await devices.template(namespace, "one", [request("gpu", gpus)])
        members = hoss_pods("train", 2, labels={"pod-group.scheduling.sigs.k8s.io/name": "train",
                                                "pod-group.scheduling.sigs.k8s.io/min-available": "2"})
        for member in members:
            with_claim(member, template="one")
            member["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        names = await cluster.create_pods(members, namespace=namespace)
        where = await wait_bound(cluster, namespace, names)
        assert set(where.values()) == {node}
        held = allocated(await devices.claims(namespace))
        assert sorted(held) == [(DRIVER, node, "gpu-0"), (DRIVER, node, "gpu-1")], held

        # a gang whose one member's claim is not there yet is held back whole, and goes once the claim is made
        for name in names:
            await cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        await until(lambda: _claims_released(devices, namespace), timeout=60, what="the first gang's devices freed")
        await devices.claim(namespace, "ready", [request("gpu", gpus)])
        pair = hoss_pods("pair", 2, labels={"pod-group.scheduling.sigs.k8s.io/name": "pair",
                                            "pod-group.scheduling.sigs.k8s.io/min-available": "2"})
        for member, claim in zip(pair, ("ready", "later"), strict=True):
            with_claim(member, claim=claim)
            member["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        names = await cluster.create_pods(pair, namespace=namespace)
        await wait_reason(cluster, namespace, names[0],
                          f"waits for the ResourceClaims of member {namespace}/{names[1]}")
        await wait_reason(cluster, namespace, names[1], 'resourceclaim.resource.k8s.io "later" not found')
        await devices.claim(namespace, "later", [request("gpu", gpus)])
        where = await wait_bound(cluster, namespace, names)
        assert set(where.values()) == {node}
        held = allocated(await devices.claims(namespace))
        assert len(held) == len(set(held)) == 2, held


async def _claims_released(devices: Devices, namespace: str) -> tuple[bool, str]:
    held = allocated(await devices.claims(namespace))
    return not held, str(held)


def extended_pod(pod: Json, resource: str, count: int) -> Json:
    """`pod` asking `count` of the extended resource `resource` (limits equal to requests, as extended resources
    need)."""
    resources = pod["spec"]["containers"][0]["resources"]
    resources["requests"][resource] = str(count)
    resources.setdefault("limits", {})[resource] = str(count)
    return pod


async def raw_pod(cluster: Cluster, namespace: str, name: str) -> Json:
    """The pod as the apiserver returns it (fields the client's models may not know yet kept)."""
    body = await cluster.core.read_namespaced_pod(name, namespace, _preload_content=False)
    found: Json = await body.json()
    return found


def extended_use(claims: Sequence[Json], pod: Json) -> tuple[Json | None, Json | None]:
    """The pod's status.extendedResourceClaimStatus and the claim it names, with what must match kube-scheduler's:
    the annotation, the pod as controlling owner, the requests and the devices' pool."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if status is None:
        return None, None
    [claim] = [c for c in claims if c["metadata"]["name"] == status["resourceClaimName"]]
    return status["requestMappings"], {
        "annotations": claim["metadata"].get("annotations"),
        "owner": [(ref["kind"], ref["name"], ref.get("controller")) for ref in claim["metadata"]["ownerReferences"]],
        "requests": claim["spec"]["devices"]["requests"],
        "named": claim["metadata"]["name"].startswith(f"{pod['metadata']['name']}-extended-resources-"),
        "devices": len(claim["status"]["allocation"]["devices"]["results"]),
        "reserved": [ref["name"] for ref in claim["status"]["reservedFor"]]}


async def test_an_extended_resource_a_device_class_serves_gets_devices_as_kube_scheduler_gives_them(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A DeviceClass serves the extended resource X (its extendedResourceName). Node 0 publishes one GPU, node 1
    two; node 2 has X: 1 in allocatable (a device plugin serves it there). A pod asking X: 2 gets both GPUs of node
    1 through a claim made for it (annotated, owned by the pod, named in its status); a pod pinned to node 2 asking
    X: 1 is counted as any resource there, no claim; a pod asking X: 3 waits with kube-scheduler's reason; a pod
    whose earlier claim is left over (made while it was gated) gets a new one, the old one deleted."""
    resource = f"{namespace}.example.com/gpu"
    async with two_sets(cluster, 2) as sets, device_objects(cluster) as devices, workers(plane, TWO):
        await devices.device_class(f"{namespace}-gpu", extended=resource)
        outcomes: dict[str, Any] = {}
        reasons: dict[str, str] = {}
        plugin_nodes = []
        try:
            for scheduler, prefix in SCHEDULERS:
                tag, nodes = sets[scheduler]
                [plugin] = await cluster.create_nodes(1, prefix=f"{tag}-plugin", capacity={
                    **NODE_CAPACITY, resource: "1"}, labels={"dra-set": tag})
                plugin_nodes.append(plugin)
                await cluster.wait_nodes_ready([plugin])
                await devices.publish(nodes[0], [gpu("gpu-0")])
                await devices.publish(nodes[1], [gpu("gpu-0"), gpu("gpu-1")])
                two, on_plugin, three, leftover = hoss_pods(f"{prefix}ext", 4)
                extended_pod(two, resource, 2)
                extended_pod(three, resource, 3)
                extended_pod(leftover, resource, 1)
                extended_pod(on_plugin, resource, 1)
                for_scheduler([two, on_plugin, three, leftover], scheduler, tag)
                on_plugin["spec"]["nodeSelector"]["kubernetes.io/hostname"] = plugin
                leftover["spec"]["nodeSelector"]["kubernetes.io/hostname"] = nodes[0]
                leftover["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
                names = await cluster.create_pods([two, on_plugin, three, leftover], namespace=namespace)
                where = await wait_bound(cluster, namespace, names[:2])
                message = await wait_reason(cluster, namespace, names[2], "cannot allocate all claims")
                if scheduler == "hoss":
                    # `hoss why` reads the DeviceClasses too: the device nodes cannot allocate, the plugin's is short
                    answer = await why_json(plane, f"{namespace}/{names[2]}")
                    said = {v["node"]: json.dumps(v) for v in answer["verdicts"] if v["node"] in [*nodes, plugin]}
                    assert all("cannot allocate all claims" in said[node] for node in nodes), said
                    assert f"Insufficient {resource}" in said[plugin], said
                # the nodes of this test's set only (the plane's other nodes come and go)
                reasons[scheduler] = ", ".join(sorted(
                    clause.strip(" .") for clause in message.split(" preemption:")[0].split(": ", 1)[1].split(",")
                    if clause.strip(" .") and "didn't match" not in clause and "still not schedulable" not in clause))
                # a claim an earlier attempt left, with requests: kube-scheduler deletes it and tries again
                uid = (await cluster.core.read_namespaced_pod(names[3], namespace)).metadata.uid
                await devices.api.create_namespaced_resource_claim(namespace, {
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": f"{names[3]}-extended-resources-old", "annotations": {
                        "resource.kubernetes.io/extended-resource-claim": "true"}, "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Pod", "name": names[3], "uid": uid, "controller": True}]},
                    "spec": {"devices": {"requests": [request("container-0-request-2", f"{namespace}-gpu")]}}})
                await cluster.core.patch_namespaced_pod(names[3], namespace, [
                    {"op": "remove", "path": "/spec/schedulingGates"}], _content_type="application/json-patch+json")
                if scheduler == "hoss":
                    where |= await wait_bound(cluster, namespace, names[3:])
                else:
                    # kube-scheduler deletes it in PostFilter, then leaves the pod for its next flush of
                    # unschedulable pods (up to 5 minutes); hoss deletes it and makes the new claim in one PreBind
                    await wait_reason(cluster, namespace, names[3], "deletion of ResourceClaim completed")
                    await cluster.core.delete_namespaced_pod(names[3], namespace, grace_period_seconds=0)
                claims = await devices.claims(namespace)
                bound = names[:2] + names[3:] if scheduler == "hoss" else names[:2]
                raws = [await raw_pod(cluster, namespace, name) for name in bound]
                outcomes[scheduler] = {
                    "nodes": [([*nodes, plugin].index(where[name])) for name in bound],
                    "uses": [extended_use(claims, raw) for raw in raws],
                    "old claim left": any(c["metadata"]["name"].endswith("-old") for c in claims)}
        finally:
            await cluster.delete_nodes(plugin_nodes)
        normal = json.loads(json.dumps(outcomes["hoss"]).replace('"hext-', '"kext-'))
        assert {**normal, "nodes": normal["nodes"][:2], "uses": normal["uses"][:2]} == json.loads(
            json.dumps(outcomes["default-scheduler"])), outcomes
        assert outcomes["hoss"]["nodes"] == [1, 2, 0], outcomes
        assert outcomes["hoss"]["uses"][2][1] is not None and outcomes["hoss"]["uses"][2][1]["devices"] == 1
        mappings, claim = outcomes["hoss"]["uses"][0]
        index = sorted(["cpu", "memory", resource]).index(resource)
        assert mappings == [{"containerName": "main", "resourceName": resource,
                             "requestName": f"container-0-request-{index}"}], mappings
        assert claim is not None and claim["devices"] == 2 and claim["reserved"] == ["hext-0000"], claim
        assert outcomes["hoss"]["uses"][1] == (None, None), "a device plugin serves it on node 2: no claim"
        assert not outcomes["hoss"]["old claim left"], outcomes
        assert reasons["default-scheduler"] == reasons["hoss"] == \
            f"1 Insufficient {resource}, 2 cannot allocate all claims", reasons
        assert await pending(cluster, namespace) == ["hext-0002", "kext-0002"]
        held = allocated(await devices.claims(namespace))
        assert len(held) == len(set(held)) == 2 + 2 + 1, held


async def test_the_gpu_policy_keeps_a_claim_s_devices_on_one_nvlink_domain_where_first_fit_splits_them(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A node with four GPUs in two NVLink domains (0, 0, 1, 1), the first taken by a one-GPU claim: a claim for
    two gets gpu-1 and gpu-2 from kube-scheduler and from hoss's default policy (first fit, across the domains),
    and gpu-2 and gpu-3 under hoss's gpu policy (DynamicResources' alignBy), leaving domain 0's free GPU alone."""
    arms = (("default-scheduler", None), ("hoss", "default"), ("hoss", "gpu"))
    async with contextlib.AsyncExitStack() as stack:
        devices = await stack.enter_async_context(device_objects(cluster))
        await stack.enter_async_context(workers(plane, [("dra-0", ["default"]), ("dra-1", ["gpu"])]))
        gpus = await devices.device_class(f"{namespace}-gpu")
        chosen = {}
        for index, (scheduler, policy) in enumerate(arms):
            tag = f"nvl{next(_tags)}"
            [node] = await stack.enter_async_context(node_set(cluster, 1, labels={"dra-set": tag}))
            await devices.publish(node, [gpu(f"gpu-{i}", nvlink=domain) for i, domain in enumerate((0, 0, 1, 1))])
            await devices.claim(namespace, f"one-{index}", [request("gpu", gpus)])
            await devices.claim(namespace, f"pair-{index}", [request("gpu", gpus, count=2)])
            one, pair = hoss_pods(f"nvl{index}", 2, policy=policy)
            with_claim(one, claim=f"one-{index}")
            with_claim(pair, claim=f"pair-{index}")
            for_scheduler([one, pair], scheduler, tag)
            [first] = await cluster.create_pods([one], namespace=namespace)
            await wait_bound(cluster, namespace, [first])
            [second] = await cluster.create_pods([pair], namespace=namespace)
            await wait_bound(cluster, namespace, [second])
            claims = await devices.claims(namespace)
            chosen[f"{scheduler}/{policy}"] = [
                sorted(r["device"] for r in claim_of(claims, name)["status"]["allocation"]["devices"]["results"])
                for name in (first, second)]
        assert chosen == {"default-scheduler/None": [["gpu-0"], ["gpu-1", "gpu-2"]],
                          "hoss/default": [["gpu-0"], ["gpu-1", "gpu-2"]],
                          "hoss/gpu": [["gpu-0"], ["gpu-2", "gpu-3"]]}, chosen
        assert await pending(cluster, namespace) == []
        held = allocated(await devices.claims(namespace))
        assert len(held) == len(set(held)) == 3 * 3, held


async def test_two_workers_racing_for_partitions_of_one_gpu_never_overdraw_its_counters(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Three nodes, each with one 80Gi GPU published as partitions drawing on its memory counter (the whole GPU and
    two halves, three devices), and six pods created at once on two workers: three asking the whole GPU (policy
    default), three a half (policy binpack). Different devices, so only the counters keep a whole and a half off one
    GPU when two workers decide at the same instant (the ledger's counter promise): no GPU's memory is overdrawn,
    and a pod left waiting has no GPU it would fit."""
    sizes = {"whole": 80, "half-a": 40, "half-b": 40}
    tag = f"parts{next(_tags)}"
    async with node_set(cluster, 3, labels={"dra-set": tag}) as nodes, \
            device_objects(cluster) as devices, workers(plane, TWO):
        gpus = await devices.device_class(f"{namespace}-gpu")
        for node in nodes:
            await devices.publish_partitioned(node, memory="80Gi", parts={
                name: f"{size}Gi" for name, size in sizes.items()})
        profile = f'device.attributes["{DRIVER}"].profile'
        await devices.template(namespace, "whole", [request("gpu", gpus, expression=f'{profile} == "whole"')])
        await devices.template(namespace, "half", [request("gpu", gpus, expression=f'{profile} == "half"')])
        wholes, halves = hoss_pods("whole", 3, policy="default"), hoss_pods("half", 3, policy="binpack")
        for pod in wholes:
            with_claim(pod, template="whole")
        for pod in halves:
            with_claim(pod, template="half")
        pods = [pod for pair in zip(wholes, halves, strict=True) for pod in pair]
        await cluster.create_pods(pinned(pods, "dra-set", tag), namespace=namespace)

        def drawn(claims: Sequence[Json]) -> dict[str, int]:
            used = dict.fromkeys(nodes, 0)
            for _driver, pool, device in allocated(claims):
                used[pool] += sizes[device]
            return used

        async def settled() -> tuple[bool, str]:
            waiting = await pending(cluster, namespace)
            used = drawn(await devices.claims(namespace))
            fits_somewhere = [name for name in waiting
                              if any(80 - used[node] >= (80 if name.startswith("whole") else 40) for node in nodes)]
            return not fits_somewhere, f"waiting {waiting}, GPU memory drawn {used}"

        await until(settled, timeout=180, what="every pod bound or left with no GPU it fits")
        used = drawn(await devices.claims(namespace))
        assert all(amount <= 80 for amount in used.values()), used
        held = allocated(await devices.claims(namespace))
        assert len(held) == len(set(held)), held
        for name in (await pending(cluster, namespace))[:1]:
            await wait_reason(cluster, namespace, name, "cannot allocate all claims")


async def test_the_resolver_refuses_another_scheduler_a_partition_that_would_overdraw_a_gpu(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    """One 80Gi GPU as partitions (the whole GPU, two halves). A half is promised in the ledger to a hoss pod whose
    claims are being written, by what it draws on the GPU's memory counter (as a worker promises it): kube-scheduler,
    which has not seen it, allocates the whole GPU, a different device, and the resolver refuses it (80Gi + 40Gi of
    80Gi); once the promise is gone, kube-scheduler gets it."""
    async with node_set(cluster, 1, labels={"dra-set": f"counters{next(_tags)}"}) as [node], \
            device_objects(cluster) as devices:
        gpus = await devices.device_class(f"{namespace}-gpu")
        await devices.publish_partitioned(node, memory="80Gi", parts={"whole": "80Gi", "half-a": "40Gi",
                                                                      "half-b": "40Gi"})
        gib = 1 << 30
        key = f"{DRIVER}/{node}/gpu-0-memory"
        promise = CounterDraw(key=key, counters=(("memory", 80 * gib * 1000, 0, 40 * gib * 1000),), seen_devices=(),
                              mine_devices=((f"{DRIVER}/{node}/half-a", f"memory={40 * gib * 1000}"),))
        assert await ledger.promise_counters(uid="a-hoss-pod", draws=[promise], ttl_seconds=600) is None
        await devices.claim(namespace, "theirs", [request(
            "gpu", gpus, expression=f'device.attributes["{DRIVER}"].profile == "whole"')])
        name = await refused_to_kube_scheduler(cluster, namespace, node, f"counter memory of {key} would be overdrawn")
        assert allocated(await devices.claims(namespace)) == []
        assert await ledger.unpromise_counters(uid="a-hoss-pod", keys=[key]) == 1
        await wait_bound(cluster, namespace, [name], timeout=120)
        assert allocated(await devices.claims(namespace)) == [(DRIVER, node, "whole")]
