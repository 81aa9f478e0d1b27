"""Gangs with required inter-pod terms and DoNotSchedule spread under real concurrency on a real redis-server:
several clients, each planning gangs like a worker (`place_gang` over its own snapshot of the ledger, members
planned one after another on the pod index) and reserving each gang in one all-or-nothing `reserve_gang` call
with the snapshot's position. The ledger's domain rule must refuse a gang planned on a pod index that changed
in a domain it read, so anti-affinity and maxSkew hold across gangs, and no gang is ever partly reserved."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import numpy as np

from hoss.framework.cycle import Profile, Unschedulable
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import parse_pod
from hoss.framework.podindex import parse_placed
from hoss.framework.profiles import load_profiles
from hoss.ledger.arguments import GangMember
from hoss.ledger.client import Ledger
from hoss.ledger.results import Conflict, GangReserved
from hoss.model import compact
from tests.kube_objects import raw_node, raw_pod
from workers.arguments import inter_pod_keys
from workers.gang import place_gang

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
NODES = {f"n{i}": f"z{i % 3}" for i in range(9)}
ALLOC = {"cpu": 64000, "memory": 256 << 30, "pods": 110}
POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"


def profile() -> Profile:
    profiles, default = load_profiles(POLICIES)
    return profiles[default]


def solo(uid: str) -> dict[str, object]:
    """A member anti-affine to every 'solo' pod on its node (of any gang)."""
    raw = raw_pod(uid, labels={"app": "solo"})
    raw["metadata"]["uid"] = uid
    raw["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "solo"}}, "topologyKey": HOST}]}}
    return raw


def spread(uid: str) -> dict[str, object]:
    """A member spread over zones with maxSkew 1 (DoNotSchedule) against every 'web' pod."""
    raw = raw_pod(uid, labels={"app": "web"})
    raw["metadata"]["uid"] = uid
    raw["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": ZONE,
                                                 "whenUnsatisfiable": "DoNotSchedule",
                                                 "labelSelector": {"matchLabels": {"app": "web"}}}]
    return raw


async def client(ledger: Ledger, gangs: list[list[dict[str, object]]], seed: int, *, check: bool = True
                 ) -> tuple[int, int]:
    """Plan and reserve each gang until it is reserved or does not fit; returns (conflicts, gangs reserved)."""
    rng, conflicts, reserved = random.Random(seed), 0, 0
    chosen_profile = profile()
    for raws in gangs:
        views = [parse_pod(raw) for raw in raws]
        while True:
            snapshot = await ledger.load()
            table = NodeTable()
            for name, zone in NODES.items():
                table.upsert_node(raw_node(name, labels={ZONE: zone, HOST: name}))
            for placed_uid, node, placed_meta in snapshot.pods:
                table.place_pod(parse_placed(placed_uid, node, placed_meta))
            plan = place_gang(chosen_profile, views, table, rng=np.random.default_rng(rng.randrange(1 << 30)),
                              min_available=len(views), topology_key=None, gang=f"g{seed}")
            assert not table.pods.keys() - {uid for uid, _n, _m in snapshot.pods}, "the plan left the index as it was"
            if isinstance(plan, Unschedulable):
                break
            await asyncio.sleep(rng.random() / 200)  # let the others move between the plan and the reservation
            members = []
            for view, raw in zip(views, raws, strict=True):
                ports, meta = compact.pod_meta(raw)
                members.append(GangMember(uid=view.uid, pod=view.key, node=plan.assignments[view.uid],
                                                   request={"cpu": 10}, ports=ports, meta=meta))
            result = await ledger.reserve_gang(
                members=members, owner=f"w{seed}", ttl_seconds=300,
                position=snapshot.last_change if check else "", inter_pod_keys=[inter_pod_keys(v) for v in views])
            if isinstance(result, GangReserved):
                reserved += 1
                break
            assert isinstance(result, Conflict), result
            conflicts += 1
    return conflicts, reserved


async def placed(ledger: Ledger) -> dict[str, str]:
    return {uid: node for uid, node, _meta in (await ledger.load()).pods}


async def test_racing_gangs_of_anti_affine_members_never_share_a_node_and_are_all_or_nothing(ledger: Ledger) -> None:
    await ledger.rebuild(nodes=[(name, ALLOC, {ZONE: zone, HOST: name}, "") for name, zone in NODES.items()],
                         bound=[])
    # 4 clients x 2 gangs x 2 members = 16 members wanting one node each of 9: at most 4 gangs fit.
    gangs = [[[solo(f"c{c}-g{g}-m{m}") for m in range(2)] for g in range(2)] for c in range(4)]
    outcomes = await asyncio.gather(*(client(ledger, gangs[c], c) for c in range(4)))
    where = await placed(ledger)
    per_node = Counter(where.values())
    assert max(per_node.values()) == 1, per_node
    reserved = sum(r for _c, r in outcomes)
    assert reserved == 4 and len(where) == 8, (reserved, where)
    for c in range(4):
        for g in range(2):
            members = {f"c{c}-g{g}-m{m}" for m in range(2)}
            assert len(members & where.keys()) in (0, 2), "a gang is reserved whole or not at all"
    assert sum(c for c, _r in outcomes) > 0, "the clients never raced: the test did not exercise the rule"


async def test_racing_gangs_spread_over_zones_keep_max_skew_at_every_step(ledger: Ledger) -> None:
    await ledger.rebuild(nodes=[(name, ALLOC, {ZONE: zone, HOST: name}, "") for name, zone in NODES.items()],
                         bound=[])
    gangs = [[[spread(f"c{c}-g{g}-m{m}") for m in range(2)] for g in range(3)] for c in range(4)]
    outcomes = await asyncio.gather(*(client(ledger, gangs[c], c) for c in range(4)))
    assert sum(r for _c, r in outcomes) == 12
    # Replay the entries in the order the ledger accepted them: after each whole gang, skew <= 1; within one
    # gang the members were planned together on the same index, so a gang of 2 may briefly reach 2 mid-call.
    counts = Counter({zone: 0 for zone in set(NODES.values())})
    accepted = [value.split("\n", 1)[0] for change in await ledger.changes("0-0", count=10_000)
                for field, value in change.items if field.startswith("p:")]
    assert len(accepted) == 24
    for position in range(0, 24, 2):
        for node in accepted[position:position + 2]:
            counts[NODES[node]] += 1
        assert max(counts.values()) - min(counts.values()) <= 1, (accepted, counts)
    assert sorted(counts.values()) == [8, 8, 8]
    assert sum(c for c, _r in outcomes) > 0, "the clients never raced: the test did not exercise the rule"
