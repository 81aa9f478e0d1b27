"""Extended resources backed by DRA: the names DeviceClasses map, a request as a node counts it (kube-scheduler
leaves such a resource to DRA on a node without it in allocatable), the webhook letting such a pod through on the
rest of its request, and the sync counting its bound pods the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from kubernetes_asyncio import client

from hoss.ledger.client import Ledger
from hoss.model.dra import DeviceClasses, extended_resource_names, without_dra
from resolver.sync import LedgerSync
from tests.kube_objects import Json, raw_pod
from tests.unit.webhooks import NODE_ROOM, PodReads, review, start

GPU = "example.com/gpu"


def device_class(name: str, extended: str | None = None) -> Json:
    spec: Json = {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}
    if extended is not None:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def test_a_device_class_maps_its_implicit_name_and_its_extended_resource_name() -> None:
    assert extended_resource_names(device_class("gpus", GPU)) == {"deviceclass.resource.kubernetes.io/gpus", GPU}
    assert extended_resource_names(device_class("fpgas")) == {"deviceclass.resource.kubernetes.io/fpgas"}


def test_a_node_without_the_resource_leaves_it_to_dra_and_a_device_plugin_node_counts_it() -> None:
    request = {"cpu": 500, GPU: 1, "example.com/nic": 2, "pods": 1}
    dra = frozenset({GPU})
    assert without_dra(request, allocatable={"cpu": 4000, "pods": 110}, dra=dra) == {
        "cpu": 500, "example.com/nic": 2, "pods": 1}, "a resource no DeviceClass maps is counted as always"
    assert without_dra(request, allocatable={"cpu": 4000, GPU: 8, "pods": 110}, dra=dra) == request


def test_the_device_classes_say_which_names_came_or_went() -> None:
    classes = DeviceClasses()
    assert classes.replace([device_class("gpus", GPU)]) == {GPU, "deviceclass.resource.kubernetes.io/gpus"}
    assert classes.apply("MODIFIED", device_class("gpus", GPU)) == frozenset()
    assert classes.apply("ADDED", device_class("more-gpus", GPU)) == {"deviceclass.resource.kubernetes.io/more-gpus"}
    assert classes.apply("DELETED", device_class("gpus")) == {"deviceclass.resource.kubernetes.io/gpus"}
    assert GPU in classes.names, "another class still maps it"
    assert classes.apply("DELETED", device_class("more-gpus")) == {GPU, "deviceclass.resource.kubernetes.io/more-gpus"}
    assert classes.names == frozenset()


def gpu_pod(name: str, cpu: str) -> dict[str, Any]:
    return raw_pod(name, {"cpu": cpu, GPU: "1"}, uid=f"u-{name}", namespace="team")


async def test_a_binding_of_a_pod_asking_a_dra_backed_resource_is_judged_on_the_rest(tmp_path: Path) -> None:
    reads = PodReads(gpu_pod("dra", "1"), gpu_pod("greedy", "4"))
    async for hook in start(tmp_path, get_pod=reads):
        _, body = await hook.post(review(pod_name="dra", uid="u-dra", node="n1"))
        assert body["response"]["status"]["message"] == (
            f"hoss: node n1 has no room for team/dra: {GPU} requested 1, free 0"), "no DeviceClass maps it yet"
        hook.state.device_classes.replace([device_class("gpus", GPU)])
        _, body = await hook.post(review(pod_name="dra", uid="u-dra", node="n1"))
        assert body["response"]["allowed"] is True
        assert [(e.uid, e.request) for e in await hook.ledger.entries()] == [("u-dra", {"cpu": 1000, "pods": 1})]
        _, body = await hook.post(review(pod_name="greedy", uid="u-greedy", node="n1"))
        assert body["response"]["status"]["message"] == (
            "hoss: node n1 has no room for team/greedy: cpu requested 4, free 1"), "its CPU is guarded as ever"


async def test_a_device_plugin_node_still_counts_the_resource(tmp_path: Path) -> None:
    reads = PodReads(gpu_pod("a", "100m"), gpu_pod("b", "100m"))
    async for hook in start(tmp_path, get_pod=reads):
        await hook.ledger.rebuild(nodes=[("n1", {**NODE_ROOM, GPU: 1}, {})], bound=[])
        hook.state.device_classes.replace([device_class("gpus", GPU)])
        _, body = await hook.post(review(pod_name="a", uid="u-a", node="n1"))
        assert body["response"]["allowed"] is True
        _, body = await hook.post(review(pod_name="b", uid="u-b", node="n1"))
        assert body["response"]["status"]["message"] == (
            f"hoss: node n1 has no room for team/b: {GPU} requested 1, free 0")


@pytest.fixture
async def sync(fake_redis: fakeredis.FakeAsyncRedis) -> AsyncIterator[LedgerSync]:
    api = client.ApiClient()
    synced = LedgerSync(ledger=Ledger(fake_redis), api=api, device_classes=DeviceClasses())
    synced.nodes["n1"] = (NODE_ROOM, {}, "")
    await synced.rebuild()
    yield synced
    await api.close()


async def entries(sync: LedgerSync) -> dict[str, dict[str, int]]:
    return {entry.uid: entry.request for entry in await sync.ledger.entries()}


async def test_the_sync_counts_bound_dra_pods_as_the_webhook_does_and_recounts_when_classes_change(
    sync: LedgerSync,
) -> None:
    sync.device_classes.replace([device_class("gpus", GPU)])
    await sync._on_pod_event("ADDED", raw_pod("dra", {"cpu": "1", GPU: "1"}, uid="u-dra", node="n1", generation=1))
    await sync.flush_pods()
    assert await entries(sync) == {"u-dra": {"cpu": 1000, "pods": 1}}
    assert sync.stats.overcommits == 0
    assert await sync.audit() == [], "the audit expects what the sync wrote"
    await sync.recount(sync.device_classes.apply("DELETED", device_class("gpus", GPU)))
    assert await entries(sync) == {"u-dra": {"cpu": 1000, GPU: 1, "pods": 1}}, "no class maps it any more"
    assert await sync.audit() == []
