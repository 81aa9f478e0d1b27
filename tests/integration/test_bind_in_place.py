"""The sync's bind of a pod its entry already holds where the apiserver bound it (the common case: a worker's
reservation the webhook admitted) changes the entry's state in place, on a real redis-server.

What a user relies on: the ledger after the bind is exactly what dropping and holding the entry again gave
(totals, sets, the pod's fields), workers are not sent the pod a second time on the change stream, and every bind
that is not such a one (another node, another request, other ports or description) still takes the full path.
"""

from __future__ import annotations

from typing import Any

import pytest

from hoss.ledger.arguments import BatchPod, Placement
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed, Reserved
from hoss.model.compact import pod_meta

NODE = {"cpu": 4000, "memory": 8 << 30, "pods": 110}
REQUEST = {"cpu": 500, "memory": 1 << 30, "pods": 1}


def meta(name: str, labels: dict[str, str] | None = None) -> str:
    pod = {"metadata": {"name": name, "namespace": "ns", "labels": labels or {"app": "a"},
                        "creationTimestamp": "2026-11-23T09:00:00Z"}, "spec": {}}
    return pod_meta(pod, request=REQUEST)[1]


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


async def raw_state(ledger: Ledger) -> dict[str, Any]:
    """Every key of the ledger but the change stream, as plain Python values (str)."""
    redis: Any = ledger._redis
    state: dict[str, Any] = {}
    for key in sorted(await redis.keys("{hoss}:*")):
        name = text(key)
        kind = text(await redis.type(name))
        if name.endswith(":changes"):
            continue
        if kind == "hash":
            state[name] = {text(k): text(v) for k, v in (await redis.hgetall(name)).items()}
        elif kind == "set":
            state[name] = {text(m) for m in await redis.smembers(name)}
        elif kind == "zset":
            state[name] = [text(m) for m, _ in await redis.zrange(name, 0, -1, withscores=True)]
        elif kind == "string":
            state[name] = text(await redis.get(name))
    return state


async def placed_by_worker(ledger: Ledger, uid: str, node: str, *, admitted: bool) -> None:
    results = await ledger.reserve_batch([BatchPod(uid=uid, pod=f"ns/{uid}", digest="d", candidates=[node],
                                                   request=REQUEST, meta=meta(uid))], owner="w1", ttl_seconds=30)
    assert results == [Reserved(node)]
    if admitted:
        answer = await ledger.confirm(uid=uid, pod=f"ns/{uid}", node=node, request=None, owner="w1",
                                      verify_after_seconds=30)
        assert isinstance(answer, Confirmed)


@pytest.fixture
async def two_nodes(ledger: Ledger) -> Ledger:
    await ledger.rebuild(nodes=[("node1", NODE, {"zone": "a"}), ("node2", NODE, {"zone": "b"})], bound=[])
    return ledger


@pytest.mark.parametrize("admitted", [True, False], ids=["admitted", "assumed"])
async def test_binding_where_the_entry_is_changes_state_in_place_and_matches_the_full_path(
    two_nodes: Ledger, ledger: Ledger, admitted: bool
) -> None:
    await placed_by_worker(ledger, "p1", "node1", admitted=admitted)
    # the reference: the same entry bound through the full path (its description differs, so it cannot be in place)
    await placed_by_worker(ledger, "ref", "node2", admitted=admitted)
    await ledger.bind_many([Placement(uid="ref", pod="ns/ref", node="node2", request=REQUEST,
                                      meta=meta("ref", {"app": "changed"}))])
    position = (await ledger.changes("0-0"))[-1].id

    assert await ledger.bind_many([Placement(uid="p1", pod="ns/p1", node="node1", request=REQUEST,
                                             meta=meta("p1"))]) == []

    assert await ledger.changes(position) == [], "an in-place bind sends workers nothing"
    state = await raw_state(ledger)
    entry, reference = state["{hoss}:pod:p1"], state["{hoss}:pod:ref"]
    assert entry["state"] == "bound"
    # the same fields as the full path leaves (the description aside, which the reference changed on purpose)
    assert set(entry) == set(reference)
    assert {k: v for k, v in entry.items() if k != "meta"} == {
        k: ("node1" if k == "node" else "ns/p1" if k == "pod" else v) for k, v in reference.items() if k != "meta"}
    assert state["{hoss}:node:node1:bound"] == {"p1"}
    assert not state.get("{hoss}:node:node1:assumed") and not state.get("{hoss}:node:node1:admitted")
    assert "p1" not in state.get("{hoss}:assumed", []) and "p1" not in state.get("{hoss}:verify", [])
    assert state["{hoss}:node:node1:used"] == state["{hoss}:node:node2:used"] == {
        "cpu": "500", "memory": str(1 << 30), "pods": "1"}
    # and the entry is as bound as any: a second bind elsewhere moves it, with the totals following
    await ledger.bind_many([Placement(uid="p1", pod="ns/p1", node="node2", request=REQUEST, meta=meta("p1"))])
    used = await raw_state(ledger)
    assert used.get("{hoss}:node:node1:used", {}) == {}
    assert used["{hoss}:node:node2:used"]["cpu"] == "1000"


@pytest.mark.parametrize("change", ["node", "request", "ports", "meta"])
async def test_a_bind_that_differs_from_the_entry_takes_the_full_path(
    two_nodes: Ledger, ledger: Ledger, change: str
) -> None:
    await placed_by_worker(ledger, "p1", "node1", admitted=True)
    position = (await ledger.changes("0-0"))[-1].id
    request = {**REQUEST, "cpu": 700} if change == "request" else REQUEST
    placement = Placement(uid="p1", pod="ns/p1", node="node2" if change == "node" else "node1", request=request,
                          ports="TCP/0.0.0.0/80" if change == "ports" else "",
                          meta=meta("p1", {"app": "b"}) if change == "meta" else meta("p1"))

    await ledger.bind_many([placement])

    changes = await ledger.changes(position)
    assert len(changes) == 1, "workers learn the bind"
    fields = dict(changes[0].items)
    assert fields["p:p1"].startswith(placement.node + "\n")
    state = await raw_state(ledger)
    assert state["{hoss}:pod:p1"]["state"] == "bound"
    node_used = state[f"{{hoss}}:node:{placement.node}:used"]
    assert node_used["cpu"] == str(request["cpu"])
