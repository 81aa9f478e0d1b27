"""Chaos on the real plane: hoss loses no pod when a worker is killed or paused past its heartbeat, the dispatcher
leader is killed with a standby running, both dispatchers are killed and restarted, Redis restarts or is flushed,
a node is deleted, or a plugin raises.

Every scenario runs three workers and the same load: 150 small pods and a PodGroup gang, then (after the
disruption) 150 more and a label gang. It ends with every schedulable pod bound, none bound twice (one Scheduled
event at most per pod, one bound ledger entry on the pod's node), 0 oversold nodes by the independent apiserver
check, and prints how long scheduling stalled (the longest time the bound count stood still while pods waited).

The kube-apiserver restart is tests/e2e/test_resilience.py. The scenarios marked ``chaos`` run with `make chaos`;
`make test` runs the others (a worker paused past its heartbeat, and FLUSHALL).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from kubernetes_asyncio import client
from redis.asyncio import Redis

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import POLICIES_FILE, LocalPlane
from dev.local.processes import alive
from dev.local.state import Process
from hoss.ledger.client import Ledger
from hoss.model.objects import Json
from hoss.queue import WorkQueue
from tests.dist_info import install_dist_info
from tests.e2e.hoss import hoss_pods, pods_watched, workers
from tests.waiting import until

NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110"}
NODES = 12
WAVE = 150
PODGROUP_MEMBERS, PODGROUP_MIN = 5, 4
LABEL_GANG = 3
HEARTBEAT_TTL_SECONDS = 5.0
_runs = itertools.count()


@dataclass
class Run:
    """What a scenario saw."""

    name: str
    nodes: list[str]
    samples: list[tuple[float, int]] = field(default_factory=list)
    """(monotonic time, pods bound) at every change of the namespace's pods."""
    disrupted_at: float = 0.0
    pods: list[Json] = field(default_factory=list)

    def stall_seconds(self) -> float:
        """The longest time after the disruption during which the bound count did not grow while pods waited."""
        longest, last_change, last_count = 0.0, self.disrupted_at, -1
        total = len(self.pods)
        for when, count in self.samples:
            if when < self.disrupted_at:
                last_count = count
                continue
            if count != last_count:
                longest = max(longest, when - last_change)
                last_change, last_count = when, count
            if count >= total:
                break
        return longest


def label_gang(prefix: str, *, policy: str | None = None) -> list[Json]:
    labels = {"pod-group.scheduling.sigs.k8s.io/name": prefix,
              "pod-group.scheduling.sigs.k8s.io/min-available": str(LABEL_GANG)}
    return hoss_pods(prefix, LABEL_GANG, cpu="100m", labels=labels, policy=policy)


async def create_podgroup(cluster: Cluster, namespace: str, name: str, min_member: int) -> None:
    custom: Any = client.CustomObjectsApi(cluster.api)
    body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"minMember": min_member}}
    await custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", body)


async def podgroup_scheduled(cluster: Cluster, namespace: str, name: str) -> tuple[bool, str]:
    """The PodGroup's status counts every member running (its extra member too: bound members count)."""
    custom: Any = client.CustomObjectsApi(cluster.api)
    group = await custom.get_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups",
                                                      name)
    status = group.get("status") or {}
    return status.get("phase") == "Running" and status.get("running") == PODGROUP_MEMBERS, str(status)


async def bound_count(cluster: Cluster, namespace: str) -> int:
    pods = await cluster.raw_list("list_namespaced_pod", namespace)
    return sum(1 for p in pods if p["spec"].get("nodeName"))


@asynccontextmanager
async def sampling(cluster: Cluster, namespace: str, run: Run) -> AsyncIterator[None]:
    """Record the bound count at every change of the namespace's pods while the block runs."""
    def sample(pods: Mapping[str, Json]) -> None:
        run.samples.append((time.monotonic(), sum(1 for pod in pods.values() if pod["spec"].get("nodeName"))))

    async with pods_watched(cluster, sample, namespace=namespace):
        yield


async def check_outcome(plane: LocalPlane, cluster: Cluster, namespace: str, run: Run, *,
                        unschedulable: Sequence[str] = ()) -> None:
    """Every schedulable pod bound, none twice, the ledger agrees, nothing oversold; print the stall."""
    pods = run.pods
    waiting = sorted(p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName"))
    assert waiting == sorted(unschedulable), f"pods left pending: {waiting[:10]}"
    live_nodes = await cluster.raw_list("list_node")
    assert oversold_nodes(live_nodes, pods) == {}
    events = await cluster.raw_list("list_namespaced_event", namespace, field_selector="reason=Scheduled")
    scheduled: dict[str, int] = {}
    for event in events:
        name = event["involvedObject"]["name"]
        scheduled[name] = scheduled.get(name, 0) + int(event.get("count") or 1)
    twice = {name: n for name, n in scheduled.items() if n > 1}
    assert twice == {}, f"pods scheduled more than once: {twice}"
    expected = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
    ledger = Ledger.from_url(plane.state().redis_url)
    try:
        async def ledger_agrees() -> tuple[bool, str]:
            entries = {e.uid: (e.node, e.state) for e in await ledger.entries() if e.uid in expected}
            wrong = [uid for uid, node in expected.items() if entries.get(uid) != (node, "bound")
                     and node in {n["metadata"]["name"] for n in live_nodes}]
            return not wrong, f"{len(wrong)} pods not bound in the ledger where the apiserver has them"

        await until(ledger_agrees, timeout=60, what="the ledger to agree with the apiserver")
    finally:
        await ledger.close()
    print(f"\nchaos {run.name}: scheduling stalled {run.stall_seconds():.1f}s at most; "
          f"{len(expected)} pods bound, {len(unschedulable)} unschedulable")


async def chaos_run(
    plane: LocalPlane, cluster: Cluster, namespace: str, name: str,
    disrupt: Callable[[Run, list[Process]], Awaitable[None]], *,
    extra_args: Sequence[str] = (), policy: str | None = None, extra_pods: Sequence[Json] = (),
    unschedulable: Sequence[str] = (), after: Callable[[Run, list[Process]], Awaitable[None]] | None = None,
) -> Run:
    """The common load around one disruption; returns the run (pods as the apiserver has them at the end)."""
    prefix = f"chaos{next(_runs)}"
    nodes = await cluster.create_nodes(NODES, prefix=prefix, capacity=NODE_CAPACITY)
    run = Run(name=name, nodes=nodes)
    layout = [(f"{prefix}-w{i}", [policy or "default"]) for i in (1, 2, 3)]
    args = [f"--heartbeat-ttl-seconds={HEARTBEAT_TTL_SECONDS}", "--reservation-ttl-seconds=10", *extra_args]
    try:
        await cluster.wait_nodes_ready(nodes)
        await create_podgroup(cluster, namespace, "train", PODGROUP_MIN)
        group = {"scheduling.x-k8s.io/pod-group": "train"}
        first = hoss_pods("a", WAVE, cpu="100m", policy=policy) + hoss_pods(
            "train", PODGROUP_MEMBERS, cpu="100m", labels=group, policy=policy) + list(extra_pods)
        second = hoss_pods("b", WAVE, cpu="100m", policy=policy) + label_gang("mpi", policy=policy)
        total = len(first) + len(second) - len(unschedulable)
        async with workers(plane, layout, extra_args=args) as started, sampling(cluster, namespace, run):
            await cluster.create_pods(first, namespace=namespace)

            async def under_way() -> tuple[bool, str]:
                done = await bound_count(cluster, namespace)
                return done >= 30, f"{done} bound"

            await until(under_way, timeout=90, what="the run to be under way")
            run.disrupted_at = time.monotonic()
            await disrupt(run, started)
            await cluster.create_pods(second, namespace=namespace)

            async def all_bound() -> tuple[bool, str]:
                done = await bound_count(cluster, namespace)
                return done >= total, f"{done}/{total} bound"

            await until(all_bound, timeout=240, what=f"{total} pods bound after {name}")
            run.pods = await cluster.raw_list("list_namespaced_pod", namespace)
            await check_outcome(plane, cluster, namespace, run, unschedulable=unschedulable)
            await until(lambda: podgroup_scheduled(cluster, namespace, "train"), timeout=30,
                        what="the PodGroup's status to count every member scheduled")
            if after is not None:
                await after(run, started)
        return run
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes(run.nodes)


def worker_status(process: Process) -> Json:
    with urllib.request.urlopen(f"http://127.0.0.1:{process.port}/status", timeout=5) as response:
        return dict(orjson.loads(response.read()))


async def stream_taken(plane: LocalPlane, worker_id: str) -> tuple[bool, str]:
    """Whether the dispatcher took the worker's stream away (it deletes it when it declares the worker dead)."""
    redis = Redis.from_url(plane.state().redis_url, decode_responses=True)
    try:
        queue = WorkQueue(redis)
        has_stream = await queue.has_group(worker_id)
        live, dead = await queue.workers()
    finally:
        await redis.aclose()
    state = "live" if worker_id in {w.id for w in live} else "not beating" if worker_id in dead else "forgotten"
    return not has_stream, f"stream {'there' if has_stream else 'gone'}, worker {state}"


async def live_workers(plane: LocalPlane) -> set[str]:
    redis = Redis.from_url(plane.state().redis_url, decode_responses=True)
    try:
        live, _dead = await WorkQueue(redis).workers()
    finally:
        await redis.aclose()
    return {w.id for w in live}


# --- the scenarios ---------------------------------------------------------------------------------------------


async def test_a_worker_paused_past_its_heartbeat_comes_back_registers_again_and_nothing_is_lost(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    async def pause(_run: Run, started: list[Process]) -> None:
        victim = started[0]
        victim_id = str((await asyncio.to_thread(worker_status, victim))["id"])
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            await until(lambda: stream_taken(plane, victim_id), timeout=60,
                        what="the dispatcher to declare the paused worker dead and take its stream away")
        finally:
            os.kill(victim.pid, signal.SIGCONT)

        async def back() -> tuple[bool, str]:
            status = await asyncio.to_thread(worker_status, victim)
            return status["requeues"] >= 1, f"requeues {status['requeues']}"

        await until(back, timeout=30, what="the resumed worker to find its queue gone and register again")

    async def took_part(run: Run, started: list[Process]) -> None:
        # The dispatcher packs a light load onto the busiest workers (--pack-depth), so whether the resumed worker
        # got part of the second wave depends on speed. To show it is back in the rotation, the other two stop
        # and a third wave must be bound, all of it by the resumed worker.
        victim, others = started[0], started[1:]
        plane.stop_processes([p.name for p in others])
        before = int((await asyncio.to_thread(worker_status, victim))["counters"].get("bound", 0))
        third = hoss_pods("c", 20, cpu="100m")
        await cluster.create_pods(third, namespace=namespace)

        async def all_bound() -> tuple[bool, str]:
            done = await bound_count(cluster, namespace)
            return done >= len(run.pods) + len(third), f"{done} bound"

        await until(all_bound, timeout=60, what="the resumed worker alone to bind a third wave")
        after = int((await asyncio.to_thread(worker_status, victim))["counters"].get("bound", 0))
        assert after - before == len(third), (before, after)

    await chaos_run(plane, cluster, namespace, "worker SIGSTOP past the heartbeat TTL, then SIGCONT", pause,
                    after=took_part)


async def test_flushall_mid_run_loses_no_pod(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    async def flush(_run: Run, _started: list[Process]) -> None:
        redis = Redis.from_url(plane.state().redis_url)
        try:
            await redis.flushall()
        finally:
            await redis.aclose()

    await chaos_run(plane, cluster, namespace, "FLUSHALL", flush)


@pytest.mark.chaos
async def test_a_worker_killed_mid_run_loses_no_pod(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    async def kill(_run: Run, started: list[Process]) -> None:
        os.kill(started[0].pid, signal.SIGKILL)

    await chaos_run(plane, cluster, namespace, "worker kill -9", kill)


@pytest.mark.chaos
async def test_redis_restarted_mid_run_loses_no_pod(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    async def restart(_run: Run, _started: list[Process]) -> None:
        await asyncio.to_thread(plane.restart_redis)

    await chaos_run(plane, cluster, namespace, "redis-server restarted", restart)


@pytest.mark.chaos
async def test_the_dispatcher_leader_killed_with_a_standby_running_loses_no_pod(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    standby = plane.start_dispatcher(name="hoss-dispatcher-standby")
    replicas = {"hoss-dispatcher": dispatcher, "hoss-dispatcher-standby": standby}
    killed: list[str] = []

    async def kill_leader(_run: Run, _started: list[Process]) -> None:
        holder = plane.kubectl("get", "lease", "hoss-dispatcher", "-n", "hoss-system",
                               "-o", "jsonpath={.spec.holderIdentity}").strip()
        leader = next(p for p in plane.state().processes if p.name == holder)
        os.kill(leader.pid, signal.SIGKILL)
        killed.append(holder)

    try:
        await chaos_run(plane, cluster, namespace, "dispatcher leader kill -9 (standby takes over)", kill_leader)
    finally:
        plane.stop_process(standby.name)
        if killed and killed[0] == "hoss-dispatcher":
            plane.stop_process("hoss-dispatcher")
            plane.start_dispatcher()  # the session's dispatcher, for the tests that follow
    assert killed and killed[0] in replicas


@pytest.mark.chaos
async def test_both_dispatchers_killed_and_restarted_mid_run_lose_no_pod(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    plane.start_dispatcher(name="hoss-dispatcher-standby")

    async def restart_both(_run: Run, _started: list[Process]) -> None:
        killed = []
        for name in ("hoss-dispatcher", "hoss-dispatcher-standby"):
            running = plane.running(name)
            assert running is not None, f"{name} must be running"
            os.kill(running.pid, signal.SIGKILL)
            killed.append(running)

        def both_dead() -> tuple[bool, str]:
            living = [p.name for p in killed if alive(p)]
            return not living, f"still running: {living}"

        await until(both_dead, timeout=30, what="both dispatchers to be dead at once")
        for name in ("hoss-dispatcher", "hoss-dispatcher-standby"):
            plane.stop_process(name)  # reap it and forget it
            await asyncio.to_thread(plane.start_dispatcher, name=name)

    try:
        await chaos_run(plane, cluster, namespace, "both dispatchers kill -9 and restarted", restart_both)
    finally:
        plane.stop_process("hoss-dispatcher-standby")
        if plane.running("hoss-dispatcher") is None:
            plane.start_dispatcher()  # the session's dispatcher, for the tests that follow


@pytest.mark.chaos
async def test_a_node_deleted_mid_run_gets_no_new_pod_and_no_pod_is_lost(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    gone: list[str] = []

    async def delete_node(run: Run, _started: list[Process]) -> None:
        gone.append(run.nodes[0])
        await cluster.delete_nodes(gone)

    run = await chaos_run(plane, cluster, namespace, "a node deleted", delete_node)
    late = [p["metadata"]["name"] for p in run.pods
            if p["metadata"]["name"].startswith(("b-", "mpi-")) and p["spec"].get("nodeName") in gone]
    assert late == [], "pods created after the node was deleted must not be bound to it"


BOOM_PLUGIN = '''
from typing import Any
import numpy as np
from hoss.framework.cycle import FilterResult


class Boom:
    """A filter with a bug: it raises on the pod named in its args."""

    name = "boom"

    def __init__(self, pod: str) -> None:
        self.pod = pod

    @classmethod
    def from_args(cls, args: Any) -> "Boom":
        return cls(str(args["pod"]))

    def filter(self, pod: Any, nodes: Any) -> FilterResult:
        if pod.name == self.pod:
            raise RuntimeError(f"boom on {pod.name}")
        return FilterResult(mask=np.ones(len(nodes), dtype=np.bool_))
'''


@pytest.mark.chaos
async def test_a_plugin_that_raises_on_one_pod_fails_only_that_pod_with_an_event(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = tmp_path / "site"
    (site / "hoss_boom_plugin").mkdir(parents=True)
    (site / "hoss_boom_plugin" / "__init__.py").write_text(BOOM_PLUGIN)
    install_dist_info(site, name="hoss-boom-plugin", version="0.1.0", entry_points={"boom": "hoss_boom_plugin:Boom"})
    monkeypatch.setenv("PYTHONPATH", str(site))  # what `pip install` would give the workers' interpreter
    config = yaml.safe_load(POLICIES_FILE.read_text())
    config["profiles"].append({"name": "buggy", "filters": [{"name": "NodeResourcesFit"},
                                                             {"name": "boom", "args": {"pod": "boom-0000"}}],
                               "scores": [{"name": "LeastAllocated", "weight": 1}]})
    policies = tmp_path / "policies.yaml"
    policies.write_text(yaml.safe_dump(config))

    async def nothing(_run: Run, _started: list[Process]) -> None:
        return None

    await chaos_run(plane, cluster, namespace, "a plugin raising on one pod", nothing,
                    extra_args=[f"--policies-file={policies}"], policy="buggy",
                    extra_pods=hoss_pods("boom", 1, cpu="100m", policy="buggy"), unschedulable=["boom-0000"])
    # (chaos_run deleted the pods; the events stay.)
    events = await cluster.raw_list("list_namespaced_event", namespace, field_selector="involvedObject.name=boom-0000")
    reasons = [(e["reason"], e["message"]) for e in events]
    assert any(reason == "FailedScheduling" and "RuntimeError: boom on boom-0000" in message
               for reason, message in reasons), reasons
