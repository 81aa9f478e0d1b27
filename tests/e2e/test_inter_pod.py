"""Required inter-pod affinity on the real plane with four workers racing: anti-affinity keeps one pod per domain
however the workers interleave, affinity follows the pod it names; each test ends with the oversell check."""

from __future__ import annotations

import itertools
from collections import Counter

from dev.local.cluster import Cluster, oversold_nodes
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.model.objects import Json
from tests.e2e.hoss import NODE_CAPACITY, hoss_pods, node_set, pinned, scheduled_condition, wait_all_bound, workers
from tests.waiting import until

FOUR = [(f"ipa-{i}", ["default"]) for i in range(4)]
HOST = "kubernetes.io/hostname"
_sets = itertools.count()


def anti_affine(pods: list[Json], app: str) -> list[Json]:
    for pod in pods:
        pod["metadata"].setdefault("labels", {})["app"] = app
        pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOST}]}}
    return pods


async def test_40_anti_affine_pods_and_20_nodes_in_one_burst_end_one_per_node_and_20_pending(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    names = await cluster.create_nodes(20, prefix=f"ipa{next(_sets)}", capacity=NODE_CAPACITY,
                                       labels={"spec-set": "anti-race"})
    try:
        async with workers(plane, FOUR):
            await cluster.create_pods(anti_affine(pinned(hoss_pods("solo", 40), "spec-set", "anti-race"), "solo"),
                                      namespace=namespace)
            await wait_all_bound(cluster, namespace, 20, timeout=180)

            async def twenty_refused() -> tuple[bool, str]:
                pods = await cluster.raw_list("list_namespaced_pod", namespace)
                waiting = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
                messages = [(await scheduled_condition(cluster, namespace, name))[1] for name in waiting]
                ok = len(waiting) == 20 and all(
                    "20 node(s) didn't match pod anti-affinity rules" in m for m in messages)
                return ok, f"{len(waiting)} waiting, e.g. {messages[:1]}"

            await until(twenty_refused, timeout=90, what="the 20 left over to give kube-scheduler's reason")
            pods = await cluster.raw_list("list_namespaced_pod", namespace)
            per_node = Counter(p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName"))
            assert per_node == dict.fromkeys(names, 1), per_node
            assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}
    finally:
        await cluster.delete_nodes(names)


async def test_followers_join_the_node_of_the_pod_they_are_affine_to_and_others_keep_off_it(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    async with node_set(cluster, 5, labels={"spec-set": "follow"}), workers(plane, FOUR):
        [db] = pinned(hoss_pods("db", 1, labels={"app": "db"}), "spec-set", "follow")
        db["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "noisy"}}, "topologyKey": HOST}]}}
        await cluster.create_pods([db], namespace=namespace)
        [placed] = [p for p in await wait_all_bound(cluster, namespace, 1) if p["spec"].get("nodeName")]
        db_node = placed["spec"]["nodeName"]
        followers = pinned(hoss_pods("follower", 6), "spec-set", "follow")
        for pod in followers:
            pod["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST}]}}
        noisy = pinned(hoss_pods("noisy", 6, labels={"app": "noisy"}), "spec-set", "follow")
        orphans = pinned(hoss_pods("orphan", 1), "spec-set", "follow")
        orphans[0]["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "nobody"}}, "topologyKey": HOST}]}}
        await cluster.create_pods([*followers, *noisy, *orphans], namespace=namespace)
        pods = await wait_all_bound(cluster, namespace, 13)
        where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
        assert {where[f"follower-{i:04d}"] for i in range(6)} == {db_node}, where
        assert db_node not in {where[f"noisy-{i:04d}"] for i in range(6)}, "the db pod's anti-affinity holds"

        async def orphan_refused() -> tuple[bool, str]:
            reason, message = await scheduled_condition(cluster, namespace, "orphan-0000")
            return "node(s) didn't match pod affinity rules" in message, f"{reason}: {message}"

        await until(orphan_refused, timeout=60, what="a pod affine to no pod to say why it waits")
        assert oversold_nodes(await cluster.raw_list("list_node"), pods) == {}


async def test_kube_scheduler_and_hoss_given_the_same_pods_satisfy_the_same_constraints(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    """The same pod specs (anti-affinity on the hostname, a host port, affinity to a leader), once for
    kube-scheduler and once for hoss, on the same ten nodes: both end with the same counts and reasons."""
    async with node_set(cluster, 10, labels={"spec-set": "compare"}), workers(plane, FOUR):
        outcomes = {}
        for scheduler, prefix in (("default-scheduler", "k"), ("hoss", "h")):
            pods = anti_affine(pinned(hoss_pods(f"{prefix}solo", 14), "spec-set", "compare"), f"{prefix}solo")
            for pod in pods:
                pod["spec"]["schedulerName"] = scheduler
                pod["spec"]["containers"][0]["ports"] = [{"containerPort": 7000 + ord(prefix),
                                                          "hostPort": 7000 + ord(prefix)}]
            await cluster.create_pods(pods, namespace=namespace)

            async def settled(prefix: str = prefix) -> tuple[bool, str]:
                mine = [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
                        if p["metadata"]["name"].startswith(f"{prefix}solo")]
                bound = [p for p in mine if p["spec"].get("nodeName")]
                waiting = [p["metadata"]["name"] for p in mine if not p["spec"].get("nodeName")]
                reasons = [(await scheduled_condition(cluster, namespace, name))[1] for name in waiting]
                return len(bound) == 10 and all(reasons) and len(reasons) == 4, f"{len(bound)} bound, {reasons[:1]}"

            await until(settled, timeout=120, what=f"{scheduler} to settle its 14 pods")
            mine = [p for p in await cluster.raw_list("list_namespaced_pod", namespace)
                    if p["metadata"]["name"].startswith(f"{prefix}solo")]
            per_node = Counter(p["spec"]["nodeName"] for p in mine if p["spec"].get("nodeName"))
            waiting = [p["metadata"]["name"] for p in mine if not p["spec"].get("nodeName")]
            reasons = {(await scheduled_condition(cluster, namespace, name))[1] for name in waiting}
            outcomes[scheduler] = (sorted(per_node.values()), len(waiting),
                                   # NodePorts runs before InterPodAffinity in both, and each node is reported
                                   # under the first filter that rejects it
                                   all("10 node(s) didn't have free ports for the requested pod ports" in r
                                       for r in reasons))
        assert outcomes["hoss"] == outcomes["default-scheduler"] == ([1] * 10, 4, True), outcomes
        assert oversold_nodes(await cluster.raw_list("list_node"),
                              await cluster.raw_list("list_namespaced_pod", namespace)) == {}


async def test_a_namespace_selector_follows_pods_in_the_namespaces_it_selects_and_namespace_labels_requeue(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str
) -> None:
    other = f"{namespace[:50]}-sel"
    await cluster.ensure_namespace(other)
    plane.kubectl("label", "namespace", namespace, f"e2e-db={namespace[:60]}")
    try:
        async with node_set(cluster, 4, labels={"spec-set": "ns-select"}), workers(plane, FOUR):
            [db] = pinned(hoss_pods("db", 1, labels={"app": "db"}), "spec-set", "ns-select")
            await cluster.create_pods([db], namespace=namespace)
            [placed] = [p for p in await wait_all_bound(cluster, namespace, 1) if p["spec"].get("nodeName")]

            def follower(name: str, selector: dict[str, str]) -> Json:
                [pod] = pinned(hoss_pods(name, 1), "spec-set", "ns-select")
                pod["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST,
                     "namespaceSelector": {"matchLabels": selector}}]}}
                return pod

            # selects the db's namespace by its label: follows the db from another namespace
            # selects a label no namespace has yet: waits, until the db's namespace gets it
            await cluster.create_pods([follower("now", {"e2e-db": namespace[:60]}),
                                       follower("later", {"e2e-later": "yes"})], namespace=other)
            pods = await wait_all_bound(cluster, other, 1)
            where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
            assert where == {"now-0000": placed["spec"]["nodeName"], "later-0000": None}, where

            async def later_refused() -> tuple[bool, str]:
                reason, message = await scheduled_condition(cluster, other, "later-0000")
                return "node(s) didn't match pod affinity rules" in message, f"{reason}: {message}"

            await until(later_refused, timeout=60, what="the unmatched follower to give kube-scheduler's reason")
            plane.kubectl("label", "namespace", namespace, "e2e-later=yes")
            pods = await wait_all_bound(cluster, other, 2, timeout=60)
            assert {p["spec"]["nodeName"] for p in pods} == {placed["spec"]["nodeName"]}
    finally:
        await cluster.delete_pods(other)
        plane.kubectl("delete", "namespace", other, "--wait=false", "--ignore-not-found")
