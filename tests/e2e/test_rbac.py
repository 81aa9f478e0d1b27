"""Least privilege, measured: every verb deploy/rbac.yaml grants a hoss component is one it uses.

The session's plane runs with the apiserver's audit log (Metadata level, the hoss components' requests only). A
scenario here drives every path that needs a grant: pods placed, a pod that fits nowhere (its PodScheduled
condition and FailedScheduling event), a pod for a policy no worker serves (NoWorkerForPolicy), a PodGroup gang
(its status), a preemption (PodDisruptionBudgets listed, an eviction), both Lease elections, the resolver's sync
and a pod read, a malformed node reservation annotation (the resolver's Warning event), a Reservation placed
and expired, a pod whose claims wait for their first consumer (a static PV bound, a claim provisioned), and a
dispatcher, a resolver, a worker and a rescheduler with --access=kubernetes (TokenReview, SubjectAccessReview).
Then the audit log of the whole session so far (this scenario and any test before it) is compared with the rules
bound to each component's ServiceAccount: a grant no call used fails the test, and so does any call the
apiserver refused.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from dev.local.cluster import Cluster, pod_manifest
from dev.local.credentials import HOSS_COMPONENTS, HOSS_NAMESPACE
from dev.local.plane import RBAC_MANIFEST, LocalPlane
from dev.local.state import Process
from hoss.model.resources import NODE_RESERVATION_ANNOTATION
from tests.e2e.hoss import hoss_pods, status_access, wait_all_bound, workers
from tests.provisioner import running_provisioner
from tests.waiting import until

Grant = tuple[str, str, str]
"""(API group, resource[/subresource], verb)"""
RARE: dict[tuple[str, Grant], str] = {
    ("hoss-worker", ("", "pods", "get")): "a work item queued without its pod, by a dispatcher older than compact"
    " work items (rolling upgrade): workers/core.py Worker._fetch",
    ("hoss-resolver", ("", "pods", "get")): "an admitted entry still not bound --verify-after-seconds after its"
    " admission (resolver/sync.py verify_admitted), or a foreign binding of a pod the sync's index of other"
    " schedulers' pending pods has not seen yet (resolver/judge.py); the scenario's foreign pod is indexed",
    **{("hoss-rescheduler", grant): "a move plan carried out (rescheduler/execute.py); tests/e2e/test_defrag.py "
       "runs one, before this test in a full run" for grant in (
           ("", "pods", "list"), ("", "pods", "patch"), ("", "pods/eviction", "create"),
           ("policy", "poddisruptionbudgets", "list"), ("", "events", "create"),
           ("resource.k8s.io", "resourceslices", "list"), ("resource.k8s.io", "resourceclaims", "list"),
           ("resource.k8s.io", "deviceclasses", "list"),
           ("coordination.k8s.io", "leases", "get"), ("coordination.k8s.io", "leases", "create"),
           ("coordination.k8s.io", "leases", "update"))},
    ("hoss-worker", ("resource.k8s.io", "resourceclaims", "delete")): "the claim made for a pod's extended"
    " resources deleted when its binding fails or before a new attempt (workers/devices.py); tests/e2e/test_dra.py"
    " drives it",
    ("hoss-worker", ("resource.k8s.io", "resourceclaims/binding", "update")): "the apiserver's authorizer checks it"
    " on every write of a claim's status.allocation or status.reservedFor (workers/devices.py); a check, never a"
    " request of its own, so the audit log has no call for it",
}
"""Grants used on a path this scenario cannot reach, each with the path; they must still be granted."""
CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}


def granted(manifest: Path) -> dict[str, set[Grant]]:
    """What rbac.yaml grants each hoss ServiceAccount, through its (Cluster)RoleBindings."""
    documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in documents if d["kind"] in ("Role", "ClusterRole")}
    result: dict[str, set[Grant]] = defaultdict(set)
    for binding in (d for d in documents if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for subject in binding["subjects"]:
            if subject["kind"] != "ServiceAccount" or subject.get("namespace") != HOSS_NAMESPACE:
                continue
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            result[subject["name"]].add((group, resource, verb))
    return result


def _namespace_terminating(status: dict[str, Any]) -> bool:
    """A 403 from the NamespaceLifecycle admission plugin, not from RBAC: the namespace is being deleted."""
    causes = (status.get("details") or {}).get("causes") or []
    return (any(cause.get("type") == "NamespaceTerminating" for cause in causes)
            or "because it is being terminated" in str(status.get("message", "")))


def used(audit_log: Path) -> tuple[dict[str, set[Grant]], dict[str, set[str]]]:
    """From the audit log: the grants each component's calls needed, and the calls the apiserver refused (403)."""
    calls: dict[str, set[Grant]] = defaultdict(set)
    refused: dict[str, set[str]] = defaultdict(set)
    prefix = f"system:serviceaccount:{HOSS_NAMESPACE}:"
    for line in audit_log.read_text().splitlines():
        event: dict[str, Any] = json.loads(line)
        username = event["user"]["username"]
        ref = event.get("objectRef")
        if not username.startswith(prefix) or ref is None:
            continue  # non-resource URLs (discovery) need no grant of rbac.yaml
        component = username.removeprefix(prefix)
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        grant = (ref.get("apiGroup", ""), resource, event["verb"])
        status = event.get("responseStatus") or {}
        if status.get("code") == 403 and not _namespace_terminating(status):
            refused[component].add(f"{event['verb']} {event['requestURI']}")
        elif status.get("code") == 403:
            continue  # not RBAC: a namespace being deleted takes no new content (an earlier test's, here)
        else:
            calls[component].add(grant)
    return calls, refused


async def audit_log_caught_up(plane: LocalPlane, namespace: str) -> None:
    """Wait until the audit log holds the calls made so far. The backend writes each event once its response is
    complete, so a marker request sent after them (as a hoss component, to a non-resource URL, which `used` skips)
    is written after theirs."""
    marker = f"/version?audit-marker={namespace}"
    start = plane.audit_log.stat().st_size
    await asyncio.to_thread(plane.kubectl, "get", "--raw", marker, identity="hoss-worker")

    def logged() -> tuple[bool, str]:
        with plane.audit_log.open("rb") as log:
            log.seek(start)
            grown = log.read()
        return f'"requestURI":"{marker}"'.encode() in grown, f"{len(grown)} bytes written since the marker was sent"

    await until(logged, timeout=30, what="the audit log to record the marker request")


async def preempt_once(plane: LocalPlane, cluster: Cluster, namespace: str) -> None:
    """On a node of its own, a low-priority pod fills it; a high-priority one then needs its room."""
    (node,) = await cluster.create_nodes(1, prefix=f"rbac-pre-{namespace}"[:40], capacity={"cpu": "2", "memory": "8Gi",
                                                                                          "pods": "10"})
    classes = {f"{namespace}-low": 10, f"{namespace}-high": 1000}
    try:
        await cluster.wait_nodes_ready([node])
        for name, value in classes.items():
            manifest = plane.directory / f"{name}.json"
            manifest.write_text(json.dumps({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                            "metadata": {"name": name}, "value": value}))
            await asyncio.to_thread(plane.kubectl, "apply", "-f", str(manifest))
        pods = {}
        for role in ("low", "high"):
            (pod,) = hoss_pods(f"rbac-{role}", 1, cpu="2")
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            pod["spec"]["priorityClassName"] = f"{namespace}-{role}"
            pods[role] = pod
        await cluster.create_pods([pods["low"]], namespace=namespace)

        async def on_node(name: str) -> tuple[bool, str]:
            found = [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
                     if p["metadata"]["name"] == name]
            return bool(found and found[0]["spec"].get("nodeName") == node), str(len(found))

        await until(lambda: on_node("rbac-low-0000"), timeout=60, what="the low-priority pod to be bound")
        await cluster.create_pods([pods["high"]], namespace=namespace)
        await until(lambda: on_node("rbac-high-0000"), timeout=90, what="the high-priority pod to preempt")
    finally:
        for name in classes:
            await asyncio.to_thread(plane.kubectl, "delete", "priorityclass", name, "--ignore-not-found",
                                    "--wait=false")
        await cluster.delete_nodes([node])


async def reserve_once(cluster: Cluster, namespace: str) -> None:
    custom: Any = client.CustomObjectsApi(cluster.api)
    name = f"rbac-{namespace}"[:60]
    body = {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation", "metadata": {"name": name},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                                           "resources": {"requests": {"cpu": "100m"}}}]}},
                     "owners": [{"object": {"name": "nobody", "namespace": namespace}}], "ttl": "3s"}}
    await custom.create_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations", body)
    seen: set[str] = set()

    async def failed() -> tuple[bool, str]:
        found = await custom.get_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations", name)
        phase = (found.get("status") or {}).get("phase", "")
        seen.add(phase)
        return phase == "Failed", str(sorted(seen))

    try:
        await until(failed, timeout=60, what="the Reservation to be placed and then expire")
    finally:
        await custom.delete_cluster_custom_object("scheduling.koordinator.sh", "v1alpha1", "reservations", name)


async def devices_once(cluster: Cluster, namespace: str, node: str) -> None:
    """A pod with a ResourceClaim for one device `node` publishes: the worker allocates and reserves it; a pod
    asking the extended resource the class serves: the worker makes its claim."""
    api: Any = client.ResourceV1Api(cluster.api)
    driver, device_class, pool = "rbac.example.com", f"{namespace}-rbac-gpu", f"{namespace}-rbac"
    await api.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                   "metadata": {"name": device_class}, "spec": {"selectors": [
                                       {"cel": {"expression": f'device.driver == "{driver}"'}}]}})
    await api.create_resource_slice({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": pool},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}})
    try:
        await api.create_namespaced_resource_claim(namespace, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "rbac-gpu"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}})
        claimed, extended = hoss_pods("rbac-devices", 2)
        claimed["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "rbac-gpu"}]
        resources = extended["spec"]["containers"][0]["resources"]
        resources["requests"][f"deviceclass.resource.kubernetes.io/{device_class}"] = "1"
        resources["limits"] = {f"deviceclass.resource.kubernetes.io/{device_class}": "1"}
        await cluster.create_pods([claimed, extended], namespace=namespace)

        async def bound() -> tuple[bool, str]:
            names = [(await cluster.core.read_namespaced_pod(f"rbac-devices-{i:04d}", namespace)).spec.node_name
                     for i in range(2)]
            return names == [node, node], str(names)

        await until(bound, timeout=60, what="the pods with a ResourceClaim and a DRA extended resource to be bound")
    finally:
        await api.delete_resource_slice(pool)
        await api.delete_device_class(device_class)


async def volumes_once(cluster: Cluster, namespace: str, node: str) -> None:
    """A pod with two claims of WaitForFirstConsumer classes: one takes a static PV on `node` (the worker reads and
    updates the PV, reads the claim), the other is provisioned there (it updates the claim: selected-node)."""
    storage: Any = client.StorageV1Api(cluster.api)
    static, dynamic, provisioner = f"{namespace}-static", f"{namespace}-dyn", f"{namespace}.test.hoss.io"[:63]
    volume = f"{namespace}-pv"
    try:
        for name, by in ((static, "kubernetes.io/no-provisioner"), (dynamic, provisioner)):
            await storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                                "metadata": {"name": name}, "provisioner": by,
                                                "volumeBindingMode": "WaitForFirstConsumer"})
        await cluster.core.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": static,
                     "local": {"path": "/mnt/rbac"}, "nodeAffinity": {"required": {"nodeSelectorTerms": [
                         {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                "values": [node]}]}]}}}})
        for name, storage_class in (("rbac-static", static), ("rbac-dyn", dynamic)):
            await cluster.core.create_namespaced_persistent_volume_claim(namespace, {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                         "resources": {"requests": {"storage": "1Gi"}}}})
        (pod,) = hoss_pods("rbac-volumes", 1)
        pod["spec"]["volumes"] = [{"name": claim, "persistentVolumeClaim": {"claimName": claim}}
                                  for claim in ("rbac-static", "rbac-dyn")]
        async with running_provisioner(cluster.api, provisioner=provisioner, classes={dynamic}):
            await cluster.create_pods([pod], namespace=namespace)

            async def bound() -> tuple[bool, str]:
                raw = await cluster.core.read_namespaced_pod("rbac-volumes-0000", namespace)
                return raw.spec.node_name == node, str(raw.spec.node_name)

            await until(bound, timeout=90, what="the pod with claims to be bound where its volumes are")
    finally:
        for call, name in ((storage.delete_storage_class, static), (storage.delete_storage_class, dynamic),
                           (cluster.core.delete_persistent_volume, volume)):
            await call(name)


def test_granted_reads_roles_through_their_bindings() -> None:
    grants = granted(RBAC_MANIFEST)
    assert set(grants) == set(HOSS_COMPONENTS)
    assert ("", "pods/binding", "create") in grants["hoss-worker"]
    assert ("coordination.k8s.io", "leases", "update") in grants["hoss-resolver"]


async def test_every_verb_granted_to_a_component_is_one_it_uses_and_none_is_refused(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    assert plane.state().audit, "the session's plane must run with the audit log (tests/e2e/conftest.py)"
    custom: Any = client.CustomObjectsApi(cluster.api)
    await custom.create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups",
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
         "metadata": {"name": "rbac-pg", "namespace": namespace}, "spec": {"minMember": 2}},
    )
    # Kubernetes' and Volcano's PodGroups: the dispatcher writes their status too.
    await custom.create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha2", namespace, "podgroups",
        {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
         "metadata": {"name": "rbac-wg", "namespace": namespace},
         "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}},
    )
    await custom.create_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", namespace, "podgroups",
        {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
         "metadata": {"name": "rbac-vg", "namespace": namespace}, "spec": {"minMember": 2}},
    )
    # An elastic quota the pods below stay within: the resolver's sync lists and watches it and writes its status.
    await custom.create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", namespace, "elasticquotas",
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
         "metadata": {"name": "rbac-eq", "namespace": namespace}, "spec": {"max": {"pods": 100}}},
    )
    nodes = await cluster.create_nodes(2, prefix="rbac", capacity=CAPACITY)
    try:
        await cluster.wait_nodes_ready(nodes)
        # A malformed node reservation annotation: the resolver warns with an event on the node.
        await asyncio.to_thread(plane.kubectl, "annotate", "node", nodes[1],
                                f"{NODE_RESERVATION_ANNOTATION}=not-json")
        workload_members = hoss_pods("rbac-wg", 2)
        for pod in workload_members:
            pod["spec"]["schedulingGroup"] = {"podGroupName": "rbac-wg"}
        volcano_members = hoss_pods("rbac-vg", 2)
        for pod in volcano_members:
            pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "rbac-vg"}
        async with workers(plane, [("rbac-1", ["default"])]):
            await cluster.create_pods(
                [
                    *hoss_pods("rbac-fits", 3),
                    *hoss_pods("rbac-gang", 2, labels={"scheduling.x-k8s.io/pod-group": "rbac-pg"}),
                    *workload_members, *volcano_members,
                ],
                namespace=namespace,
            )
            await wait_all_bound(cluster, namespace, 9)
            # A pod kube-scheduler binds: the resolver reads it (pending pods are not in the sync's index).
            await cluster.create_pods([pod_manifest("rbac-foreign", requests={"cpu": "100m"})], namespace=namespace)
            await wait_all_bound(cluster, namespace, 10)
            await cluster.create_pods(
                [*hoss_pods("rbac-huge", 1, cpu="500"), *hoss_pods("rbac-nobody", 1, policy="no-such-policy")],
                namespace=namespace,
            )

            async def explained() -> tuple[bool, str]:
                reasons = {e.reason for name in ("rbac-huge-0000", "rbac-nobody-0000")
                           for e in await cluster.events_for(namespace, name)}
                return {"FailedScheduling", "NoWorkerForPolicy"} <= reasons, str(sorted(reasons))

            await until(explained, timeout=60, what="the unplaceable pods to be told why")

            async def podgroup_status() -> tuple[bool, str]:
                group = await custom.get_namespaced_custom_object(
                    "scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", "rbac-pg")
                status = group.get("status") or {}
                return status.get("phase") in ("Scheduling", "Running") and "scheduleStartTime" in status, str(status)

            await until(podgroup_status, timeout=60, what="the dispatcher to write the PodGroup's status")

            async def other_podgroups_status() -> tuple[bool, str]:
                workload = await custom.get_namespaced_custom_object(
                    "scheduling.k8s.io", "v1alpha2", namespace, "podgroups", "rbac-wg")
                volcano = await custom.get_namespaced_custom_object(
                    "scheduling.volcano.sh", "v1beta1", namespace, "podgroups", "rbac-vg")
                conditions = (workload.get("status") or {}).get("conditions") or []
                phase = (volcano.get("status") or {}).get("phase")
                return bool(conditions) and phase in ("Inqueue", "Running"), f"{conditions}; {phase}"

            await until(other_podgroups_status, timeout=60,
                        what="the dispatcher to write Kubernetes' and Volcano's PodGroups' status")

            async def quota_status() -> tuple[bool, str]:
                quota = await custom.get_namespaced_custom_object(
                    "scheduling.x-k8s.io", "v1alpha1", namespace, "elasticquotas", "rbac-eq")
                used = (quota.get("status") or {}).get("used") or {}
                return int(used.get("pods", 0)) > 0, str(used)

            await until(quota_status, timeout=60, what="the resolver to write the ElasticQuota's status.used")
            # Preemption: a high-priority pod evicts a low-priority one from a full node (PDBs listed, an eviction).
            await preempt_once(plane, cluster, namespace)
            # A Reservation: watched by the dispatcher and the resolver, placed by the worker (status Available),
            # ended by the dispatcher when its ttl passes (status Failed).
            await reserve_once(cluster, namespace)
            # Claims waiting for their first consumer: the worker binds a PV and names a node on a claim.
            await volumes_once(cluster, namespace, nodes[0])
            # A ResourceClaim: the dispatcher watches claims, slices and classes; the worker reads the claim, adds
            # its finalizer and writes its allocation and reservedFor.
            await devices_once(cluster, namespace, nodes[1])
        # --access=kubernetes on the dispatcher, a resolver and a worker: TokenReview and SubjectAccessReview.
        outcomes = await status_access(plane, namespace)
        components = ("dispatcher", "resolver", "worker", "rescheduler")
        assert {c: outcomes[f"{c} viewer /status"] for c in components} == dict.fromkeys(components, 200)
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)
    await audit_log_caught_up(plane, namespace)

    calls, refused = await asyncio.to_thread(used, plane.audit_log)
    grants = granted(RBAC_MANIFEST)
    problems = []
    for (component, grant), why in RARE.items():
        assert grant in grants[component], f"RARE lists {component} {grant} ({why}), which rbac.yaml no longer grants"
    for component in HOSS_COMPONENTS:
        rare = {grant for (who, grant) in RARE if who == component}
        unused = sorted(grants[component] - calls[component] - rare)
        if unused:
            problems.append(f"{component} is granted but never used: {unused}")
        if refused[component]:
            problems.append(f"{component} was refused: {sorted(refused[component])}")
    print({c: sorted(calls[c]) for c in HOSS_COMPONENTS})
    assert not problems, "\n".join(problems)
