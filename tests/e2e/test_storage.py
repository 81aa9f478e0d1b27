"""Pods with volumes on the real plane: each scenario runs under kube-scheduler and under hoss, on nodes of their own,
and both must agree -- the node (or the class of nodes) chosen, the claim bound to the PV on that node, the reason
of a pod that waits. The plane's kube-controller-manager runs the persistentvolume-binder and ephemeral-volume
controllers; a provisioner of the tests' own (tests/provisioner.py) makes PVs on the selected node. The race of two
workers for few PVs is hoss's alone. Each test ends with the oversell check and checks which pods are left
Pending."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubernetes_asyncio import client

from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from dev.local.state import Process
from tests.e2e.hoss import (
    hoss_pods,
    node_set,
    pending,
    pinned,
    scheduled_condition,
    wait_bound,
    wait_reason,
    workers,
)
from tests.e2e.volumes import (
    SCHEDULERS,
    TWO,
    ZONE,
    for_scheduler,
    local_volume,
    storage_objects,
    two_sets,
    volume_claim,
    with_claims,
)
from tests.provisioner import running_provisioner
from tests.waiting import until


async def test_bound_local_and_zonal_volumes_take_their_pods_to_their_nodes_and_inline_volumes_constrain_nothing(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A claim bound to a local PV on node 1 (an Immediate class: the PV binder binds it), a claim bound to a PV
    labelled with zone z2 and no node affinity (VolumeZone), and a pod with only inline CSI, emptyDir, configMap,
    projected and hostPath volumes, for each scheduler."""
    zones = [{ZONE: "z0"}, {ZONE: "z1"}, {ZONE: "z2"}]
    async with two_sets(cluster, 3, labels=zones) as sets, storage_objects(cluster) as storage, \
            workers(plane, TWO):
        immediate = await storage.storage_class(f"{namespace}-imm", mode="Immediate")
        outcomes = {}
        for scheduler, prefix in SCHEDULERS:
            tag, nodes = sets[scheduler]
            await storage.volume(local_volume(f"{namespace}-{prefix}-local", nodes[1], immediate))
            await storage.volume(local_volume(f"{namespace}-{prefix}-zonal", None, immediate, size="20Gi",
                                              labels={ZONE: "z2"}))
            await storage.claim(namespace, volume_claim(f"{prefix}-local", immediate, size="5Gi"))
            await storage.claim(namespace, volume_claim(f"{prefix}-zonal", immediate, size="15Gi"))

            async def claims_bound(prefix: str = prefix) -> tuple[bool, str]:
                claims = await storage.claims(namespace)
                phases = {name: (claims.get(f"{prefix}-{name}") or {}).get("status", {}).get("phase")
                          for name in ("local", "zonal")}
                return all(phase == "Bound" for phase in phases.values()), str(phases)

            await until(claims_bound, timeout=60, what="the PV binder to bind the claims")
            local, zonal, inline = hoss_pods(f"{prefix}vol", 3)
            with_claims(local, f"{prefix}-local")
            with_claims(zonal, f"{prefix}-zonal")
            inline["spec"]["volumes"] = [
                {"name": "secrets", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True,
                                            "volumeAttributes": {"secretProviderClass": "x"}}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "config", "configMap": {"name": "absent", "optional": True}},
                {"name": "info", "projected": {"sources": [{"downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}},
                {"name": "creds", "secret": {"secretName": "absent", "optional": True}},
                {"name": "share", "nfs": {"server": "nfs.example", "path": "/export"}},
                {"name": "host", "hostPath": {"path": "/data"}},
            ]
            names = await cluster.create_pods(for_scheduler([local, zonal, inline], scheduler, tag),
                                              namespace=namespace)
            where = await wait_bound(cluster, namespace, names)
            outcomes[scheduler] = (nodes.index(where[names[0]]), nodes.index(where[names[1]]),
                                   where[names[2]] in nodes)
        assert outcomes["hoss"] == outcomes["default-scheduler"] == (1, 2, True), outcomes
        assert await pending(cluster, namespace) == []


async def test_claims_not_ready_keep_pods_waiting_with_kube_scheduler_s_reasons_until_they_are(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """An unbound claim of an Immediate class (no PV yet), a claim that does not exist and a claim being deleted:
    each pod waits with kube-scheduler's reason; once a PV on node 2 appears and the binder binds the claim, its pod
    goes to node 2, and once the missing claim is made (and bound), its pod is placed too."""
    async with two_sets(cluster, 3) as sets, storage_objects(cluster) as storage, workers(plane, TWO):
        immediate = await storage.storage_class(f"{namespace}-imm", mode="Immediate")
        reasons: dict[str, list[str]] = {}
        for scheduler, prefix in SCHEDULERS:
            tag, _nodes = sets[scheduler]
            await storage.claim(namespace, volume_claim(f"{prefix}-later", immediate,
                                                        selector={"for": f"{prefix}-later"}))
            doomed = volume_claim(f"{prefix}-doomed", immediate, selector={"for": "nothing"})
            doomed["metadata"]["finalizers"] = ["test.hoss.io/hold"]
            await storage.claim(namespace, doomed)
            await cluster.core.delete_namespaced_persistent_volume_claim(f"{prefix}-doomed", namespace)
            waiting, missing, deleting = hoss_pods(f"{prefix}wait", 3)
            with_claims(waiting, f"{prefix}-later")
            with_claims(missing, f"{prefix}-missing")
            with_claims(deleting, f"{prefix}-doomed")
            names = await cluster.create_pods(for_scheduler([waiting, missing, deleting], scheduler, tag),
                                              namespace=namespace)
            texts = ["pod has unbound immediate PersistentVolumeClaims",
                     f'persistentvolumeclaim "{prefix}-missing" not found',
                     f'persistentvolumeclaim "{prefix}-doomed" is being deleted']
            reasons[scheduler] = [
                (await wait_reason(cluster, namespace, name, text)).split(" preemption:")[0]
                .replace(f"{prefix}-", "X-")
                for name, text in zip(names, texts, strict=True)]
        # the same PreFilter message; kube-scheduler's PostFilter (preemption) adds its own words after it
        assert all(theirs.startswith(ours) and ours.startswith("0/") and ours.endswith(".")
                   for ours, theirs in zip(reasons["hoss"], reasons["default-scheduler"], strict=True)), reasons

        outcomes = {}
        for scheduler, prefix in SCHEDULERS:
            tag, nodes = sets[scheduler]
            await storage.volume(local_volume(f"{namespace}-{prefix}-later", nodes[2], immediate,
                                              labels={"for": f"{prefix}-later"}))
            await storage.volume(local_volume(f"{namespace}-{prefix}-missing", nodes[0], immediate,
                                              labels={"for": f"{prefix}-missing"}))
            await storage.claim(namespace, volume_claim(f"{prefix}-missing", immediate,
                                                        selector={"for": f"{prefix}-missing"}))
            where = await wait_bound(cluster, namespace, [f"{prefix}wait-0000", f"{prefix}wait-0001"])
            outcomes[scheduler] = [nodes.index(node) for node in where.values()]
        assert outcomes["hoss"] == outcomes["default-scheduler"] == [2, 0], outcomes
        assert await pending(cluster, namespace) == ["hwait-0002", "kwait-0002"]
        for _scheduler, prefix in SCHEDULERS:
            await cluster.core.patch_namespaced_persistent_volume_claim(
                f"{prefix}-doomed", namespace, [{"op": "remove", "path": "/metadata/finalizers"}])


async def test_wait_for_first_consumer_claims_take_a_static_volume_on_the_chosen_node(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A WaitForFirstConsumer class without provisioner and static PVs on nodes 0 (2Gi) and 2 (8Gi): a pod with a
    5Gi claim goes to node 2, the only one with a PV that fits; then a pod with a 1Gi claim to node 0, the only
    one with a PV left; each claim is bound to the PV on its pod's node. A pod with a 50Gi claim waits: no node
    has a volume to bind."""
    async with two_sets(cluster, 3) as sets, storage_objects(cluster) as storage, workers(plane, TWO):
        wffc = await storage.storage_class(f"{namespace}-wffc", mode="WaitForFirstConsumer")
        outcomes = {}
        for scheduler, prefix in SCHEDULERS:
            tag, nodes = sets[scheduler]
            small = await storage.volume(local_volume(f"{namespace}-{prefix}-small", nodes[0], wffc, size="2Gi"))
            large = await storage.volume(local_volume(f"{namespace}-{prefix}-large", nodes[2], wffc, size="8Gi"))
            for name, size in (("one", "1Gi"), ("five", "5Gi"), ("fifty", "50Gi")):
                await storage.claim(namespace, volume_claim(f"{prefix}-{name}", wffc, size=size))
            one, five, fifty = hoss_pods(f"{prefix}wffc", 3)
            with_claims(one, f"{prefix}-one")
            with_claims(five, f"{prefix}-five")
            with_claims(fifty, f"{prefix}-fifty")
            names = await cluster.create_pods(for_scheduler([five], scheduler, tag), namespace=namespace)
            await wait_bound(cluster, namespace, names)
            names += await cluster.create_pods(for_scheduler([one, fifty], scheduler, tag), namespace=namespace)
            where = await wait_bound(cluster, namespace, names[:2])
            reason = await wait_reason(cluster, namespace, names[2],
                                       "3 node(s) didn't find available persistent volumes to bind")
            claims = await storage.claims(namespace)
            volume_nodes = await storage.pv_nodes()
            outcomes[scheduler] = (
                [nodes.index(node) for node in where.values()],
                # each bound claim's PV is on its pod's node
                all(volume_nodes[claims[f"{prefix}-{claim}"]["spec"]["volumeName"]] == where[pod]
                    for claim, pod in (("five", names[0]), ("one", names[1]))),
                claims[f"{prefix}-five"]["spec"]["volumeName"] == large,
                claims[f"{prefix}-one"]["spec"]["volumeName"] == small,
                "preemption" not in reason.split(".")[0])
        assert outcomes["hoss"] == outcomes["default-scheduler"] == ([2, 0], True, True, True, True), outcomes
        assert await pending(cluster, namespace) == ["hwffc-0002", "kwffc-0002"]


async def test_wait_for_first_consumer_claims_are_provisioned_where_topology_and_capacity_allow(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A class with a provisioner (the tests' own), allowedTopologies pools a and b, and CSIStorageCapacity of 1Gi
    in pool a and 100Gi in pool b: a 5Gi claim and a generic ephemeral volume of 2Gi are provisioned on the pool b
    node, where the provisioner makes their PVs; a 500Gi claim waits for storage."""
    pools = [{"test.hoss.io/pool": "a"}, {"test.hoss.io/pool": "b"}, {"test.hoss.io/pool": "c"}]
    provisioner = f"{namespace}.provisioner.test.hoss.io"[:63]
    async with two_sets(cluster, 3, labels=pools) as sets, storage_objects(cluster) as storage, workers(plane, TWO):
        await storage.driver(provisioner)
        dynamic = await storage.storage_class(
            f"{namespace}-dyn", mode="WaitForFirstConsumer", provisioner=provisioner,
            topologies=[{"matchLabelExpressions": [{"key": "test.hoss.io/pool", "values": ["a", "b"]}]}])
        await storage.capacity(namespace, "pool-a", storage_class=dynamic, labels=pools[0], size="1Gi")
        await storage.capacity(namespace, "pool-b", storage_class=dynamic, labels=pools[1], size="100Gi")
        async with running_provisioner(cluster.api, provisioner=provisioner, classes={dynamic}):
            outcomes = {}
            for scheduler, prefix in SCHEDULERS:
                tag, nodes = sets[scheduler]
                await storage.claim(namespace, volume_claim(f"{prefix}-five", dynamic, size="5Gi"))
                await storage.claim(namespace, volume_claim(f"{prefix}-huge", dynamic, size="500Gi"))
                five, ephemeral, huge = hoss_pods(f"{prefix}dyn", 3)
                with_claims(five, f"{prefix}-five")
                with_claims(huge, f"{prefix}-huge")
                ephemeral["spec"]["volumes"] = [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": dynamic,
                    "resources": {"requests": {"storage": "2Gi"}}}}}}]
                names = await cluster.create_pods(for_scheduler([five, ephemeral, huge], scheduler, tag),
                                                  namespace=namespace)
                where = await wait_bound(cluster, namespace, names[:2])
                reason = await wait_reason(cluster, namespace, names[2], "did not have enough free storage")
                claims = await storage.claims(namespace)
                volume_nodes = await storage.pv_nodes()
                outcomes[scheduler] = (
                    [nodes.index(node) for node in where.values()],
                    [volume_nodes.get(claims[claim]["spec"].get("volumeName", "")) == where[pod]
                     for claim, pod in ((f"{prefix}-five", names[0]), (f"{names[1]}-scratch", names[1]))],
                    "2 node(s) did not have enough free storage" in reason,
                    "1 node(s) didn't find available persistent volumes to bind" in reason)
            assert outcomes["hoss"] == outcomes["default-scheduler"] == ([1, 1], [True, True], True, True), outcomes
        assert await pending(cluster, namespace) == ["hdyn-0002", "kdyn-0002"]


async def test_two_workers_racing_for_few_static_volumes_never_promise_one_twice(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Three static PVs of a WaitForFirstConsumer class, one per node, and eight pods with a claim each, half for
    each of two workers (policies default and binpack), created at once: three pods are bound, each with its
    claim bound to the PV on its node, no PV names two claims, and the other five wait for a volume."""
    async with node_set(cluster, 3, labels={"vol-set": "race"}) as nodes, storage_objects(cluster) as storage, \
            workers(plane, TWO):
        wffc = await storage.storage_class(f"{namespace}-race", mode="WaitForFirstConsumer")
        for i, node in enumerate(nodes):
            await storage.volume(local_volume(f"{namespace}-race-{i}", node, wffc))
        pods = []
        for i in range(8):
            await storage.claim(namespace, volume_claim(f"race-{i}", wffc))
            [pod] = hoss_pods(f"race{i}", 1, policy="binpack" if i % 2 else None)
            pods.append(with_claims(pod, f"race-{i}"))
        await cluster.create_pods(pinned(pods, "vol-set", "race"), namespace=namespace)

        async def settled() -> tuple[bool, str]:
            waiting = await pending(cluster, namespace)
            reasons = [(await scheduled_condition(cluster, namespace, name))[1] for name in waiting]
            return (len(waiting) == 5 and all("didn't find available persistent volumes to bind" in r
                                              for r in reasons), f"{waiting}: {reasons}")

        # a pod that lost the race in PreBind backs off (up to a minute) before its next attempt says why it waits
        await until(settled, timeout=300, what="three pods bound and five waiting for a volume")
        claims = await storage.claims(namespace)
        volume_nodes = await storage.pv_nodes()
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"]
                  for p in await cluster.raw_list("list_namespaced_pod", namespace) if p["spec"].get("nodeName")}
        assert len(placed) == 3 and sorted(placed.values()) == sorted(nodes), placed
        for pod, node in placed.items():
            claim = claims[pod.replace("race", "race-").removesuffix("-0000")]
            assert volume_nodes[claim["spec"]["volumeName"]] == node, (pod, claim["spec"])
        refs = Counter(
            (pv["spec"].get("claimRef") or {}).get("name") for pv in await cluster.raw_list("list_persistent_volume")
            if pv["metadata"]["name"].startswith(f"{namespace}-race-"))
        assert sum(refs.values()) == 3 and all(count == 1 for name, count in refs.items() if name), refs
        assert None not in refs, refs


RWOP = "ReadWriteOncePod"
RWOP_CONFLICT = ("node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use "
                 "by another pod")


async def test_a_read_write_once_pod_claim_serves_one_pod_and_the_next_waits_until_it_is_gone(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A ReadWriteOncePod claim bound to a PV on node 1: the first pod using it goes to node 1, a second waits with
    kube-scheduler's reason on each of the set's nodes, and goes to node 1 once the first is deleted."""
    async with two_sets(cluster, 3) as sets, storage_objects(cluster) as storage, workers(plane, TWO):
        immediate = await storage.storage_class(f"{namespace}-imm", mode="Immediate")
        outcomes = {}
        for scheduler, prefix in SCHEDULERS:
            tag, nodes = sets[scheduler]
            await storage.volume(local_volume(f"{namespace}-{prefix}-once", nodes[1], immediate, mode=RWOP,
                                              labels={"for": f"{prefix}-once"}))
            await storage.claim(namespace, volume_claim(f"{prefix}-once", immediate, mode=RWOP,
                                                        selector={"for": f"{prefix}-once"}))
            first, second = (with_claims(pod, f"{prefix}-once") for pod in hoss_pods(f"{prefix}once", 2))
            [first_name] = await cluster.create_pods(for_scheduler([first], scheduler, tag), namespace=namespace)
            where = await wait_bound(cluster, namespace, [first_name])
            [second_name] = await cluster.create_pods(for_scheduler([second], scheduler, tag), namespace=namespace)
            reason = await wait_reason(cluster, namespace, second_name, f"3 {RWOP_CONFLICT}")
            await cluster.core.delete_namespaced_pod(first_name, namespace, grace_period_seconds=0)
            later = await wait_bound(cluster, namespace, [second_name])
            outcomes[scheduler] = (nodes.index(where[first_name]), nodes.index(later[second_name]),
                                   reason.startswith("0/"))
        assert outcomes["hoss"] == outcomes["default-scheduler"] == (1, 1, True), outcomes
        assert await pending(cluster, namespace) == []


async def test_two_workers_deciding_at_once_never_bind_two_pods_with_one_read_write_once_pod_claim(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """Six pods using one ReadWriteOncePod claim (its PV usable on all three nodes), half for each of two workers,
    created at once: exactly one is bound; the others wait with kube-scheduler's reason."""
    async with node_set(cluster, 3, labels={"vol-set": "rwop"}), storage_objects(cluster) as storage, \
            workers(plane, TWO):
        immediate = await storage.storage_class(f"{namespace}-imm", mode="Immediate")
        await storage.volume(local_volume(f"{namespace}-shared", None, immediate, mode=RWOP,
                                          labels={"for": "shared"}))
        await storage.claim(namespace, volume_claim("shared", immediate, mode=RWOP, selector={"for": "shared"}))

        async def claim_bound() -> tuple[bool, str]:
            phase = (await storage.claims(namespace))["shared"].get("status", {}).get("phase")
            return phase == "Bound", str(phase)

        await until(claim_bound, timeout=60, what="the PV binder to bind the claim")
        pods = [with_claims(pod, "shared") for i in range(6)
                for pod in hoss_pods(f"share{i}", 1, policy="binpack" if i % 2 else None)]
        await cluster.create_pods(pinned(pods, "vol-set", "rwop"), namespace=namespace)

        async def settled() -> tuple[bool, str]:
            waiting = await pending(cluster, namespace)
            reasons = [(await scheduled_condition(cluster, namespace, name))[1] for name in waiting]
            return (len(waiting) == 5 and all(f"3 {RWOP_CONFLICT}" in r for r in reasons),
                    f"{waiting}: {reasons[:2]}")

        await until(settled, timeout=120, what="one pod bound and five waiting for the claim")


async def test_a_higher_priority_pod_preempts_the_user_of_its_read_write_once_pod_claim(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """A low-priority pod uses a ReadWriteOncePod claim (its PV on node 1); a high-priority pod using the same claim
    evicts it and takes its place on node 1, under kube-scheduler and under hoss alike."""
    scheduling: Any = client.SchedulingV1Api(cluster.api)
    classes = {f"{namespace}-low"[:60]: 10, f"{namespace}-high"[:60]: 1000}
    for name, value in classes.items():
        await scheduling.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                                "metadata": {"name": name}, "value": value})
    low_class, high_class = classes
    try:
        async with two_sets(cluster, 3) as sets, storage_objects(cluster) as storage, workers(plane, TWO):
            immediate = await storage.storage_class(f"{namespace}-imm", mode="Immediate")
            outcomes = {}
            for scheduler, prefix in SCHEDULERS:
                tag, nodes = sets[scheduler]
                await storage.volume(local_volume(f"{namespace}-{prefix}-once", nodes[1], immediate, mode=RWOP,
                                                  labels={"for": f"{prefix}-once"}))
                await storage.claim(namespace, volume_claim(f"{prefix}-once", immediate, mode=RWOP,
                                                            selector={"for": f"{prefix}-once"}))
                low, high = (with_claims(pod, f"{prefix}-once") for pod in hoss_pods(f"{prefix}prio", 2))
                low["spec"]["priorityClassName"], high["spec"]["priorityClassName"] = low_class, high_class
                [low_name] = await cluster.create_pods(for_scheduler([low], scheduler, tag), namespace=namespace)
                await wait_bound(cluster, namespace, [low_name])
                [high_name] = await cluster.create_pods(for_scheduler([high], scheduler, tag), namespace=namespace)
                where = await wait_bound(cluster, namespace, [high_name])

                async def evicted(name: str = low_name) -> tuple[bool, str]:
                    left = [p["metadata"]["name"] for p in await cluster.raw_list("list_namespaced_pod", namespace)]
                    return name not in left, str(left)

                await until(evicted, timeout=60, what=f"{low_name} to be evicted")
                outcomes[scheduler] = nodes.index(where[high_name])
            assert outcomes["hoss"] == outcomes["default-scheduler"] == 1, outcomes
            assert await pending(cluster, namespace) == []
    finally:
        for name in classes:
            await scheduling.delete_priority_class(name)
