"""The router end to end on the real plane: a namespace labelled hoss.io/policy=binpack, a plain Deployment (no
schedulerName, no hoss label) whose pods hoss's binpack worker binds, and the pods the router leaves alone."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import workers
from tests.waiting import until

NODE = {"cpu": "8", "memory": "32Gi", "pods": "110"}


def deployment(name: str, replicas: int) -> Json:
    """A Deployment as anyone writes it: nothing in it names hoss."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                                       "resources": {"requests": {"cpu": "100m"}}}]}}},
    }


async def test_a_deployment_in_a_routed_namespace_is_scheduled_by_hoss_with_its_policy(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    nodes = await cluster.create_nodes(1, prefix=f"{namespace[:40]}-r", capacity=NODE)
    try:
        await cluster.wait_nodes_ready(nodes)
        plane.kubectl("label", "namespace", namespace, "hoss.io/policy=binpack")

        async def router_sees_the_label() -> tuple[bool, str]:
            # A dry-run create goes through the mutating webhook and stores nothing.
            probe: Any = await cluster.core.create_namespaced_pod(namespace, pod_manifest("probe"), dry_run="All")
            return probe.spec.scheduler_name == "hoss", str(probe.spec.scheduler_name)

        await until(router_sees_the_label, timeout=30, what="the router to see the namespace's label")
        async with workers(plane, [("route-binpack", ["binpack"])]):
            apps: Any = client.AppsV1Api(cluster.api)
            await apps.create_namespaced_deployment(namespace, deployment("web", 3))
            # Left alone: a pod naming another scheduler, and one that opts out (kube-scheduler binds it).
            other = pod_manifest("other", scheduler_name="someone-else")
            opted_out = pod_manifest("opted-out", labels={"hoss.io/route": "off"})
            await cluster.create_pods([other, opted_out], namespace=namespace)

            async def web_bound() -> tuple[bool, str]:
                pods = [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
                        if (p["metadata"].get("labels") or {}).get("app") == "web"]
                done = [p for p in pods if p["spec"].get("nodeName")]
                return len(done) == 3, f"{len(done)}/3 bound"

            await until(web_bound, timeout=120, what="the Deployment's pods to be bound")
            pods = {p["metadata"]["name"]: p for p in await cluster.raw_list("list_namespaced_pod", namespace)}
            web = [p for p in pods.values() if (p["metadata"].get("labels") or {}).get("app") == "web"]
            for pod in web:
                assert pod["spec"]["schedulerName"] == "hoss", pod["spec"]["schedulerName"]
                assert pod["metadata"]["labels"]["hoss.io/policy"] == "binpack"
                events = await cluster.events_for(namespace, pod["metadata"]["name"])
                scheduled = [e for e in events if e.reason == "Scheduled"]
                assert any("hoss-worker/route-binpack" in (e.reporting_component or e.source.component or "")
                           for e in scheduled), [(e.reporting_component, e.source.component) for e in scheduled]
            # The Deployment's own manifest is unchanged.
            stored = await apps.read_namespaced_deployment("web", namespace)
            assert stored.spec.template.spec.scheduler_name == "default-scheduler"
            assert "hoss.io/policy" not in (stored.spec.template.metadata.labels or {})
            assert pods["other"]["spec"]["schedulerName"] == "someone-else"
            assert "hoss.io/policy" not in (pods["other"]["metadata"].get("labels") or {})
            assert pods["opted-out"]["spec"]["schedulerName"] == "default-scheduler"

            async def opted_out_bound() -> tuple[bool, str]:
                pod = (await cluster.raw_list("list_namespaced_pod", namespace,
                                              field_selector="metadata.name=opted-out"))[0]
                return bool(pod["spec"].get("nodeName")), str(pod["spec"].get("nodeName"))

            await until(opted_out_bound, timeout=60, what="kube-scheduler to bind the opted-out pod")
    finally:
        plane.kubectl("delete", "deployment", "web", "-n", namespace, "--ignore-not-found", "--wait=false")
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(nodes)
