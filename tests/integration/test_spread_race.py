"""Topology spread under real concurrency on a real redis-server: several clients, each deciding like a worker
from its own snapshot of the ledger (PodTopologySpread over the pod index at some change-stream position),
reserve spread pods at once; the ledger's domain rule must keep every placement within maxSkew of the state it
lands in, so the zones end balanced."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import numpy as np

from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.topology import PodTopologySpread
from hoss.framework.pod import parse_pod
from hoss.framework.podindex import parse_placed
from hoss.ledger.arguments import BatchPod
from hoss.ledger.client import Ledger
from hoss.ledger.results import Conflict, Reserved
from hoss.model import compact
from tests.kube_objects import raw_node, raw_pod

ZONE = "topology.kubernetes.io/zone"
NODES = {f"n{i}": f"z{i % 3}" for i in range(9)}
ALLOC = {"cpu": 64000, "memory": 256 << 30, "pods": 110}
SPREAD = [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
           "labelSelector": {"matchLabels": {"app": "web"}}}]


def spread_raw(uid: str) -> dict[str, object]:
    raw = raw_pod(uid, labels={"app": "web"})
    raw["metadata"]["uid"] = uid
    raw["spec"]["topologySpreadConstraints"] = SPREAD
    return raw


async def worker(ledger: Ledger, uids: list[str], seed: int, log: list[tuple[str, str]]) -> int:
    """Place every uid: decide from a fresh snapshot, reserve with the snapshot's position; returns conflicts."""
    rng, conflicts = random.Random(seed), 0
    plugin = PodTopologySpread()
    for uid in uids:
        raw = spread_raw(uid)
        pod = parse_pod(raw)
        _ports, meta = compact.pod_meta(raw)
        while True:
            snapshot = await ledger.load()
            table = NodeTable()
            for name, zone in NODES.items():
                table.upsert_node(raw_node(name, labels={ZONE: zone}))
            for placed_uid, node, placed_meta in snapshot.pods:
                table.place_pod(parse_placed(placed_uid, node, placed_meta))
            feasible = np.flatnonzero(plugin.filter(pod, table).mask)
            node = table.names[rng.choice(list(feasible))]
            await asyncio.sleep(rng.random() / 200)  # let the others move between decision and reservation
            [result] = await ledger.reserve_batch(  # type: ignore[misc]
                [BatchPod(uid=uid, pod=f"team/{uid}", digest="", candidates=[node], request={"cpu": 10}, meta=meta,
                          inter_pod_keys=ZONE, position=snapshot.last_change, tentative=True)],
                owner=f"w{seed}", ttl_seconds=300)
            if result == Reserved(node):
                log.append((uid, NODES[node]))
                break
            assert isinstance(result, Conflict), result
            conflicts += 1
    return conflicts


async def test_four_racing_clients_keep_every_spread_placement_within_max_skew(ledger: Ledger) -> None:
    await ledger.rebuild(nodes=[(name, ALLOC, {ZONE: zone}, "") for name, zone in NODES.items()], bound=[])
    log: list[tuple[str, str]] = []
    conflicts = await asyncio.gather(*(worker(ledger, [f"p{w}-{i}" for i in range(9)], w, log) for w in range(4)))
    # Replay the placements in the order the ledger accepted them (its change stream): each kept skew <= 1.
    counts = Counter({zone: 0 for zone in set(NODES.values())})
    accepted = [value.split("\n", 1)[0] for change in await ledger.changes("0-0", count=10_000)
                for field, value in change.items if field.startswith("p:")]
    assert len(accepted) == len(log) == 36
    for node in accepted:
        counts[NODES[node]] += 1
        assert max(counts.values()) - min(counts.values()) <= 1, (accepted, counts)
    assert sum(counts.values()) == 36 and sorted(counts.values()) == [12, 12, 12]
    assert sum(conflicts) > 0, "the clients never raced: the test did not exercise the rule"
