"""Gang placement: all or at least min-available members, on the fewest and tightest leaf switches."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hoss.framework.cycle import Profile, Unschedulable
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.profiles import load_profiles
from tests.kube_objects import pod_view, raw_node, raw_pod, table
from workers.gang import GangPlacement, ScratchUsage, choose_leaves, gang_name, place_gang

POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"
LEAF = "topology.hoss.io/leaf"
GROUP = "pod-group.scheduling.sigs.k8s.io/name"
NODE = {"cpu": "4", "memory": "16Gi", "pods": "110"}


def gang_profile() -> Profile:
    profiles, _ = load_profiles(POLICIES)
    return profiles["gang-topology"]


def members(count: int, *, group: str = "job-a", cpu: str = "2") -> list[PodView]:
    return [pod_view(f"{group}-{i}", {"cpu": cpu, "memory": "1Gi"}, labels={GROUP: group}) for i in range(count)]


def placed(decision: GangPlacement | Unschedulable) -> GangPlacement:
    assert isinstance(decision, GangPlacement), decision
    return decision


def refused(decision: GangPlacement | Unschedulable) -> Unschedulable:
    assert isinstance(decision, Unschedulable), decision
    return decision


def six_slots() -> NodeTable:
    """Ten 4-cpu nodes: three empty (room for two 2-cpu members each), seven full."""
    nodes = table(*(raw_node(f"n{i}", NODE) for i in range(10)))
    for i in range(3, 10):
        nodes.set_used(f"n{i}", {"cpu": 4000})
    return nodes


def leaves(rooms: dict[str, int]) -> NodeTable:
    """Four nodes per leaf, each with room for two 2-cpu members; `rooms` says how many members a leaf has room for."""
    nodes = table(*(raw_node(f"{leaf}-{i}", NODE, labels={LEAF: leaf}) for leaf in sorted(rooms) for i in range(4)))
    for leaf, room in rooms.items():
        taken = 8 - room
        for i in range(4):
            # Take room away node by node, two slots (4 cpus) at a time, the odd one as 2 cpus.
            gone = min(2, taken)
            taken -= gone
            nodes.set_used(f"{leaf}-{i}", {"cpu": 2000 * gone})
    return nodes


def used_snapshot(nodes: NodeTable) -> list[list[int]]:
    snapshot: list[list[int]] = nodes.used.tolist()
    return snapshot


# --- All or nothing ---------------------------------------------------------------------------------------------


def test_gang_that_only_partly_fits_is_unschedulable_naming_how_many_fit() -> None:
    nodes = six_slots()
    before = used_snapshot(nodes)

    decision = refused(place_gang(gang_profile(), members(8), nodes, rng=np.random.default_rng(0), min_available=8))

    assert decision.message == (
        "gang team/job-a: only 6 of 8 members fit (min-available 8): 0/10 nodes are available: 10 Insufficient cpu."
    )
    assert decision.reasons == {"Insufficient cpu": 10}
    assert used_snapshot(nodes) == before


def test_gang_with_lower_min_available_places_those_that_fit() -> None:
    nodes = six_slots()
    before = used_snapshot(nodes)
    gang = members(8)

    decision = placed(place_gang(gang_profile(), gang, nodes, rng=np.random.default_rng(0), min_available=6))

    assert len(decision.assignments) == 6
    assert set(decision.assignments) <= {member.uid for member in gang}
    assert Counter(decision.assignments.values()) == {"n0": 2, "n1": 2, "n2": 2}
    assert decision.leaves == []  # the nodes have no leaf label
    assert used_snapshot(nodes) == before


def test_gang_larger_than_its_members_is_refused() -> None:
    decision = refused(
        place_gang(gang_profile(), members(2), six_slots(), rng=np.random.default_rng(0), min_available=4)
    )

    assert decision.message == "gang team/job-a: only 2 members exist, fewer than min-available 4"


def test_gang_members_see_the_room_earlier_members_took() -> None:
    # One node with room for exactly two members: the third must go elsewhere, never oversell it.
    nodes = table(raw_node("tight", NODE), raw_node("roomy", {"cpu": "64", "memory": "64Gi", "pods": "110"}))

    decision = placed(place_gang(gang_profile(), members(3), nodes, rng=np.random.default_rng(0), min_available=3))

    assert Counter(decision.assignments.values())["tight"] <= 2


# --- Leaf switches ----------------------------------------------------------------------------------------------


def test_sixteen_members_use_exactly_the_two_leaves_that_hold_them() -> None:
    nodes = leaves({"leaf-a": 7, "leaf-b": 8, "leaf-c": 8, "leaf-d": 5})

    decision = placed(place_gang(gang_profile(), members(16), nodes, rng=np.random.default_rng(0), min_available=16))

    assert decision.leaves == ["leaf-b", "leaf-c"]
    per_node = Counter(decision.assignments.values())
    assert sum(per_node.values()) == 16
    assert all(count == 2 for count in per_node.values())


def test_gang_spanning_leaves_takes_the_largest_then_the_tightest() -> None:
    nodes = leaves({"leaf-a": 8, "leaf-b": 7, "leaf-c": 6, "leaf-d": 4})

    decision = placed(place_gang(gang_profile(), members(12), nodes, rng=np.random.default_rng(0), min_available=12))

    # 12 needs two leaves: leaf-a (8) and the smallest that covers the other 4 -- leaf-d, with nothing left over.
    assert decision.leaves == ["leaf-a", "leaf-d"]


def test_gang_that_fits_one_leaf_takes_the_tightest_leaf() -> None:
    nodes = leaves({"leaf-a": 8, "leaf-b": 7, "leaf-c": 6, "leaf-d": 4})

    decision = placed(place_gang(gang_profile(), members(5), nodes, rng=np.random.default_rng(0), min_available=5))

    assert decision.leaves == ["leaf-c"]
    assert all(node.startswith("leaf-c-") for node in decision.assignments.values())


def test_gang_without_topology_key_ignores_leaves() -> None:
    nodes = leaves({"leaf-a": 8, "leaf-b": 8})

    decision = placed(
        place_gang(gang_profile(), members(4), nodes, rng=np.random.default_rng(0), min_available=4, topology_key=None)
    )

    assert decision.leaves == []
    assert len(decision.assignments) == 4


def test_gang_too_big_for_the_leaves_spills_to_unlabelled_nodes() -> None:
    nodes = leaves({"leaf-a": 2})
    nodes.upsert_node(raw_node("spare", NODE))

    decision = placed(place_gang(gang_profile(), members(4), nodes, rng=np.random.default_rng(0), min_available=4))

    assert Counter(decision.assignments.values())["spare"] == 2
    assert decision.leaves == ["leaf-a"]


def test_leaf_plan_for_min_available_when_the_whole_gang_cannot_fit_in_leaves() -> None:
    nodes = leaves({"leaf-a": 8, "leaf-b": 3, "leaf-c": 6})

    gang = members(20)

    decision = placed(place_gang(gang_profile(), gang, nodes, rng=np.random.default_rng(0), min_available=6))

    # 20 members do not fit anywhere (17 slots); the 6 that must fit share leaf-c, the rest fill what is left.
    assert len(decision.assignments) == 17
    assert {decision.assignments[member.uid][:6] for member in gang[:6]} == {"leaf-c"}
    assert decision.leaves == ["leaf-a", "leaf-b", "leaf-c"]


@pytest.mark.parametrize(
    ("rooms", "want", "expected"),
    [
        ([8, 7, 6, 4], 5, [2]),
        ([8, 7, 6, 4], 8, [0]),
        ([8, 7, 6, 4], 12, [0, 3]),
        ([8, 7, 6, 4], 15, [0, 1]),
        ([8, 7, 6, 4], 16, [0, 1, 3]),
        ([8, 7, 6, 4], 26, []),
        ([], 1, []),
    ],
)
def test_choose_leaves(rooms: list[int], want: int, expected: list[int]) -> None:
    chosen = choose_leaves(np.array(rooms, dtype=np.int64), want, rng=np.random.default_rng(0))

    assert chosen == expected


def test_equal_leaves_are_chosen_differently_by_different_workers() -> None:
    rooms = np.full(8, 8, dtype=np.int64)

    picks = {tuple(choose_leaves(rooms, 4, rng=np.random.default_rng(seed))) for seed in range(10)}

    assert len(picks) > 1


# --- Names and the scratch table --------------------------------------------------------------------------------


def test_gang_name_comes_from_the_group_label_or_annotation() -> None:
    assert gang_name(pod_view(labels={"scheduling.x-k8s.io/pod-group": "pg"})) == "team/pg"
    assert gang_name(pod_view(labels={GROUP: "lite"})) == "team/lite"
    assert gang_name(pod_view(annotations={"scheduling.k8s.io/group-name": "volcano"})) == "team/volcano"
    assert gang_name(pod_view("solo")) == "team/solo"


def test_scratch_usage_changes_only_its_own_copy() -> None:
    nodes = six_slots()
    scratch = ScratchUsage(nodes)

    scratch.add_used("n0", {"cpu": 1000})

    assert scratch.used_of("n0") == {"cpu": 1000}
    assert nodes.used_of("n0") == {}
    with pytest.raises(TypeError):
        scratch.upsert_node(raw_node("new", NODE))
    with pytest.raises(ValueError, match=r"example\.com/fpga"):
        scratch.add_used("n0", {"example.com/fpga": 1})
    assert "example.com/fpga" not in nodes.resources


# --- Inter-pod terms and spread: members planned one after another on the pod index ------------------------------

def binpack_profile() -> Profile:
    """MostAllocated: without their terms the members would all share one node."""
    profiles, _ = load_profiles(POLICIES)
    return profiles["binpack"]


def member_raw(name: str, labels: dict[str, str]) -> dict[str, Any]:
    raw = raw_pod(name, {"cpu": "1", "memory": "1Gi"}, labels={GROUP: "job-b", **labels})
    raw["metadata"]["uid"] = f"uid-{name}"
    return raw


def test_anti_affine_members_of_one_gang_take_one_node_each_and_the_index_is_left_as_it_was() -> None:
    nodes = table(*(raw_node(f"n{i}", NODE, labels={"kubernetes.io/hostname": f"n{i}"}) for i in range(3)))
    gang = []
    for i in range(3):
        raw = member_raw(f"solo-{i}", {"app": "solo"})
        raw["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "solo"}}, "topologyKey": "kubernetes.io/hostname"}]}}
        gang.append(parse_pod(raw))
    decision = placed(place_gang(binpack_profile(), gang, nodes, rng=np.random.default_rng(1), min_available=3,
                                 topology_key=None))
    # each 1-cpu member would fit beside the others on any node: only the anti-affinity spreads them
    assert sorted(decision.assignments.values()) == ["n0", "n1", "n2"]
    assert nodes.pods == {} and nodes.anti_holders == {}, "the planned members left the pod index"
    # a fourth member finds no node: the gang of four does not fit
    raw = member_raw("solo-3", {"app": "solo"})
    raw["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "solo"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    four = [*gang, parse_pod(raw)]
    message = refused(place_gang(binpack_profile(), four, nodes, rng=np.random.default_rng(1), min_available=4,
                                 topology_key=None)).message
    assert "only 3 of 4 members fit" in message and "didn't match pod anti-affinity rules" in message


def test_members_with_do_not_schedule_spread_count_the_members_planned_before_them() -> None:
    zone = "topology.kubernetes.io/zone"
    nodes = table(*(raw_node(f"{z}-{i}", NODE, labels={zone: z}) for z in ("a", "b") for i in range(2)))
    gang = []
    for i in range(4):
        raw = member_raw(f"web-{i}", {"app": "web"})
        raw["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": zone,
                                                     "whenUnsatisfiable": "DoNotSchedule",
                                                     "labelSelector": {"matchLabels": {"app": "web"}}}]
        gang.append(parse_pod(raw))
    decision = placed(place_gang(binpack_profile(), gang, nodes, rng=np.random.default_rng(3), min_available=4,
                                 topology_key=None))
    order = [decision.assignments[member.uid][0] for member in gang]
    # after every member the zones differ by at most one (maxSkew 1), so the four end two and two
    for step in range(1, 5):
        counts = Counter(order[:step])
        assert abs(counts["a"] - counts["b"]) <= 1, order
    assert Counter(order) == {"a": 2, "b": 2}


# --- One domain of a Kubernetes PodGroup's topology constraint (a hard tier) ------------------------------------

ZONE = "topology.kubernetes.io/zone"


def zones(free: dict[str, int], *, unlabelled: int = 0) -> NodeTable:
    """Two 4-cpu nodes per zone, `free` of them empty and the rest full; and `unlabelled` empty nodes of no zone."""
    nodes = table(*(raw_node(f"{zone}-{i}", NODE, labels={ZONE: zone}) for zone in sorted(free) for i in range(2)),
                  *(raw_node(f"bare-{i}", NODE) for i in range(unlabelled)))
    for zone, empty in free.items():
        for i in range(empty, 2):
            nodes.set_used(f"{zone}-{i}", {"cpu": 4000})
    return nodes


def test_a_gang_with_a_domain_key_goes_within_one_domain_or_nowhere() -> None:
    profile = gang_profile()
    rng = np.random.default_rng(0)
    # 4 members of 2 cpu: a zone of two empty nodes holds them, the tightest such zone wins
    decision = placed(place_gang(profile, members(4), zones({"a": 1, "b": 2, "c": 2}), rng=rng, min_available=4,
                                 domain_key=ZONE))
    assert len({node.rsplit("-", 1)[0] for node in decision.assignments.values()}) == 1
    # 6 members: no one zone holds them, though the zones together (and the unlabelled nodes) would
    why = refused(place_gang(profile, members(6), zones({"a": 2, "b": 2}, unlabelled=3), rng=rng, min_available=6,
                             domain_key=ZONE))
    assert "do not fit within any one topology.kubernetes.io/zone domain" in why.message
    # members bound already fix the domain: zone b only, where they do not fit
    refused(place_gang(profile, members(4), zones({"a": 2, "b": 1}), rng=rng, min_available=4, domain_key=ZONE,
                       domain="b"))
    assert set(placed(place_gang(profile, members(4), zones({"a": 2, "b": 2}), rng=rng, min_available=4,
                                 domain_key=ZONE, domain="b")).assignments.values()) == {"b-0", "b-1"}
