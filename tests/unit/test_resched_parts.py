"""The rescheduler's pure parts beside the planner: which pods may move (rescheduler/cluster.py), the holds of a
plan and the eviction limit (rescheduler/execute.py)."""

from __future__ import annotations

from typing import Any

from rescheduler.cluster import DEFAULT_MOVABLE_KINDS, movable
from rescheduler.execute import EvictionLimit, plan_holds
from rescheduler.plan import GPU, Node, Pod, plan_for_pending


def raw(**extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}]},
        "spec": {"containers": [{"name": "c"}]},
    }
    for key, value in extra.items():
        section, _, field = key.partition("__")
        pod[section][field] = value
    return pod


def test_only_pods_a_controller_recreates_and_that_did_not_opt_out_move() -> None:
    assert movable(raw(), DEFAULT_MOVABLE_KINDS) == ""
    assert "no controller" in movable(raw(metadata__ownerReferences=[]), DEFAULT_MOVABLE_KINDS)
    daemon = [{"kind": "DaemonSet", "name": "d", "uid": "x", "controller": True}]
    assert "DaemonSet" in movable(raw(metadata__ownerReferences=daemon), DEFAULT_MOVABLE_KINDS)
    assert "hoss.io/movable" in movable(raw(metadata__annotations={"hoss.io/movable": "false"}),
                                        DEFAULT_MOVABLE_KINDS)
    assert "gang" in movable(raw(metadata__labels={"scheduling.x-k8s.io/pod-group": "g"}), DEFAULT_MOVABLE_KINDS)
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k"}]}}
    assert "anti" in movable(raw(spec__affinity=anti), DEFAULT_MOVABLE_KINDS)
    spread = [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]
    assert "spread" in movable(raw(spec__topologySpreadConstraints=spread), DEFAULT_MOVABLE_KINDS)
    ports = [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]
    assert "host ports" in movable(raw(spec__containers=ports), DEFAULT_MOVABLE_KINDS)


def test_the_holds_of_the_issue_example_count_what_the_evictions_free() -> None:
    a = Pod(key="ns/a", uid="a", node="node1", request={GPU: 4}, owner="rs-a")
    b = Pod(key="ns/b", uid="b", node="node1", request={GPU: 3}, owner="rs-b")
    nodes = [Node(name="node1", alloc={GPU: 8}, used={GPU: 7}), Node(name="node2", alloc={GPU: 8}, used={})]
    plan = plan_for_pending(Pod(key="ns/c", uid="c", node="", request={GPU: 4}), nodes, [a, b])
    assert plan is not None
    holds = plan_holds(plan)
    assert [(h.key, h.node, h.owner, dict(h.request), dict(h.freeing)) for h in holds] == [
        ("move/b", "node2", "rs-b", {GPU: 3}, {}),
        ("c", "node1", "", {GPU: 4}, {GPU: 3}),
    ]


def test_the_eviction_limit_counts_the_last_minute() -> None:
    now = [0.0]
    limit = EvictionLimit(3, clock=lambda: now[0])
    for _ in range(3):
        limit.take()
    assert limit.room() == 0
    now[0] = 59.9
    assert limit.room() == 0
    now[0] = 60.0
    assert limit.room() == 3
