"""The holes in "no binding that oversells a node gets through, whoever makes it" (issue 12), each reproduced on the
real plane: a pod created on a full node, an in-place resize past the node, a node deleted and re-created, a Redis
that comes back with an older copy of the ledger, drift the audit must repair, the system namespaces, dry runs, and
a binding the apiserver refuses after the webhook allowed it. Every test here ends with the independent oversell
check (conftest's no_node_oversold: the apiserver's pods against the nodes' allocatable), unless it oversells on
purpose.

Hole 2 (an admitted entry dropped before the sync saw the pod bound) is held open here by a resolver whose sync
cannot start (its Lease is held by nobody), so the webhook admits while nothing records the pod bound. Hole 8 (a
binding without uid matched against a deleted pod of that name; refused since issue 33) needs the sync's watch to lag
the apiserver: the resolver reaches the apiserver through a proxy that holds back what its open connections receive.
Hole 5 also runs with two resolver processes on one Redis.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from dev.local.cluster import Cluster, node_manifest
from dev.local.plane import LocalPlane
from hoss.kube.client import KubeError, request_json
from hoss.kube.rest import STRATEGIC_MERGE_PATCH
from hoss.ledger.client import Ledger
from hoss.model.objects import Json
from tests.e2e.guard import (
    apiserver_cpu,
    create,
    ledger_agrees,
    ledger_counter,
    ledger_cpu,
    one_node,
    pod_on,
    refused,
    resolver_get,
)
from tests.e2e.proxy import FreezableProxy
from tests.waiting import until


async def counter_grows(plane: LocalPlane, name: str, before: int) -> None:
    """Wait until the resolver's /status shows `name` above `before` (it reads the counters every 2 s)."""

    async def grown() -> tuple[bool, str]:
        now = await ledger_counter(plane, name)
        return now > before, f"{name} {now} (before {before})"

    await until(grown, timeout=30, what=f"the resolver to count {name}")


async def gone(call: Any) -> None:
    """Await `call`; a 404 (already gone) is fine."""
    try:
        await call
    except KubeError as error:
        if error.status != 404:
            raise
    except Exception as error:  # the generated client's ApiException
        if getattr(error, "status", None) != 404:
            raise


async def binding(cluster: Cluster, namespace: str, pod: Json, node: str, **kwargs: Any) -> None:
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    await request_json(cluster.core.create_namespaced_pod_binding, pod["metadata"]["name"], namespace, body, **kwargs)


# -- hole 1: pods created with spec.nodeName ------------------------------------------------------------------


async def test_hole1_a_pod_created_with_node_name_on_a_full_node_is_refused(
    cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "h1-full", "2")
    try:
        await create(cluster, namespace, pod_on("first", node, "1500m"))
        error = await refused(create(cluster, namespace, pod_on("second", node, "1")))
        assert f"hoss: node {node} has no room for {namespace}/second: cpu requested 1, free 500m" in str(error)
        await ledger_agrees(cluster, ledger, node)
        assert await ledger_cpu(ledger, node) == 1500
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


@pytest.mark.oversells
async def test_hole1_an_overcommit_the_sync_learns_is_counted_and_shown(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "h1-over", "1")
    before = await ledger_counter(plane, "overcommits")
    plane.unregister_webhook()  # what a deployment without the pod rules let through
    try:
        for name in ("a", "b"):
            await create(cluster, namespace, pod_on(name, node, "1"))
    finally:
        plane.register_webhook()
    try:
        await ledger_agrees(cluster, ledger, node)
        await counter_grows(plane, "overcommits", before)
        metrics = await resolver_get(plane, "/metrics")
        assert any(line.startswith("hoss_ledger_overcommits ") and float(line.split()[1]) > before
                   for line in metrics.splitlines()), metrics[-2000:]
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


# -- hole 2: an admitted binding stays counted until the apiserver says otherwise ------------------------------


async def test_hole2_an_admitted_binding_stays_counted_whatever_workers_and_timers_do_while_the_sync_lags(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger, tmp_path: Path
) -> None:
    node = await one_node(cluster, "h2-lag", "2")
    frozen = "hoss-holes-frozen-sync"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": frozen, "namespace": "hoss-system"},
             "spec": {"holderIdentity": "nobody", "leaseDurationSeconds": 3600, "acquireTime": now,
                      "renewTime": now}}
    manifest = tmp_path / "lease.json"
    manifest.write_text(json.dumps(lease))
    try:
        await ledger_agrees(cluster, ledger, node)  # the node is in the ledger
        first = await create(cluster, namespace, pod_on("first", None, "1500m"))
        second = await create(cluster, namespace, pod_on("second", None, "1"))
        # A resolver that serves the webhook but never syncs: the sync's Lease is held by nobody.
        plane.kubectl("apply", "-f", str(manifest))
        plane.stop_resolver()
        plane.start_resolver(extra_args=[f"--lease-name={frozen}"])
        plane.register_webhook()
        await binding(cluster, namespace, first, node)
        uid = first["metadata"]["uid"]
        (entry,) = [e for e in await ledger.entries() if e.uid == uid]
        # What could free the room while the sync lags: the binder giving up after a timeout or an error, its
        # shutdown, the expiry timer, a duplicate work item reserving the pod on another node.
        await ledger.release_assumed(uid=uid, node=node)
        await ledger.release_assumed(uid=uid, node=node, answered=True)
        await ledger.release_owner(entry.owner)
        await ledger.expire()
        assert await ledger.reserve(uid=uid, pod=entry.pod, node=node, request={"cpu": 1, "pods": 1},
                                    owner="duplicate", ttl_seconds=30) is not None
        assert await ledger_cpu(ledger, node) == 1500, "the bound pod's room must stay counted"
        error = await refused(binding(cluster, namespace, second, node))
        assert "has no room" in str(error)
    finally:
        plane.stop_resolver()
        plane.kubectl("delete", "lease", frozen, "-n", "hoss-system", "--ignore-not-found")
        plane.ensure_resolver()
        await ledger_agrees(cluster, ledger, node)
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


# -- hole 3: in-place resize ------------------------------------------------------------------------------------


async def test_hole3_a_resize_past_the_node_is_refused_and_one_that_fits_is_counted(
    cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "h3-resize", "2")
    try:
        await create(cluster, namespace, pod_on("grow", node, "1"))
        await ledger_agrees(cluster, ledger, node)

        async def running() -> tuple[bool, str]:
            pod = await request_json(cluster.core.read_namespaced_pod, "grow", namespace)
            return pod["status"].get("phase") == "Running", str(pod["status"].get("phase"))

        await until(running, timeout=60, what="kwok to run the pod")
        # What a kubelet that resizes in place reports (kwok's fake one does not, and the apiserver refuses to
        # resize a running container whose status has no resources).
        status = {"status": {"containerStatuses": [{
            "name": "main", "image": "registry.k8s.io/pause:3.10", "imageID": "", "ready": True, "restartCount": 0,
            "started": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
            "allocatedResources": {"cpu": "1", "memory": "64Mi"},
            "resources": {"requests": {"cpu": "1", "memory": "64Mi"}},
        }]}}
        await request_json(cluster.core.patch_namespaced_pod_status, "grow", namespace, status,
                           _content_type=STRATEGIC_MERGE_PATCH)

        def resize(cpu: str) -> Any:
            patch = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}]}}
            return request_json(cluster.core.patch_namespaced_pod_resize, "grow", namespace, patch,
                                _content_type=STRATEGIC_MERGE_PATCH)

        await create(cluster, namespace, pod_on("neighbour", node, "500m"))
        # 1800m fits the node alone (the apiserver checks only that) but not beside the neighbour
        error = await refused(resize("1800m"))
        assert f"hoss: node {node} has no room for {namespace}/grow: cpu requested 1800m, free 1500m" in str(error)
        await resize("1500m")
        await ledger_agrees(cluster, ledger, node)
        assert await ledger_cpu(ledger, node) == 2000
        error = await refused(create(cluster, namespace, pod_on("late", node, "1")))
        assert "has no room" in str(error)
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


# -- hole 4: a node deleted and re-created ---------------------------------------------------------------------


async def test_hole4_a_node_deleted_and_recreated_keeps_its_pods_counted(
    cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "h4-again", "2")
    try:
        await create(cluster, namespace, pod_on("stays", node, "1500m"))
        await ledger_agrees(cluster, ledger, node)
        await cluster.delete_nodes([node])

        async def gone() -> tuple[bool, str]:
            names = {n["metadata"]["name"] for n in await cluster.raw_list("list_node")}
            return node not in names, "deleted" if node not in names else "still there"

        await until(gone, timeout=30, what=f"node {node} to be deleted")
        await cluster.call(cluster.core.create_node,
                           node_manifest(node, capacity={"cpu": "2", "memory": "8Gi", "pods": "110"}), create=True)
        await cluster.wait_nodes_ready([node])
        await ledger_agrees(cluster, ledger, node)
        error = await refused(create(cluster, namespace, pod_on("extra", node, "1")))
        assert "has no room" in str(error)
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


# -- hole 5: a Redis that comes back with an older copy; drift the audit repairs -------------------------------


async def test_hole5_a_redis_back_from_an_older_copy_is_detected_and_rebuilt(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "h5-stale", "4")
    raw = aioredis.Redis.from_url(plane.state().redis_url)
    try:
        await create(cluster, namespace, pod_on("early", node, "1"))
        await ledger_agrees(cluster, ledger, node)
        before = await ledger_counter(plane, "stale_ledger")
        # The copy a restart from an older snapshot, or a failover to a lagging replica, would bring back.
        keys = [key async for key in raw.scan_iter(match="{hoss}:*", count=1000)]
        dumps = {key: await raw.dump(key) for key in keys}
        await create(cluster, namespace, pod_on("late", node, "2"))
        await ledger_agrees(cluster, ledger, node)
        await asyncio.sleep(3)  # the sync's watchdog ticks past the copy's stamp
        pipe = raw.pipeline(transaction=True)
        pipe.flushdb()
        for key, value in dumps.items():
            if value is not None:
                pipe.restore(key, 0, value)
        await pipe.execute()
        assert await ledger.is_ready(), "the old copy says it is ready"
        await ledger_agrees(cluster, ledger, node)
        await counter_grows(plane, "stale_ledger", before)
        error = await refused(create(cluster, namespace, pod_on("over", node, "2")))
        assert "has no room" in str(error)
    finally:
        await raw.aclose()
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


async def test_hole5_the_audit_finds_repairs_and_reports_drift(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = "h5-audit-0000"
    try:
        plane.stop_resolver()
        plane.start_resolver(extra_args=["--audit-interval-seconds=2"])
        plane.register_webhook()
        node = await one_node(cluster, "h5-audit", "2")
        created = await create(cluster, namespace, pod_on("counted", node, "1500m"))
        uid = created["metadata"]["uid"]

        async def bound() -> tuple[bool, str]:
            states = [e.state for e in await ledger.entries() if e.uid == uid]
            return states == ["bound"], f"entry {states}"

        await until(bound, timeout=60, what="the sync to record the pod bound")
        before = await ledger_counter(plane, "audit_drift")
        assert await ledger.release(uid)  # drift: a bound pod's entry lost
        await ledger_agrees(cluster, ledger, node)
        await counter_grows(plane, "audit_drift", before)
        error = await refused(create(cluster, namespace, pod_on("extra", node, "1")))
        assert "has no room" in str(error)
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])
        plane.stop_resolver()
        plane.ensure_resolver()


REPLICA_LEASE = ["--lease-name=hoss-resolver-sync-replicas", "--lease-duration-seconds=4",
                 "--renew-deadline-seconds=3", "--renew-interval-seconds=1"]
"""Both replicas of the two-replica test on a Lease of their own, short enough that a killed leader's Lease lapses in
4 s (the plane's resolver is stopped meanwhile: one sync per ledger)."""


async def replica_status(plane: LocalPlane, port: int) -> Json:
    context = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    async with aiohttp.ClientSession() as session, session.get(
        f"https://127.0.0.1:{port}/status", ssl=context
    ) as response:
        response.raise_for_status()
        status: Json = await response.json()
        return status


async def review_by_apiserver(plane: LocalPlane, port: int, namespace: str, pod: Json, node: str,
                              *, dry_run: bool) -> Json:
    """A binding review posted straight to the replica on ``port``, signed as the apiserver (its webhook client
    certificate), as the apiserver would send it for an admin's binding; the replica's response."""
    context = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    context.load_cert_chain(plane.webhook_client_dir / "apiserver.crt", plane.webhook_client_dir / "apiserver.key")
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    review = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": f"review-{name}", "operation": "CREATE", "dryRun": dry_run, "name": name, "namespace": namespace,
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "binding",
            "userInfo": {"username": "admin"},
            "object": {"apiVersion": "v1", "kind": "Binding",
                       "metadata": {"name": name, "namespace": namespace, "uid": uid},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
        },
    }
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session, session.post(
        f"https://127.0.0.1:{port}/validate-binding", json=review
    ) as response:
        assert response.status == 200, await response.text()
        answer: Json = (await response.json())["response"]
        return answer


async def test_hole5_two_resolver_replicas_one_syncs_both_judge_and_the_survivor_takes_over(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger, tmp_path: Path
) -> None:
    """Two resolver processes on one Redis: only the Lease holder syncs (the follower leaves the ledger alone), both
    judge bindings against the shared ledger, and when the leader is killed (SIGKILL: no Lease handed back) the
    other takes the sync over without erasing the bound pods' entries, and keeps refusing what does not fit."""
    node = "h5-ha-0000"
    try:
        plane.stop_resolver()
        # Both at once: whichever takes the Lease first syncs. The first has the plane's name: the webhook calls it.
        replicas = [plane.start_resolver(extra_args=REPLICA_LEASE, wait=False),
                    plane.start_resolver(name="hoss-resolver-replica", extra_args=REPLICA_LEASE, wait=False)]
        plane.wait_healthy(replicas)
        plane.register_webhook()
        node = await one_node(cluster, "h5-ha", "2")
        pods = {name: await create(cluster, namespace, pod_on(name, None, cpu))
                for name, cpu in (("a", "500m"), ("b", "500m"), ("c", "500m"), ("big", "1"), ("small", "500m"))}
        for name in ("a", "b", "c"):
            await binding(cluster, namespace, pods[name], node)
        await ledger_agrees(cluster, ledger, node)
        epoch = await ledger.epoch()
        leading = {p.name: (await replica_status(plane, p.port))["leader"] for p in replicas}
        assert sorted(leading.values()) == [False, True], leading
        leader, follower = sorted(replicas, key=lambda p: not leading[p.name])
        # The follower judges against the shared ledger: 1500m of 2000m used, so 1000m more is refused, 500m fits.
        denied = await review_by_apiserver(plane, follower.port, namespace, pods["big"], node, dry_run=True)
        assert not denied["allowed"] and "has no room" in denied["status"]["message"], denied
        allowed = await review_by_apiserver(plane, follower.port, namespace, pods["small"], node, dry_run=True)
        assert allowed["allowed"], allowed
        assert await ledger.epoch() == epoch, "the follower rebuilt the ledger"

        config = plane.webhook_configuration()
        hooks: list[Json] = config["webhooks"]  # type: ignore[assignment]
        os.killpg(leader.pid, signal.SIGKILL)
        plane.stop_process(leader.name)

        async def took_over() -> tuple[bool, str]:
            status = await replica_status(plane, follower.port)
            synced = bool(status["leader"] and status["sync"] and status["sync"]["synced"])
            return synced, f"leader {status['leader']}, sync {status['sync']}"

        await until(took_over, timeout=30, what="the surviving replica to take the sync over")
        bound = {e.uid: (e.state, e.node) for e in await ledger.entries() if e.node == node}
        assert bound == {pods[n]["metadata"]["uid"]: ("bound", node) for n in ("a", "b", "c")}
        assert await ledger_cpu(ledger, node) == 1500
        # The webhook calls the survivor (already so when the killed leader was the second replica).
        for hook in hooks:
            hook["clientConfig"]["url"] = hook["clientConfig"]["url"].replace(f":{replicas[0].port}/",
                                                                              f":{follower.port}/")
        (tmp_path / "webhook.json").write_text(json.dumps(config))
        await asyncio.to_thread(plane.kubectl, "apply", "-f", str(tmp_path / "webhook.json"))

        async def refused_for_room() -> tuple[bool, str]:
            try:
                await binding(cluster, namespace, pods["big"], node)
            except KubeError as error:
                return "has no room" in str(error), str(error)
            return True, "bound: oversold"

        await until(refused_for_room, timeout=30, what="the survivor to refuse the binding that does not fit")
        await binding(cluster, namespace, pods["small"], node)
        await ledger_agrees(cluster, ledger, node)
        assert await apiserver_cpu(cluster, node) == 2000
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])
        plane.stop_resolver()
        plane.stop_process("hoss-resolver-replica")
        plane.kubectl("-n", "hoss-system", "delete", "lease", "hoss-resolver-sync-replicas", "--ignore-not-found")
        plane.ensure_resolver()


# -- hole 8: a binding without a uid ----------------------------------------------------------------------------


async def test_hole8_a_binding_without_uid_is_refused_even_while_the_sync_indexes_a_deleted_namesake(
    plane: LocalPlane, cluster: Cluster, namespace: str, ledger: Ledger, tmp_path: Path
) -> None:
    """The syncing resolver reaches the apiserver through a proxy that holds its watches' events back, so the sync
    still indexes a deleted pod when a new pod of the same name, three times larger, is bound without a uid. Judged
    by name against the deleted pod (a bound entry on that node: nothing to check) the binding would oversell the
    node by 500m; by name the apiserver binds whichever pod has it when the binding lands, so a binding without a
    uid is refused (issue 33; it was judged against the live pod, by a GET, before)."""
    node = "h8-0000"
    proxy = FreezableProxy(plane.state().apiserver_port)
    try:
        port = await proxy.start()
        kubeconfig = json.loads(plane.kubeconfig("hoss-resolver").read_text())
        kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
        (tmp_path / "resolver-via-proxy.json").write_text(json.dumps(kubeconfig))
        plane.stop_resolver()
        # A Lease of its own, long enough that renewals held back by the proxy do not end its sync mid-test.
        plane.start_resolver(extra_args=[
            f"--kubeconfig={tmp_path / 'resolver-via-proxy.json'}", "--lease-name=hoss-resolver-sync-hole8",
            "--lease-duration-seconds=60", "--renew-deadline-seconds=45", "--renew-interval-seconds=2",
            "--audit-interval-seconds=600",  # an audit's fresh list would end the lag the test holds open
        ])
        plane.register_webhook()
        node = await one_node(cluster, "h8", "2")

        async def node_synced() -> tuple[bool, str]:
            return node in await ledger.node_usage([node]), "the node not in the ledger yet"

        await until(node_synced, timeout=30, what="the sync to add the node to the ledger")
        await create(cluster, namespace, pod_on("filler", node, "1"))
        await create(cluster, namespace, pod_on("namesake", node, "500m"))
        await ledger_agrees(cluster, ledger, node)
        assert await ledger_cpu(ledger, node) == 1500

        proxy.freeze()
        await request_json(cluster.core.delete_namespaced_pod, "namesake", namespace, grace_period_seconds=0)
        await until(lambda: gone_from_apiserver(cluster, namespace, "namesake"), timeout=30,
                    what="the deleted pod to leave the apiserver")
        assert await ledger_cpu(ledger, node) == 1500, "the sync saw the deletion: the proxy did not hold it back"
        await create(cluster, namespace, pod_on("namesake", None, "1500m"))
        no_uid = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "namesake"},
                  "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        error = await refused(request_json(cluster.core.create_namespaced_pod_binding, "namesake", namespace, no_uid))
        assert error.status == 400 and "has no metadata.uid" in str(error), error
        proxy.thaw()
        await ledger_agrees(cluster, ledger, node)
        assert await apiserver_cpu(cluster, node) == 1000
    finally:
        await proxy.close()
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])
        plane.stop_resolver()
        plane.kubectl("-n", "hoss-system", "delete", "lease", "hoss-resolver-sync-hole8", "--ignore-not-found")
        plane.ensure_resolver()


async def gone_from_apiserver(cluster: Cluster, namespace: str, name: str) -> tuple[bool, str]:
    names = [p["metadata"]["name"] for p in await cluster.raw_list("list_namespaced_pod", namespace)]
    return name not in names, f"pods {names}"


# -- hole 6: the system namespaces ------------------------------------------------------------------------------


async def test_hole6_system_namespaces_are_judged_and_fail_open_only_when_nobody_can_judge(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    full, spare = await cluster.create_nodes(2, prefix="h6-system", capacity={"cpu": "1", "memory": "8Gi",
                                                                                "pods": "110"})
    await cluster.wait_nodes_ready([full, spare])
    system = "kube-system"
    names = ["sys-a", "sys-b", "sys-c"]
    try:
        await create(cluster, system, pod_on("sys-a", full, "1"))
        error = await refused(create(cluster, system, pod_on("sys-b", full, "1")))
        assert "has no room" in str(error)
        plane.stop_process("hoss-resolver")  # the webhook stays registered, nobody answers it
        try:
            await create(cluster, system, pod_on("sys-c", spare, "1"))  # fails open: system pods must start
            error = await refused(create(cluster, namespace, pod_on("user", spare, "1")))
            assert "hoss-resolver" in str(error) or "failed calling webhook" in str(error)
        finally:
            plane.ensure_resolver()
    finally:
        for name in names:
            await gone(cluster.core.delete_namespaced_pod(name, system, grace_period_seconds=0))
        await cluster.delete_nodes([full, spare])


# -- hole 7: dry runs, and a binding the apiserver refuses after the webhook allowed it -------------------------


async def test_hole7_a_dry_run_leaves_nothing_in_the_ledger(
    cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "h7-dry", "2")
    try:
        pending = await create(cluster, namespace, pod_on("pending", None, "1"))
        await binding(cluster, namespace, pending, node, dry_run="All")
        dry = await create(cluster, namespace, pod_on("dry", node, "1"), dry_run="All")
        uids = {entry.uid for entry in await ledger.entries()}
        assert pending["metadata"]["uid"] not in uids
        assert dry["metadata"]["uid"] not in uids
        assert await ledger_cpu(ledger, node) == 0
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


async def test_hole7_a_binding_refused_after_the_webhook_allowed_it_frees_its_room(
    cluster: Cluster, namespace: str, ledger: Ledger
) -> None:
    node = await one_node(cluster, "h7-refused", "1")
    doomed = pod_on("doomed", None, "1")
    doomed["metadata"]["finalizers"] = ["hoss.io/test-hold"]
    try:
        created = await create(cluster, namespace, doomed)
        await request_json(cluster.core.delete_namespaced_pod, "doomed", namespace)  # held by its finalizer
        # The webhook allows the binding (the pod fits); the apiserver then refuses it: the pod is being deleted.
        error = await refused(binding(cluster, namespace, created, node))
        assert error.status == 409 and "being deleted" in str(error), error

        async def freed() -> tuple[bool, str]:
            held = [e for e in await ledger.entries() if e.uid == created["metadata"]["uid"]]
            return not held, f"entry {held}"

        # well before a minute: the sync's check proves the write failed
        await until(freed, timeout=40, what="the refused binding's room to be freed")
        await create(cluster, namespace, pod_on("next", node, "1"))
    finally:
        patch = {"metadata": {"finalizers": None}}
        await gone(request_json(cluster.core.patch_namespaced_pod, "doomed", namespace, patch,
                                _content_type=STRATEGIC_MERGE_PATCH))
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])

