"""The rescheduler's planner on hand-worked cases (rescheduler/plan.py)."""

from __future__ import annotations

import orjson

from hoss.framework.feed import NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.ledger.results import Change
from rescheduler.plan import GPU, Node, Pod, fragmentation, plan_defragment, plan_for_pending


def node(name: str, used: int, gpus: int = 8, held: int = 0) -> Node:
    return Node(name=name, alloc={GPU: gpus, "cpu": 96_000}, used={GPU: used, "cpu": 1000 * used},
                held={GPU: held} if held else {})


def pod(key: str, gpus: int, where: str = "", **extra: object) -> Pod:
    return Pod(key=f"ns/{key}", uid=f"uid-{key}", node=where, request={GPU: gpus, "cpu": 1000 * gpus},
               owner=f"rs-{key}", **extra)  # type: ignore[arg-type]


def moved(plan: object) -> list[tuple[str, str, str]]:
    return [(m.pod.key, m.source, m.target) for m in plan.moves]  # type: ignore[attr-defined]


def test_issue_example_moves_b_so_c_joins_a() -> None:
    # node1 runs A (4) and B (3) of 8, node2 is empty, C asks for 4. Without moves C lands on node2: two partly
    # used nodes, largest free piece 4. With B on node2 and C beside A: node1 full, node2 5 free in one piece.
    a, b = pod("a", 4, "node1"), pod("b", 3, "node1")
    plan = plan_for_pending(pod("c", 4), [node("node1", 7), node("node2", 0)], [a, b])
    assert plan is not None
    assert moved(plan) == [("ns/b", "node1", "node2")]
    assert plan.pending_node == "node1"
    assert (plan.after.full, plan.after.partly_used, plan.after.largest_free, plan.after.stranded) == (1, 1, 5, 5)
    assert (plan.before.partly_used, plan.before.whole_free, plan.before.largest_free) == (1, 1, 8)


def test_no_plan_when_the_pod_fits_as_well_without_moves() -> None:
    # node1 runs A (4): C (4) fills it without any move.
    assert plan_for_pending(pod("c", 4), [node("node1", 4), node("node2", 0)], [pod("a", 4, "node1")]) is None


def test_unmovable_and_budget_protected_pods_stay() -> None:
    nodes = [node("node1", 7), node("node2", 0)]
    a = pod("a", 4, "node1")
    # B opted out: moving A instead leaves node1 with B and C (7 of 8) and node2 with A: no better than no move.
    b_optout = pod("b", 3, "node1", movable='annotation hoss.io/movable is "false"')
    assert plan_for_pending(pod("c", 4), nodes, [a, b_optout]) is None
    # B's budget allows no disruption.
    b_budget = pod("b", 3, "node1", budgets=("ns/pdb-b",))
    assert plan_for_pending(pod("c", 4), nodes, [a, b_budget], allowed={"ns/pdb-b": 0}) is None
    # ... and one: B moves.
    plan = plan_for_pending(pod("c", 4), nodes, [a, b_budget], allowed={"ns/pdb-b": 1})
    assert plan is not None and moved(plan) == [("ns/b", "node1", "node2")]


def test_fewest_pods_then_fewest_gpus() -> None:
    # P (2 GPUs) may run on node1 only, which is full. Evicting c (6) is one pod; a and b (1 each) are two.
    only1 = frozenset({"node1"})
    pods = [pod("a", 1, "node1"), pod("b", 1, "node1"), pod("c", 6, "node1")]
    plan = plan_for_pending(pod("p", 2, nodes=only1), [node("node1", 8), node("node2", 0)], pods)
    assert plan is not None and moved(plan) == [("ns/c", "node1", "node2")]
    # Among single pods, the one with fewest GPUs: a (2) or d (2), not c (4).
    pods = [pod("a", 2, "node1"), pod("c", 4, "node1"), pod("d", 2, "node1")]
    plan = plan_for_pending(pod("p", 2, nodes=only1), [node("node1", 8), node("node2", 0)], pods)
    assert plan is not None and len(plan.moves) == 1 and plan.gpus_moved == 2


def test_moves_land_where_they_fit_most_tightly_and_respect_targets_allowed() -> None:
    # P (4) fits nowhere (free 0, 3, 1). Evicting a (1) and b (3) from node1 lets it in: b goes to node2 (3 free),
    # a to node3 (1 free); c (4) alone would fit nowhere else.
    pods = [pod("a", 1, "node1"), pod("b", 3, "node1"), pod("c", 4, "node1"), pod("x", 5, "node2"),
            pod("y", 7, "node3")]
    nodes = [node("node1", 8), node("node2", 5), node("node3", 7)]
    plan = plan_for_pending(pod("p", 4), nodes, pods)
    assert plan is not None
    assert sorted(moved(plan)) == [("ns/a", "node1", "node3"), ("ns/b", "node1", "node2")]
    assert plan.after.full == 3
    # b may run on node1 only: no plan.
    pods[1] = pod("b", 3, "node1", nodes=frozenset({"node1"}))
    assert plan_for_pending(pod("p", 4), nodes, pods) is None


def test_held_room_counts_as_used() -> None:
    # node2's 8 GPUs are held for a preemptor: B has nowhere to go.
    plan = plan_for_pending(pod("c", 4), [node("node1", 7), node("node2", 0, held=8)],
                            [pod("a", 4, "node1"), pod("b", 3, "node1")])
    assert plan is None


def test_defragment_drains_a_partly_used_node() -> None:
    # node1 holds a (2); node2 b (4) + c (2) leaves 2 free; node3 d (5) leaves 3. a onto node2 empties node1.
    pods = [pod("a", 2, "node1"), pod("b", 4, "node2"), pod("c", 2, "node2"), pod("d", 5, "node3")]
    nodes = [node("node1", 2), node("node2", 6), node("node3", 5)]
    assert fragmentation((8, n.used[GPU]) for n in nodes).stranded == 11
    plan = plan_defragment(nodes, pods)
    assert plan is not None
    assert moved(plan) == [("ns/a", "node1", "node2")]
    assert (plan.after.whole_free, plan.after.stranded) == (1, 3)


def test_defragment_picks_the_fewest_moves_for_the_best_result() -> None:
    # node1 A (4) + B (3), node2 C (4): moving A to node2 fills node2 and leaves 5 free in one piece on node1,
    # one move where swapping B and C takes two.
    pods = [pod("a", 4, "node1"), pod("b", 3, "node1"), pod("c", 4, "node2")]
    plan = plan_defragment([node("node1", 7), node("node2", 4)], pods)
    assert plan is not None and moved(plan) == [("ns/a", "node1", "node2")]
    # A and C opted out: B and C swap is not possible either (C stays); no plan.
    out = 'annotation hoss.io/movable is "false"'
    pods = [pod("a", 4, "node1", movable=out), pod("b", 3, "node1"), pod("c", 4, "node2", movable=out)]
    assert plan_defragment([node("node1", 7), node("node2", 4)], pods) is None


def test_defragment_never_moves_part_of_a_gang_and_leaves_packed_clusters_alone() -> None:
    # a (gang member) onto node2 would empty node1; b and c stay (opted out).
    out = 'annotation hoss.io/movable is "false"'
    pods = [pod("a", 2, "node1", movable="gang member"), pod("b", 4, "node2", movable=out),
            pod("c", 2, "node2", movable=out)]
    assert plan_defragment([node("node1", 2), node("node2", 6)], pods) is None
    pods[0] = pod("a", 2, "node1")
    plan = plan_defragment([node("node1", 2), node("node2", 6)], pods)
    assert plan is not None and moved(plan) == [("ns/a", "node1", "node2")]
    packed = [pod("a", 8, "node1"), pod("b", 4, "node2"), pod("c", 4, "node2")]
    assert plan_defragment([node("node1", 8), node("node2", 8), node("node3", 0)], packed) is None


def test_the_worker_feed_follows_the_rescheduler_holds() -> None:
    # 'h' entries (hoss/ledger/lua/hold_moves.lua) set and end holds; held_nodes steers the pod by uid or owner.
    feed = NodeFeed(None, NodeTable())  # type: ignore[arg-type]  # apply() reads no ledger
    hold = orjson.dumps({"node": "node2", "request": {GPU: "3"}, "owner": "rs-b", "pin": 1}).decode()
    pin = orjson.dumps({"node": "node1", "request": {GPU: "4"}, "owner": "", "pin": 1}).decode()
    feed.apply([Change(id="1-0", kind="h", items=[("move/b", hold)]),
                Change(id="1-1", kind="h", items=[("c", pin)])])
    assert feed.held_nodes("b2", "rs-b") == ["node2"]
    assert feed.held_nodes("b2", "rs-b", {GPU: 3, "pods": 0}) == ["node2"]
    assert feed.held_nodes("b2", "rs-b", {GPU: 4}) == []  # a replacement asking more is placed as any pod
    assert feed.held_nodes("c", "") == ["node1"]
    assert feed.held_nodes("other", "rs-other") == []
    feed.apply([Change(id="1-2", kind="h", items=[("move/b", "")])])
    assert feed.held_nodes("b2", "rs-b") == []
