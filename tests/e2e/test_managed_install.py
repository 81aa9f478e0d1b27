"""hoss on a control plane that cannot be reconfigured, as on EKS, GKE or AKS (issue 38): a plane of its own whose
apiserver takes no admission configuration, so it presents no client certificate to webhooks, and a resolver that
authenticates no review, as the kustomize base and the chart install it by default.

Whoever reaches the resolver's port may then post reviews. Forged ones are sent from another client while
kube-scheduler and hoss place pods: reviews for pods that do not exist (random uids) write nothing; reviews naming
real pending pods and real nodes, and creates of pods that never reach the apiserver, hold room only until the
resolver's verify finds no such write (unauthenticated_write_timeout_seconds), never oversell, and every schedulable
pod is bound once that room is released. This module checks oversell itself (its plane is not the session's).
"""

from __future__ import annotations

import asyncio
import copy
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from dev.local.cluster import Cluster, oversold_nodes, pod_manifest
from dev.local.plane import LocalPlane
from hoss.kube.client import request_json
from hoss.ledger.client import Ledger
from resolver.settings import ResolverSettings
from tests.e2e.guard import resolver_get
from tests.waiting import until

NODES = 4
NODE_CPU = "4"
PODS_PER_SCHEDULER = 6
NAMESPACE = "managed"
VERIFY_RETRY_SECONDS = 2.0  # resolver/sync.py VERIFY_RETRY_SECONDS: a kept entry is checked again this much later
VERIFY_INTERVAL_SECONDS = 1.0  # LedgerSync's verify loop period


def held_bound_seconds() -> float:
    """The most a forged review holds room, as docs/architecture.md states it: the unauthenticated write timeout,
    one verify retry and one verify round."""
    defaults = ResolverSettings.model_fields
    timeout = min(float(defaults["unauthenticated_write_timeout_seconds"].default),
                  float(defaults["write_timeout_seconds"].default))
    return timeout + VERIFY_RETRY_SECONDS + VERIFY_INTERVAL_SECONDS


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlane]:
    """A plane as a managed control plane: no admission configuration, a resolver without --client-ca-file; a
    hoss-dispatcher and one hoss-worker beside kube-scheduler."""
    local = LocalPlane(tmp_path_factory.mktemp("managed"))
    try:
        local.up(client_auth=False)
        local.start_dispatcher()
        local.start_worker("managed-0")
        yield local
    finally:
        local.down()


@pytest.fixture
async def cluster(managed: LocalPlane) -> AsyncIterator[Cluster]:
    async with await Cluster.connect(managed.kubeconfig("admin")) as connected:
        yield connected


@pytest.fixture
async def ledger(managed: LocalPlane) -> AsyncIterator[Ledger]:
    client = aioredis.Redis.from_url(managed.state().redis_url, decode_responses=True)
    yield Ledger(client)
    await client.aclose()


def binding_review(pod: str, uid: str, node: str, *, user: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Binding"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "binding",
        "name": pod, "namespace": NAMESPACE, "operation": "CREATE", "userInfo": {"username": user},
        "object": {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": NAMESPACE, "uid": uid},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}}}


def create_review(pod: str, uid: str, node: str, cpu: str, *, user: str) -> dict[str, Any]:
    manifest = pod_manifest(pod, requests={"cpu": cpu, "memory": "64Mi"})
    manifest["metadata"].update(namespace=NAMESPACE, uid=uid)
    manifest["spec"]["nodeName"] = node
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": pod, "namespace": NAMESPACE,
        "operation": "CREATE", "userInfo": {"username": user}, "object": manifest}}


class Forger:
    """Another client inside the cluster network: it trusts the resolver's serving CA (a forger could skip
    verifying it just as well) and has no client certificate."""

    def __init__(self, plane: LocalPlane) -> None:
        resolver = plane.running("hoss-resolver")
        assert resolver is not None and resolver.port is not None
        self.url = f"https://127.0.0.1:{resolver.port}/validate-binding"
        self.tls = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))

    async def post(self, reviews: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.tls)) as session:
            async def one(review: dict[str, Any]) -> dict[str, Any]:
                async with session.post(self.url, json=review) as response:
                    assert response.status == 200, await response.text()
                    answer: dict[str, Any] = (await response.json())["response"]
                    return answer
            return list(await asyncio.gather(*(one(review) for review in reviews)))


async def metric(plane: LocalPlane, name: str) -> float:
    """One unlabelled sample of the resolver's /metrics."""
    for line in (await resolver_get(plane, "/metrics")).splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in the resolver's /metrics")


async def bound_pods(cluster: Cluster) -> dict[str, str]:
    return {pod["metadata"]["name"]: pod["spec"].get("nodeName") or ""
            for pod in await cluster.raw_list("list_namespaced_pod", NAMESPACE)}


async def test_forged_reviews_on_a_managed_plane_delay_for_seconds_and_oversell_nothing(
    managed: LocalPlane, cluster: Cluster, ledger: Ledger,
) -> None:
    await cluster.ensure_namespace(NAMESPACE)
    nodes = await cluster.create_nodes(NODES, prefix="managed", capacity={"cpu": NODE_CPU, "memory": "8Gi",
                                                                           "pods": "110"})
    await cluster.wait_nodes_ready(nodes)

    async def ledger_has_nodes() -> tuple[bool, str]:
        known = set((await ledger.snapshot()).nodes)
        return set(nodes) <= known, f"ledger knows {sorted(known & set(nodes))}"

    await until(ledger_has_nodes, timeout=60, what="the ledger to know the managed plane's nodes")

    # kube-scheduler's pods, held pending by a scheduling gate so the forger can name them while they wait.
    foreign = []
    for i in range(PODS_PER_SCHEDULER):
        pod = pod_manifest(f"kube-{i}", requests={"cpu": "1", "memory": "64Mi"})
        pod["spec"]["schedulingGates"] = [{"name": "example.com/forged-first"}]
        foreign.append(await request_json(cluster.core.create_namespaced_pod, NAMESPACE, pod))

    forger = Forger(managed)
    ghosts = [str(uuid.uuid4()) for _ in range(NODES)]
    # Reviews for pods that do not exist, or naming a real pod with another uid: refused, and nothing is written.
    answers = await forger.post([binding_review(f"ghost-{i}", uid, node, user="system:kube-scheduler")
                                 for i, (uid, node) in enumerate(zip(ghosts[1:], nodes[1:], strict=True))]
                                + [binding_review("kube-0", ghosts[0], nodes[0], user="system:kube-scheduler")])
    assert not any(answer["allowed"] for answer in answers), answers
    started = time.monotonic()
    # Bindings of kube-scheduler's real pending pods to a node of the forger's choosing (the first four fill it),
    # then creates that never reach the apiserver, each pinning a whole other node (another user each, so the limit
    # on one user's unconfirmed creates does not stop them).
    answers = await forger.post([binding_review(pod["metadata"]["name"], pod["metadata"]["uid"], nodes[0],
                                                user="system:kube-scheduler") for pod in foreign])
    assert sum(answer["allowed"] for answer in answers) == int(NODE_CPU), answers
    pinned = [str(uuid.uuid4()) for _ in nodes[1:]]
    answers = await forger.post([create_review(f"pin-{i}", uid, node, NODE_CPU, user=f"forger-{i}")
                                 for i, (uid, node) in enumerate(zip(pinned, nodes[1:], strict=True))])
    assert all(answer["allowed"] for answer in answers), answers
    entries = {entry.uid: entry for entry in await ledger.entries()}
    assert not set(ghosts) & set(entries), "a review for a pod that does not exist wrote to the ledger"
    assert set(pinned) <= set(entries), "the forged creates hold room until the verify finds no such pod"

    # Both schedulers place pods meanwhile: nothing can be bound until the forged room is released.
    for pod in foreign:
        await request_json(cluster.core.patch_namespaced_pod, pod["metadata"]["name"], NAMESPACE,
                           {"spec": {"schedulingGates": None}})
    for i in range(PODS_PER_SCHEDULER):
        await request_json(cluster.core.create_namespaced_pod, NAMESPACE,
                           pod_manifest(f"hoss-{i}", requests={"cpu": "1", "memory": "64Mi"}, scheduler_name="hoss"))

    forged = set(pinned)

    async def released() -> tuple[bool, str]:
        left = forged & {entry.uid for entry in await ledger.entries()}
        return not left, f"{len(left)} forged entries still held"

    await until(released, timeout=held_bound_seconds() * 3,
                what=f"the forged reviews' room to be released (documented bound {held_bound_seconds():.0f} s)")
    held_for = time.monotonic() - started
    assert await metric(managed, "hoss_resolver_admitted_dropped") >= len(pinned), "operators see the forgeries"

    async def all_bound() -> tuple[bool, str]:
        placed = await bound_pods(cluster)
        waiting = sorted(name for name, node in placed.items() if not node)
        return not waiting, f"waiting: {waiting}"

    await until(all_bound, timeout=120, what="every schedulable pod to be bound once the forged room is released")
    delayed = time.monotonic() - started
    print(f"forged room held {held_for:.1f} s (bound {held_bound_seconds():.0f} s); last pod bound after "
          f"{delayed:.1f} s")

    pods = await cluster.raw_list("list_pod_for_all_namespaces")
    assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}, "a node is oversold"
    placed = await bound_pods(cluster)
    assert {name for name, node in placed.items() if node} == {
        *(f"kube-{i}" for i in range(PODS_PER_SCHEDULER)), *(f"hoss-{i}" for i in range(PODS_PER_SCHEDULER))}


def resize_review(old: dict[str, Any], cpu: str, *, user: str) -> dict[str, Any]:
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "resize",
        "name": old["metadata"]["name"], "namespace": old["metadata"]["namespace"], "operation": "UPDATE",
        "userInfo": {"username": user}, "object": new, "oldObject": old}}


async def test_a_forged_resize_of_a_bound_pod_holds_its_growth_only_until_the_check(
    managed: LocalPlane, cluster: Cluster, ledger: Ledger,
) -> None:
    await cluster.ensure_namespace(NAMESPACE)
    (node,) = await cluster.create_nodes(1, prefix="resized", capacity={"cpu": NODE_CPU, "memory": "8Gi",
                                                                         "pods": "110"})
    await cluster.wait_nodes_ready([node])
    small = pod_manifest("resized-small", requests={"cpu": "1", "memory": "64Mi"})
    small["spec"]["nodeName"] = node
    small = await request_json(cluster.core.create_namespaced_pod, NAMESPACE, small)

    async def ledger_cpu(want: int) -> tuple[bool, str]:
        held = (await ledger.node_usage([node])).get(node, ({}, {}))[1].get("cpu", -1)
        return held == want, f"ledger holds {held}m on {node}"

    async def counted_bound() -> tuple[bool, str]:
        held = [(entry.state, entry.request.get("cpu")) for entry in await ledger.entries() if entry.node == node]
        return held == [("bound", 1000)], f"ledger entries on {node}: {held}"

    # The sync has turned the create's admitted entry into a bound one (which takes its pod's request as the
    # apiserver has it): from then on, only the resolver's check sets a forged growth back.
    await until(counted_bound, timeout=60, what="the ledger to count the pod as bound")
    (answer,) = await Forger(managed).post([resize_review(small, NODE_CPU, user="forger")])
    assert answer["allowed"], answer
    assert (await ledger_cpu(4000))[0], "the growth is held while the resize may still be written"
    started = time.monotonic()
    await until(lambda: ledger_cpu(1000), timeout=held_bound_seconds() * 3,
                what=f"the forged growth to be set back (documented bound {held_bound_seconds():.0f} s)")
    print(f"forged resize held its growth {time.monotonic() - started:.1f} s")
    assert await metric(managed, "hoss_resolver_resizes_set_back") >= 1
    after = pod_manifest("resized-after", requests={"cpu": "3", "memory": "64Mi"})
    after["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    await request_json(cluster.core.create_namespaced_pod, NAMESPACE, after)

    async def after_bound() -> tuple[bool, str]:
        placed = (await bound_pods(cluster)).get("resized-after")
        return placed == node, f"resized-after on {placed!r}"

    await until(after_bound, timeout=60, what="kube-scheduler to bind a pod into the room the forgery named")
    pods = await cluster.raw_list("list_pod_for_all_namespaces")
    assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}, "a node is oversold"


def command_line(plane: LocalPlane, name: str) -> list[str]:
    process = plane.running(name)
    assert process is not None, f"{name} is not running"
    return Path(f"/proc/{process.pid}/cmdline").read_bytes().decode().split("\0")


def test_the_managed_plane_runs_without_admission_configuration_or_client_ca(managed: LocalPlane) -> None:
    """What makes the plane above a managed one: the apiserver takes no admission configuration (so it presents no
    client certificate to webhooks) and the resolver asks for none."""
    assert not managed.state().client_auth
    assert not any(arg.startswith("--admission-control-config-file") for arg in command_line(managed, "kube-apiserver"))
    assert not any(arg.startswith("--client-ca-file") for arg in command_line(managed, "hoss-resolver"))
