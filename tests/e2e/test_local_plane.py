"""The local control plane is real: kwok nodes turn Ready, kube-scheduler binds, kwok runs the pods, and
kube-controller-manager keeps workloads, PodDisruptionBudgets and namespaces as a real cluster does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from tests.waiting import until

CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "110"}


async def test_kube_scheduler_binds_a_pod_that_then_runs_while_a_pod_for_a_missing_scheduler_stays_pending(
    cluster: Cluster, namespace: str
) -> None:
    nodes = await cluster.create_nodes(10, prefix="smoke", capacity=CAPACITY)
    try:
        await cluster.wait_nodes_ready(nodes)
        # The orphan first: kube-scheduler's pod watch delivers pods in the order they were created, so once it
        # has bound the pod created after the orphan it has seen the orphan, and left it alone.
        await cluster.create_pods(
            [pod_manifest("orphan", requests={"cpu": "1"}, scheduler_name="no-such-scheduler")], namespace=namespace
        )
        await cluster.create_pods([pod_manifest("placed", requests={"cpu": "1", "memory": "1Gi"})], namespace=namespace)

        async def placed_runs() -> tuple[bool, str]:
            pod = await cluster.core.read_namespaced_pod("placed", namespace)
            return pod.status.phase == "Running", f"phase={pod.status.phase} node={pod.spec.node_name}"

        await until(placed_runs, timeout=60, what="the default-scheduler pod to run")
        placed = await cluster.core.read_namespaced_pod("placed", namespace)
        assert placed.spec.node_name in nodes

        orphan = await cluster.core.read_namespaced_pod("orphan", namespace)
        assert orphan.status.phase == "Pending"
        assert orphan.spec.node_name is None
    finally:
        await cluster.delete_nodes(nodes)


@pytest.mark.parametrize(
    ("identity", "verb", "resource", "allowed"),
    [
        ("hoss-worker", "create", "pods/binding", True),
        ("hoss-worker", "patch", "pods/status", True),
        ("hoss-worker", "delete", "pods", False),
        ("hoss-worker", "update", "nodes", False),
        ("hoss-dispatcher", "watch", "pods", True),
        ("hoss-dispatcher", "create", "pods/binding", False),
        ("hoss-dispatcher", "patch", "pods/status", True),
        ("hoss-resolver", "list", "nodes", True),
        ("hoss-resolver", "create", "pods/binding", False),
        ("hoss-resolver", "create", "pods", False),
    ],
)
def test_each_component_identity_has_only_the_rights_it_needs(
    plane: LocalPlane, identity: str, verb: str, resource: str, allowed: bool
) -> None:
    kind, _, subresource = resource.partition("/")
    extra = [f"--subresource={subresource}"] if subresource else []
    answer = plane.kubectl("auth", "can-i", verb, kind, *extra, "--all-namespaces", identity=identity, check=False)
    assert answer.strip() == ("yes" if allowed else "no")


def test_up_twice_keeps_the_same_processes_and_down_leaves_nothing_running(tmp_path: Path) -> None:
    second = LocalPlane(tmp_path / "second")
    try:
        first_state = second.up(scheduler=False, webhook=False)
        assert second.is_up()
        again = second.up(scheduler=False, webhook=False)
        assert [p.pid for p in again.processes] == [p.pid for p in first_state.processes]
    finally:
        stopped = second.down()
    assert set(stopped) == {"etcd", "kube-apiserver", "kube-controller-manager", "kwok", "fake-dra-driver",
                            "redis-server"}
    for process in first_state.processes:
        assert not Path(f"/proc/{process.pid}").exists() or b"Z" in _state_of(process.pid)
    assert second.status() == {}
    assert not Path(first_state.etcd_data).exists()


def _state_of(pid: int) -> bytes:
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]


async def test_controller_manager_recreates_replicaset_pods_counts_budgets_and_finishes_namespaces(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    """A deleted pod of a ReplicaSet comes back (a new uid), a PodDisruptionBudget gets its status from the
    disruption controller, and a deleted namespace goes away with what it held."""
    replicaset = {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web", "namespace": namespace},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"schedulerName": "no-such-scheduler",
                                       "containers": [{"name": "c", "image": "x"}]}}},
    }
    budget = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }
    manifest = plane.directory / f"{namespace}-workload.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [replicaset, budget]}))
    plane.kubectl("apply", "-f", str(manifest))

    async def two_pods() -> tuple[bool, str]:
        pods = await cluster.pods(namespace, label_selector="app=web")
        return len(pods) == 2, f"{len(pods)} pods"

    await until(two_pods, timeout=60, what="the ReplicaSet's 2 pods")
    first = {pod.metadata.uid for pod in await cluster.pods(namespace, label_selector="app=web")}
    victim = (await cluster.pods(namespace, label_selector="app=web"))[0].metadata.name
    await cluster.core.delete_namespaced_pod(victim, namespace, grace_period_seconds=0)

    async def replaced() -> tuple[bool, str]:
        uids = {pod.metadata.uid for pod in await cluster.pods(namespace, label_selector="app=web")}
        return len(uids) == 2 and len(uids - first) == 1, f"uids {sorted(uids)} (first {sorted(first)})"

    await until(replaced, timeout=60, what="the ReplicaSet to recreate its deleted pod")

    async def budget_status() -> tuple[bool, str]:
        status = json.loads(plane.kubectl("get", "pdb", "web", "-n", namespace, "-o", "json")).get("status") or {}
        # Both pods are Pending (no such scheduler): none is healthy, so no disruption is allowed.
        return status.get("expectedPods") == 2 and status.get("disruptionsAllowed") == 0, str(status)

    await until(budget_status, timeout=60, what="the disruption controller to count the budget's pods")

    gone = f"{namespace}-gone"
    await cluster.ensure_namespace(gone)
    plane.kubectl("create", "configmap", "left", "-n", gone)
    plane.kubectl("delete", "namespace", gone, "--wait=false")

    async def namespace_deleted() -> tuple[bool, str]:
        out = plane.kubectl("get", "namespace", gone, "--ignore-not-found", "-o", "name")
        return out.strip() == "", out.strip() or "gone"

    await until(namespace_deleted, timeout=90, what=f"namespace {gone} to finish deleting")


@pytest.mark.parametrize(
    ("user", "command", "refused"),
    [
        # The dispatcher reads the ledger but may not write it.
        ("hoss-dispatcher", ("HGETALL", "{hoss}:node:x:used"), False),
        ("hoss-dispatcher", ("HSET", "{hoss}:node:x:used", "cpu", "1"), True),
        ("hoss-dispatcher", ("XADD", "{hoss}:queue:x", "*", "k", "v"), False),
        # The resolver writes the ledger and its stats, but not the work streams.
        ("hoss-resolver", ("HSET", "{hoss}:resolver:x", "k", "v"), False),
        ("hoss-resolver", ("XADD", "{hoss}:queue:x", "*", "k", "v"), True),
        ("hoss-worker", ("HSET", "{hoss}:worker:x", "k", "v"), False),
        # Nobody but admin reaches keys outside {hoss}, or dangerous commands.
        ("hoss-worker", ("SET", "elsewhere", "1"), True),
        ("hoss-worker", ("FLUSHALL",), True),
        ("hoss-resolver", ("CONFIG", "GET", "*"), True),
        ("hoss-dispatcher", ("KEYS", "*"), True),
    ],
)
def test_each_component_redis_user_has_only_the_commands_and_keys_it_needs(
    plane: LocalPlane, user: str, command: tuple[str, ...], refused: bool
) -> None:
    state = plane.state()
    admin = redis.Redis.from_url(state.redis_url, decode_responses=True)
    client = redis.Redis.from_url(state.redis_url_for(user), decode_responses=True)
    try:
        if refused:
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)  # type: ignore[no-untyped-call]
        else:
            client.execute_command(*command)  # type: ignore[no-untyped-call]
        # The plane's Redis has no usable default user: an unauthenticated client can do nothing.
        anonymous = redis.Redis(host="127.0.0.1", port=state.redis_port)
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.ping()
        anonymous.close()
    finally:
        admin.delete(*[key for key in ("{hoss}:node:x:used", "{hoss}:queue:x", "{hoss}:resolver:x",
                                       "{hoss}:worker:x", "elsewhere")])
        # These refusals were asked for: the session's check that no component was ever refused must not see them.
        admin.acl_log_reset()
        admin.close()
        client.close()
