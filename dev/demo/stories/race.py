"""Story 5, a foreign scheduler: kube-scheduler and hoss aim at the same few small nodes at once, and the resolver
denies whichever binding would oversell a node.

A round creates one-core pods for both schedulers together, interleaved, twice as many as the nodes have cores, so
that both bind into the same room in the same instant. A binding loses when the ledger already holds the room for
the other scheduler's pod: kube-scheduler's cache does not see a pod hoss reserved until that pod is bound, so
kube-scheduler is the usual loser. When one scheduler takes all the room before the other binds anything, nothing
conflicts and nothing is denied: the story runs another round on the emptied nodes, up to RACE_ROUNDS, and the
report says plainly when no round had a denial.

Denials are counted by the apiserver (`observe.webhook_denials`), over the round and until the count holds still (a
denied scheduler tries again after a back-off); the example is one the resolver itself recorded for a pod of the
story, never a message made up or taken from an earlier run.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dev.demo.observe import (
    bound,
    dispatcher_status,
    list_pods,
    resolver_denials,
    settled_webhook_denials,
    webhook_denials,
)
from dev.demo.stage import RACE_NAMESPACE, RACE_NODE_CPU, RACE_NODES, STORY_KEY, STORY_TIMEOUT_SECONDS, story_pod
from dev.local.cluster import Cluster, WaitTimeout, oversold_nodes, wait_until
from dev.local.credentials import HOSS_NAMESPACE
from dev.local.plane import LocalPlane
from hoss.model.objects import Json

RACE_ROUNDS = 3
BY_LABEL = "demo.hoss.io/by"
KUBE_SCHEDULER = "kube-scheduler"
HOSS = "hoss"


@dataclass
class RaceStory:
    nodes: int
    cpu_capacity: int
    """Cores over the story's nodes; every pod requests one core, so this is also the most pods that fit."""
    hoss_pods: int
    """hoss's pods in each round."""
    kube_pods: int
    """kube-scheduler's pods in each round."""
    rounds: int
    """Rounds run: the story stops after the first with a denial, or after RACE_ROUNDS."""
    hoss_bound: int
    """hoss's pods bound in the last round."""
    kube_bound: int
    """kube-scheduler's pods bound in the last round."""
    denials: int
    """Bindings the webhook denied during the story, as the apiserver counted them."""
    denied_by: dict[str, int] = field(default_factory=dict)
    """Whose bindings were denied (kube-scheduler, hoss), from the resolver's records of the story's pods; empty when
    those records do not cover every denial counted."""
    denial_example: str = ""
    """One denial the resolver recorded for a pod of the story: who posted the binding, the pod, the node and the
    message the poster got; empty when the story had no denial."""
    oversold_nodes: int = 0
    """The most nodes oversold at the end of any round (from the apiserver)."""


def poster(username: str) -> str:
    """Who posted a binding, by the apiserver user the resolver saw."""
    if username == "system:kube-scheduler":
        return KUBE_SCHEDULER
    if username.startswith(f"system:serviceaccount:{HOSS_NAMESPACE}:"):
        return HOSS
    return username


def story_denials(records: Sequence[Json], *, since: float) -> list[Json]:
    """The resolver's denial records for the story's pods, made at or after ``since`` (unix time)."""
    return [r for r in records
            if str(r.get("pod", "")).startswith(f"{RACE_NAMESPACE}/") and float(r.get("at") or 0) >= since]


def denial_example(records: Sequence[Json]) -> str:
    """One of ``records`` in words, kube-scheduler's first (the foreign scheduler is the story's subject); ''
    when there is none."""
    if not records:
        return ""
    record = min(records, key=lambda r: poster(str(r.get("username", ""))) != KUBE_SCHEDULER)
    return (f"{poster(str(record.get('username', '')))}'s binding of {record.get('pod')} to {record.get('node')} was "
            f"denied: {record.get('message')}")


def race_pods(per_scheduler: int, round_: int) -> list[Json]:
    """One-core pods for kube-scheduler and for hoss, interleaved, so both schedulers get theirs at once."""
    pods: list[Json] = []
    for i in range(per_scheduler):
        pods.append(story_pod(f"kube-r{round_}-{i:03d}", "race", requests={"cpu": "1", "memory": "1Gi"},
                              scheduler_name="default-scheduler", labels={BY_LABEL: KUBE_SCHEDULER}))
        pods.append(story_pod(f"hoss-r{round_}-{i:03d}", "race", requests={"cpu": "1", "memory": "1Gi"},
                              labels={BY_LABEL: HOSS}))
    return pods


async def _emptied(cluster: Cluster, plane: LocalPlane, nodes: Sequence[str]) -> None:
    """Delete the round's pods and wait until the apiserver lists none and the ledger holds nothing on the story's
    nodes, so that the next round starts on empty room for both schedulers."""
    await cluster.delete_pods(RACE_NAMESPACE)
    wanted = set(nodes)

    async def empty() -> tuple[bool, str]:
        left = len(await list_pods(cluster, RACE_NAMESPACE))
        held = sum(int(n.get("bound", 0)) + int(n.get("assumed", 0))
                   for n in (await dispatcher_status(plane)).get("nodes") or [] if n.get("name") in wanted)
        return left == 0 and held == 0, f"{left} pods listed, {held} held in the ledger"

    await wait_until(empty, timeout=STORY_TIMEOUT_SECONDS, what="the race nodes to be empty again")


async def race_story(cluster: Cluster, plane: LocalPlane, progress: Callable[[str], None]) -> RaceStory:
    capacity = RACE_NODES * RACE_NODE_CPU
    per_scheduler = capacity
    nodes = await cluster.raw_list("list_node", label_selector=f"{STORY_KEY}=race")
    node_names = [n["metadata"]["name"] for n in nodes]
    started = time.time()
    denials = rounds = oversold = 0
    by: Counter[str] = Counter()
    while rounds < RACE_ROUNDS and denials == 0:
        rounds += 1
        if rounds > 1:
            progress(f"foreign scheduler: round {rounds - 1} had no conflicting binding (one scheduler took all the "
                     "room before the other bound); emptying the nodes for another round")
            await _emptied(cluster, plane, node_names)
        progress(f"foreign scheduler: round {rounds}: {per_scheduler} pods for kube-scheduler and {per_scheduler} "
                 f"for hoss, one core each, created together for {RACE_NODES} nodes with {capacity} cores in all")
        before = await webhook_denials(plane)
        await cluster.create_pods(race_pods(per_scheduler, rounds), namespace=RACE_NAMESPACE)

        async def full() -> tuple[bool, str]:
            taken = len(bound(await list_pods(cluster, RACE_NAMESPACE)))
            return taken >= capacity, f"{taken}/{capacity} cores taken"

        try:
            await wait_until(full, timeout=STORY_TIMEOUT_SECONDS, what="the race nodes to fill")
        except WaitTimeout as error:
            progress(f"foreign scheduler: {error}")
        denials += await settled_webhook_denials(plane) - before
        listed = await list_pods(cluster, RACE_NAMESPACE)
        by = Counter(p["metadata"]["labels"][BY_LABEL] for p in bound(listed))
        oversold = max(oversold, len(oversold_nodes(nodes, listed)))
    records = story_denials(await resolver_denials(plane), since=started) if denials else []
    return RaceStory(
        nodes=RACE_NODES, cpu_capacity=capacity, hoss_pods=per_scheduler, kube_pods=per_scheduler, rounds=rounds,
        hoss_bound=by[HOSS], kube_bound=by[KUBE_SCHEDULER], denials=denials,
        denied_by=dict(Counter(poster(str(r.get("username", ""))) for r in records)) if len(records) == denials
        else {},
        denial_example=denial_example(records), oversold_nodes=oversold,
    )
