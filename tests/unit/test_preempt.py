"""Preemption's victim selection and node choice (workers/preempt.py) against hand-worked cases, on a real node
table and the default profile of configs/policies.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from hoss.framework.budget import Budget, parse_budget
from hoss.framework.cycle import Profile
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import HostPort, PlacedPod, parse_placed
from hoss.framework.podterms import label_selector
from hoss.framework.profiles import load_profiles
from hoss.ledger.results import Nomination
from hoss.model.compact import pod_meta
from tests.kube_objects import raw_node, raw_pod, table
from workers.victims import (
    Candidate,
    candidates,
    eligible,
    pick,
    preemption_policy,
    select_victims,
    split_by_budgets,
    whole_gangs,
)

NODE = {"cpu": "4", "memory": "16Gi", "pods": "110"}
POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"


@pytest.fixture(scope="module")
def profile() -> Profile:
    profiles, default = load_profiles(POLICIES)
    return profiles[default]


def place(nodes: NodeTable, name: str, node: str, *, cpu: int, priority: int, labels: dict[str, str] | None = None,
          created: str = "2026-01-01T00:00:00Z", gang: str = "") -> PlacedPod:
    pod = PlacedPod(uid=f"uid-{name}", node=node, namespace="team", labels=labels or {"app": name}, ports=(),
                    name=name, priority=priority, request={"cpu": cpu, "pods": 1}, created=created, gang=gang)
    nodes.place_pod(pod)
    nodes.add_used(node, pod.request)
    return pod


def preemptor(cpu: str, priority: int = 100, **spec: object) -> PodView:
    raw = raw_pod("urgent", {"cpu": cpu})
    raw["spec"]["priority"] = priority
    raw["spec"].update(spec)
    return parse_pod(raw)


def budget(app: str, allowed: int) -> Budget:
    return Budget(namespace="team", name=app, selector=label_selector({"matchLabels": {"app": app}}, field="s"),
                  disruptions_allowed=allowed)


def names(candidate: Candidate | None) -> list[str]:
    assert candidate is not None
    return [victim.name for victim in candidate.victims]


def test_only_the_victims_needed_are_evicted_the_rest_are_reprieved() -> None:
    nodes = table(raw_node("n1", NODE))
    place(nodes, "a", "n1", cpu=1000, priority=5, created="2026-01-01T00:00:00Z")
    place(nodes, "b", "n1", cpu=1000, priority=5, created="2026-01-02T00:00:00Z")
    place(nodes, "c", "n1", cpu=2000, priority=5, created="2026-01-03T00:00:00Z")
    # 2 cpu are wanted: all three removed frees 4; a (oldest) back leaves 3, b back leaves 2, c back leaves 0.
    assert names(select_victims(preemptor("2"), "n1", nodes, [])) == ["c"]
    # Wanting 3: a back leaves 3, b back would leave 2 (too little: victim), c back would leave 1 (victim).
    assert names(select_victims(preemptor("3"), "n1", nodes, [])) == ["b", "c"]


def test_pods_of_equal_or_higher_priority_are_never_victims() -> None:
    nodes = table(raw_node("n1", NODE))
    place(nodes, "peer", "n1", cpu=2000, priority=100)
    place(nodes, "boss", "n1", cpu=1000, priority=1000)
    place(nodes, "low", "n1", cpu=1000, priority=1)
    assert select_victims(preemptor("2"), "n1", nodes, []) is None  # evicting 'low' frees only 1 cpu
    assert names(select_victims(preemptor("1"), "n1", nodes, [])) == ["low"]


def test_a_budget_violation_is_counted_and_pods_it_protects_are_reprieved_first() -> None:
    nodes = table(raw_node("n1", NODE))
    place(nodes, "db", "n1", cpu=2000, priority=1, labels={"app": "db"}, created="2026-01-05T00:00:00Z")
    place(nodes, "web", "n1", cpu=2000, priority=1, labels={"app": "web"}, created="2026-01-01T00:00:00Z")
    # web is more important (older), but db's budget allows no disruption: db is reprieved first.
    chosen = select_victims(preemptor("2"), "n1", nodes, [budget("db", 0)])
    assert chosen is not None and names(chosen) == ["web"] and chosen.violations == 0
    # Needing both, the eviction of db is a violation.
    chosen = select_victims(preemptor("4"), "n1", nodes, [budget("db", 0)])
    assert chosen is not None and sorted(names(chosen)) == ["db", "web"] and chosen.violations == 1


def test_budgets_are_counted_down_across_the_pods_they_match() -> None:
    pods = [PlacedPod(uid=f"u{i}", node="n1", namespace="team", labels={"app": "db"}, ports=(), name=f"db-{i}")
            for i in range(3)]
    other = PlacedPod(uid="o", node="n1", namespace="other", labels={"app": "db"}, ports=(), name="db-x")
    violating, fine = split_by_budgets([*pods, other], [budget("db", 1)])
    assert [p.name for p in fine] == ["db-0", "db-x"]  # another namespace's pod is not the budget's
    assert [p.name for p in violating] == ["db-1", "db-2"]
    empty = parse_budget({"metadata": {"name": "all", "namespace": "team"}, "spec": {"selector": {}},
                          "status": {"disruptionsAllowed": 0}})
    assert split_by_budgets(pods, [empty]) == ([], pods)  # an empty selector protects nothing here


def test_the_node_with_fewer_budget_violations_wins_over_fewer_victims(profile: Profile) -> None:
    nodes = table(raw_node("n1", NODE), raw_node("n2", NODE))
    place(nodes, "db", "n1", cpu=4000, priority=1, labels={"app": "db"})
    place(nodes, "web-0", "n2", cpu=2000, priority=1, labels={"app": "web"})
    place(nodes, "web-1", "n2", cpu=2000, priority=1, labels={"app": "web"})
    found = candidates(profile, preemptor("4"), nodes, [budget("db", 0)])
    assert {c.node: c.violations for c in found} == {"n1": 1, "n2": 0}
    chosen = pick(found)
    assert chosen is not None and chosen.node == "n2" and sorted(names(chosen)) == ["web-0", "web-1"]


def test_node_choice_follows_kube_schedulers_order() -> None:
    def candidate(node: str, *victims: tuple[int, str]) -> Candidate:
        return Candidate(node=node, violations=0, victims=tuple(
            PlacedPod(uid=f"{node}-{i}", node=node, namespace="team", labels={}, ports=(), priority=priority,
                      created=created) for i, (priority, created) in enumerate(victims)))

    day1, day2 = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"
    # The lowest highest-victim priority first, even with more victims.
    assert pick([candidate("a", (10, day1)), candidate("b", (5, day1), (5, day1), (5, day1))]).node == "b"  # type: ignore[union-attr]
    # Then the smallest sum of (shifted) priorities: fewer victims of the same priority.
    assert pick([candidate("a", (5, day1), (5, day1)), candidate("b", (5, day1), (1, day1))]).node == "b"  # type: ignore[union-attr]
    assert pick([candidate("a", (5, day1), (5, day1)), candidate("b", (5, day1))]).node == "b"  # type: ignore[union-attr]
    # Then the latest start of the highest-priority victims.
    assert pick([candidate("a", (5, day1)), candidate("b", (5, day2))]).node == "b"  # type: ignore[union-attr]
    assert pick([]) is None


def test_nodes_the_pod_cannot_use_anyway_are_no_candidates(profile: Profile) -> None:
    tainted = raw_node("n2", NODE, taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])
    nodes = table(raw_node("n1", NODE), tainted)
    place(nodes, "a", "n1", cpu=4000, priority=1)
    place(nodes, "b", "n2", cpu=1000, priority=1)
    found = candidates(profile, preemptor("4"), nodes, [])
    assert [c.node for c in found] == ["n1"]
    # The what-if evaluation leaves the table as it was.
    assert nodes.used_of("n1") == {"cpu": 4000, "pods": 1} and nodes.used_of("n2") == {"cpu": 1000, "pods": 1}


def test_room_held_for_another_preemptor_of_at_least_this_priority_counts_as_taken() -> None:
    nodes = table(raw_node("n1", NODE))
    place(nodes, "a", "n1", cpu=2000, priority=1)
    place(nodes, "b", "n1", cpu=2000, priority=1)
    higher = Nomination(uid="other", node="n1", priority=500, request={"cpu": 2000, "pods": 1})
    lower = Nomination(uid="other", node="n1", priority=50, request={"cpu": 2000, "pods": 1})
    own = Nomination(uid="uid-urgent", node="n1", priority=100, request={"cpu": 2000, "pods": 1})
    assert sorted(names(select_victims(preemptor("2"), "n1", nodes, [], [higher]))) == ["a", "b"]
    assert names(select_victims(preemptor("2"), "n1", nodes, [], [lower])) == ["b"]
    assert names(select_victims(preemptor("2"), "n1", nodes, [], [own])) == ["b"]  # its own hold is not in the way
    assert select_victims(preemptor("3"), "n1", nodes, [], [higher]) is None


def test_preemption_policy_is_read_from_the_spec() -> None:
    assert preemption_policy(raw_pod("p")) == "PreemptLowerPriority"
    never = raw_pod("p")
    never["spec"]["preemptionPolicy"] = "Never"
    assert preemption_policy(never) == "Never"


def test_a_pod_of_priority_zero_or_below_preempts_pods_of_strictly_lower_negative_priority(profile: Profile) -> None:
    nodes = table(raw_node("n1", NODE), raw_node("n2", NODE))
    place(nodes, "zero", "n1", cpu=4000, priority=0)
    place(nodes, "batch", "n2", cpu=4000, priority=-10)
    default = preemptor("2", priority=0)
    assert eligible(default, nodes), "a pod of -10 is placed: a pod of 0 may preempt"
    found = candidates(profile, default, nodes, [])
    assert [(c.node, names(c)) for c in found] == [("n2", ["batch"])], "never its peer of equal priority 0"
    below = preemptor("2", priority=-20)
    assert not eligible(below, nodes) and candidates(profile, below, nodes, []) == []
    # a negative preemptor still preempts what is lower still
    place(nodes, "scavenger", "n1", cpu=0, priority=-100)
    assert eligible(preemptor("2", priority=-50), nodes)


def test_pods_of_priority_zero_do_not_look_at_preemption_when_nothing_placed_is_lower(profile: Profile) -> None:
    nodes = table(raw_node("n1", NODE))
    assert not eligible(preemptor("2", priority=0), nodes), "no pod placed"
    zero = place(nodes, "zero", "n1", cpu=4000, priority=0)
    assert not eligible(preemptor("2", priority=0), nodes), "the cluster without PriorityClasses: every pod is 0"
    assert eligible(preemptor("2", priority=1), nodes)
    place(nodes, "low", "n1", cpu=0, priority=-1)
    assert eligible(preemptor("2", priority=0), nodes)
    nodes.remove_pod("uid-low")
    assert not eligible(preemptor("2", priority=0), nodes), "the index forgets a priority once its last pod left"
    assert zero.priority == 0


def test_a_victim_holding_the_host_port_the_preemptor_needs_is_evicted_and_one_that_does_not_is_reprieved(
        profile: Profile) -> None:
    nodes = table(raw_node("n1", NODE))
    port = (HostPort(protocol="TCP", ip="0.0.0.0", port=8080),)
    for name, ports in (("holder", port), ("bystander", ())):
        placed = PlacedPod(uid=f"uid-{name}", node="n1", namespace="team", labels={"app": name}, ports=ports,
                           name=name, priority=1, request={"cpu": 100, "pods": 1}, created="2026-01-01T00:00:00Z")
        nodes.place_pod(placed)
        nodes.add_used("n1", placed.request)
    raw = raw_pod("urgent", {"cpu": "1"})
    raw["spec"]["priority"] = 100
    raw["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    urgent = parse_pod(raw)
    # room is plenty: only the port stands in the way, and only its holder goes (kube-scheduler re-runs NodePorts)
    [found] = candidates(profile, urgent, nodes, [])
    assert (found.node, names(found)) == ("n1", ["holder"])
    assert set(nodes.pods) == {"uid-holder", "uid-bystander"} and nodes.used_of("n1") == {"cpu": 200, "pods": 2}


def test_a_victim_the_preemptors_anti_affinity_refuses_is_evicted_and_the_what_if_is_per_node(
        profile: Profile) -> None:
    host = "kubernetes.io/hostname"
    zone = "topology.kubernetes.io/zone"
    nodes = table(*(raw_node(f"n{i}", NODE, labels={host: f"n{i}", zone: "a"}) for i in (1, 2)))
    place(nodes, "noisy-1", "n1", cpu=100, priority=1, labels={"app": "noisy"})
    place(nodes, "noisy-2", "n2", cpu=100, priority=1, labels={"app": "noisy"})
    place(nodes, "quiet", "n2", cpu=100, priority=1, labels={"app": "quiet"})
    raw = raw_pod("urgent", {"cpu": "1"})
    raw["spec"]["priority"] = 100
    raw["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "noisy"}}, "topologyKey": zone}]}}
    urgent = parse_pod(raw)
    # Zone a holds a noisy pod on each node: evicting the one on the chosen node alone is not enough (the other
    # node's noisy pod is in the same zone), so no node is a candidate, as kube-scheduler finds per node.
    assert candidates(profile, urgent, nodes, []) == []
    # With the anti-affinity on hostname, each node needs only its own noisy pod gone; quiet is reprieved.
    raw["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "topologyKey"] = host
    found = candidates(profile, parse_pod(raw), nodes, [])
    assert sorted((c.node, names(c)) for c in found) == [("n1", ["noisy-1"]), ("n2", ["noisy-2"])]
    assert len(nodes.pods) == 3 and nodes.anti_holders == {}


def test_a_running_gang_is_evicted_whole_or_not_at_all(profile: Profile) -> None:
    """Three members of a low-priority gang on three nodes: freeing one node for the preemptor takes the whole gang
    (the others on their own nodes too), unless one member is not of lower priority: then no node whose victims
    include a member is a candidate, and a node with a plain victim is chosen instead."""
    nodes = table(raw_node("n1", NODE), raw_node("n2", NODE), raw_node("n3", NODE))
    gang = "scheduling.x-k8s.io/team/train"
    for i, node in enumerate(("n1", "n2", "n3")):
        place(nodes, f"train-{i}", node, cpu=4000, priority=1, gang=gang)
    pod = preemptor("4")
    found = whole_gangs(pod, candidates(profile, pod, nodes, []), nodes, [])
    chosen = pick(found)
    assert chosen is not None and sorted(names(chosen)) == ["train-0", "train-1", "train-2"]
    assert {v.node for v in chosen.victims} == {"n1", "n2", "n3"}

    nodes = table(raw_node("n1", NODE), raw_node("n2", NODE), raw_node("n3", NODE))
    place(nodes, "train-0", "n1", cpu=4000, priority=1, gang=gang)
    place(nodes, "train-1", "n2", cpu=4000, priority=500, gang=gang)  # as important as the preemptor, or more
    place(nodes, "solo", "n3", cpu=4000, priority=50)
    found = whole_gangs(pod, candidates(profile, pod, nodes, []), nodes, [])
    assert [(c.node, names(c)) for c in found] == [("n3", ["solo"])]


def test_a_gang_member_has_the_gang_in_its_ledger_meta() -> None:
    raw = raw_pod("w-0", {"cpu": "1"})
    raw["metadata"]["namespace"] = "team"
    raw["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    _ports, meta = pod_meta(raw)
    assert parse_placed("u", "n1", meta).gang == "scheduling.k8s.io/team/train"
