"""Topology spread and preferred inter-pod affinity on the real plane with four workers: a burst of spread pods
ends balanced however the workers interleave, ScheduleAnyway and preferred anti-affinity visibly move pods, and
kube-scheduler and hoss given the same pods satisfy the same constraints. Each test ends with the oversell check
and checks that no schedulable pod was left Pending."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import NODE_CAPACITY, hoss_pods, pinned, scheduled_condition, wait_all_bound, workers
from tests.waiting import until

FOUR = [(f"tsc-{i}", ["default", "binpack"]) for i in range(4)]
HOST = "kubernetes.io/hostname"
_sets = itertools.count()


@asynccontextmanager
async def zones(cluster: Cluster, per_zone: int, count: int = 3) -> AsyncIterator[tuple[str, str, dict[str, str]]]:
    """`count` zones of `per_zone` nodes under a zone key of this test's own, all labelled spec-set=<set>:
    yields (zone key, set, node -> zone)."""
    number = next(_sets)
    key, tag = f"test.hoss.io/zone-{number}", f"tsc-{number}"
    where: dict[str, str] = {}
    try:
        for zone in range(count):
            names = await cluster.create_nodes(per_zone, prefix=f"tsc{number}z{zone}", capacity=NODE_CAPACITY,
                                               labels={"spec-set": tag, key: f"z{zone}"})
            where.update(dict.fromkeys(names, f"z{zone}"))
        await cluster.wait_nodes_ready(list(where))
        yield key, tag, where
    finally:
        await cluster.delete_nodes(list(where))


def spread(pods: list[Json], app: str, key: str, *, hard: bool = True, **extra: object) -> list[Json]:
    for pod in pods:
        pod["metadata"].setdefault("labels", {})["app"] = app
        pod["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": app}}, **extra}]
    return pods


def preferred_anti(pods: list[Json], app: str, key: str = HOST) -> list[Json]:
    for pod in pods:
        pod["metadata"].setdefault("labels", {})["app"] = app
        pod["spec"]["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}}]}}
    return pods


async def named(cluster: Cluster, namespace: str, prefix: str) -> list[Json]:
    return [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
            if p["metadata"]["name"].startswith(prefix)]


async def end_checks(cluster: Cluster, namespace: str, *, pending: int = 0) -> list[Json]:
    """The independent oversell check, and exactly `pending` pods left Pending (the unschedulable ones)."""
    pods = await cluster.raw_list("list_namespaced_pod", namespace)
    assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}
    waiting = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
    assert len(waiting) == pending, waiting
    return pods


async def test_30_spread_pods_in_one_burst_over_3_zones_end_balanced(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    async with zones(cluster, 3) as (key, tag, where), workers(plane, FOUR):
        await cluster.create_pods(spread(pinned(hoss_pods("burst", 30), "spec-set", tag), "burst", key),
                                  namespace=namespace)
        pods = await wait_all_bound(cluster, namespace, 30, timeout=240)
        per_zone = Counter(where[p["spec"]["nodeName"]] for p in pods)
        assert sum(per_zone.values()) == 30 and max(per_zone.values()) - min(per_zone.values()) <= 1, per_zone
        await end_checks(cluster, namespace)


async def test_schedule_anyway_sends_a_pod_to_the_emptier_zone_against_least_allocated(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    async with zones(cluster, 2, count=2) as (key, tag, where), workers(plane, FOUR):
        # z0 holds 4 small matching pods; z1 two large pods that do not match: LeastAllocated prefers z0.
        await cluster.create_pods(pinned(hoss_pods("small", 4, cpu="100m", labels={"app": "web"}), key, "z0"),
                                  namespace=namespace)
        await wait_all_bound(cluster, namespace, 4)
        for i in range(2):  # one after the other, so LeastAllocated puts one on each z1 node
            await cluster.create_pods(pinned(hoss_pods(f"large{i}", 1, cpu="3"), key, "z1"), namespace=namespace)
            await wait_all_bound(cluster, namespace, 5 + i)
        pods = await cluster.raw_list("list_namespaced_pod", namespace)
        assert len({p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith("large")}) == 2
        [soft] = spread(pinned(hoss_pods("soft", 1, cpu="100m"), "spec-set", tag), "web", key, hard=False)
        [plain] = pinned(hoss_pods("plain", 1, cpu="100m", labels={"app": "web"}), "spec-set", tag)
        await cluster.create_pods([soft, plain], namespace=namespace)
        pods = await wait_all_bound(cluster, namespace, 8)
        node = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
        assert where[node["soft-0000"]] == "z1", "ScheduleAnyway outweighs LeastAllocated"
        assert where[node["plain-0000"]] == "z0", "without the constraint LeastAllocated decides"
        await end_checks(cluster, namespace)


async def test_preferred_anti_affinity_spreads_binpack_pods_that_would_otherwise_share_a_node(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    async with zones(cluster, 4, count=1) as (_key, tag, where), workers(plane, FOUR):
        for i in range(4):
            [pod] = preferred_anti(pinned(hoss_pods(f"apart{i}", 1, policy="binpack"), "spec-set", tag), "apart")
            await cluster.create_pods([pod], namespace=namespace)
            await wait_all_bound(cluster, namespace, i + 1)
        for i in range(2):
            await cluster.create_pods(pinned(hoss_pods(f"packed{i}", 1, policy="binpack"), "spec-set", tag),
                                      namespace=namespace)
            await wait_all_bound(cluster, namespace, 5 + i)
        # The same binpack pods made by a ReplicaSet get kube-scheduler's cluster-default constraints (System
        # defaulting: ScheduleAnyway on the hostname, maxSkew 3, selector from the ReplicaSet): spread, not packed.
        # Scaled one replica at a time: a score is not re-checked by the ledger, so replicas decided at the same
        # moment by racing workers may share a node (as two kube-schedulers would).
        [template] = pinned(hoss_pods("rs", 1, policy="binpack"), "spec-set", tag)
        manifest = plane.directory / f"{namespace}-spread-rs.json"
        manifest.write_text(json.dumps({
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "spread-rs"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "spread-rs"}},
                     "template": {"metadata": {"labels": {**template["metadata"].get("labels", {}),
                                                          "app": "spread-rs"}},
                                  "spec": template["spec"]}}}))
        plane.kubectl("apply", "-n", namespace, "-f", str(manifest))
        await wait_all_bound(cluster, namespace, 7)
        for scale in (2, 3, 4):
            plane.kubectl("scale", "replicaset", "spread-rs", "-n", namespace, f"--replicas={scale}")
            await wait_all_bound(cluster, namespace, 6 + scale)
        pods = await end_checks(cluster, namespace)
        apart = {p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith("apart")}
        packed = {p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith("packed")}
        replicas = Counter(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith("spread-rs"))
        assert len(apart) == 4 and apart <= set(where), apart
        assert len(packed) == 1, f"binpack without the term packs: {packed}"
        assert sorted(replicas.values()) == [1, 1, 1, 1], f"the default constraints spread them: {replicas}"
        plane.kubectl("delete", "replicaset", "spread-rs", "-n", namespace, "--wait=false")


async def test_kube_scheduler_and_hoss_given_the_same_spread_pods_satisfy_the_same_constraints(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """The same pod specs (spread over zones with maxSkew 1 and preferred anti-affinity on the hostname; then
    minDomains 4 over 3 zones, which admits one pod per zone), once for kube-scheduler and once for hoss."""
    async with zones(cluster, 2) as (key, tag, where), workers(plane, FOUR):
        outcomes = {}
        for scheduler, prefix in (("default-scheduler", "k"), ("hoss", "h")):
            balanced = preferred_anti(pinned(hoss_pods(f"{prefix}bal", 12), "spec-set", tag), f"{prefix}bal")
            spread(balanced, f"{prefix}bal", key)
            capped = spread(pinned(hoss_pods(f"{prefix}cap", 8), "spec-set", tag), f"{prefix}cap", key,
                            minDomains=4)
            for pod in (*balanced, *capped):
                pod["spec"]["schedulerName"] = scheduler
            await cluster.create_pods([*balanced, *capped], namespace=namespace)

            async def settled(prefix: str = prefix) -> tuple[bool, str]:
                mine = await named(cluster, namespace, prefix)
                waiting = [p["metadata"]["name"] for p in mine if not p["spec"].get("nodeName")]
                reasons = [(await scheduled_condition(cluster, namespace, name))[1] for name in waiting]
                return (len(mine) - len(waiting) == 15 and len(reasons) == 5 and all(reasons),
                        f"{len(mine) - len(waiting)} bound, {reasons[:1]}")

            await until(settled, timeout=180, what=f"{scheduler} to settle its 20 pods")
            mine = await named(cluster, namespace, prefix)
            zones_of = {group: Counter(where[p["spec"]["nodeName"]] for p in mine
                                       if p["metadata"]["name"].startswith(f"{prefix}{group}")
                                       and p["spec"].get("nodeName"))
                        for group in ("bal", "cap")}
            waiting = [p["metadata"]["name"] for p in mine if not p["spec"].get("nodeName")]
            reasons = {(await scheduled_condition(cluster, namespace, name))[1] for name in waiting}
            outcomes[scheduler] = (
                sorted(zones_of["bal"].values()), sorted(zones_of["cap"].values()),
                all(name.startswith(f"{prefix}cap") for name in waiting),
                all("6 node(s) didn't match pod topology spread constraints" in r for r in reasons))
        assert outcomes["hoss"] == outcomes["default-scheduler"] == (
            [4, 4, 4], [1, 1, 1], True, True), outcomes
        await end_checks(cluster, namespace, pending=10)

