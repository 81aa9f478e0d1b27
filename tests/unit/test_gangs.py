"""Which pods form a gang and when a gang is complete enough to send."""

from __future__ import annotations

from typing import Any

from dispatcher.gangbook import GangBook
from dispatcher.gangs import (
    VOLCANO_API,
    WORKLOAD_API,
    GangKey,
    PodGroupSpec,
    count_members,
    gang_of,
    gang_state,
    parse_podgroup,
    raw_gang_of,
)
from dispatcher.intake import PendingPod
from dispatcher.podgroup_specs import parse_volcano_podgroup, parse_workload_podgroup
from hoss.model.compact import compact_pod, encode


def test_each_way_of_naming_a_gang_is_recognised() -> None:
    assert gang_of("ns", {"scheduling.x-k8s.io/pod-group": "a"}, {}) == GangKey("ns", "a")
    assert gang_of("ns", {"pod-group.scheduling.sigs.k8s.io/name": "b"}, {}) == GangKey("ns", "b")
    assert gang_of("ns", {}, {"scheduling.k8s.io/group-name": "c"}) == GangKey("ns", "c", VOLCANO_API)
    assert gang_of("ns", {}, {}, scheduling_group="d") == GangKey("ns", "d", WORKLOAD_API)
    assert gang_of("ns", {"app": "x"}, {}) is None
    assert raw_gang_of({"metadata": {"namespace": "ns"}, "spec": {"schedulingGroup": {"podGroupName": "d"}}}) \
        == GangKey("ns", "d", WORKLOAD_API)


def test_label_gang_is_ready_only_with_min_available_members_pending() -> None:
    labels = {"pod-group.scheduling.sigs.k8s.io/name": "g", "pod-group.scheduling.sigs.k8s.io/min-available": "3"}
    waiting = gang_state(GangKey("ns", "g"), [labels, labels], podgroups={})
    assert not waiting.ready
    assert waiting.waiting_message() == (
        "gang ns/g: 2 of 3 required members are pending; none is scheduled until min-available are there")
    assert gang_state(GangKey("ns", "g"), [labels] * 3, podgroups={}).ready


def test_podgroup_min_member_wins_and_a_missing_podgroup_holds_the_gang() -> None:
    labels = {"scheduling.x-k8s.io/pod-group": "pg"}
    key = GangKey("ns", "pg")
    held = gang_state(key, [labels] * 4, podgroups={})
    assert held.min_available is None
    assert not held.ready
    assert "waiting for PodGroup pg" in held.waiting_message()
    assert gang_state(key, [labels] * 4, podgroups={key: PodGroupSpec(min_member=4)}).ready
    assert not gang_state(key, [labels] * 3, podgroups={key: PodGroupSpec(min_member=4)}).ready


def test_volcano_annotation_alone_waits_for_its_podgroup_instead_of_taking_whoever_is_pending() -> None:
    key = GangKey("ns", "v", VOLCANO_API)
    held = gang_state(key, [{}, {}], podgroups={})
    assert not held.ready
    assert held.waiting_message() == (
        "gang ns/v: waiting for Volcano PodGroup (scheduling.volcano.sh/v1beta1) v to be created")
    assert gang_state(key, [{}, {}], podgroups={key: PodGroupSpec(min_member=2)}).ready


def test_volcano_min_task_member_holds_the_gang_until_every_task_has_its_minimum() -> None:
    key = GangKey("ns", "v", VOLCANO_API)
    group = PodGroupSpec(min_member=3, task_minimums=(("ps", 1), ("worker", 2)))
    workers_only = gang_state(key, [{}] * 4, podgroups={key: group}, member_tasks=["worker"] * 4)
    assert not workers_only.ready
    assert "task ps: 0 of 1" in workers_only.waiting_message()
    assert gang_state(key, [{}] * 3, podgroups={key: group}, member_tasks=["ps", "worker", "worker"]).ready
    # a bound ps counts for its task
    assert gang_state(key, [{}] * 2, podgroups={key: group}, member_tasks=["worker", "worker"], bound=1,
                      bound_tasks={"ps": 1}).ready


def workload_podgroup(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "pg", "namespace": "ns", "uid": "u", "generation": 2}, "spec": spec}


def test_kubernetes_podgroup_gang_min_count_is_read_and_what_hoss_does_not_honour_is_refused_by_name() -> None:
    key, spec = parse_workload_podgroup(workload_podgroup({"schedulingPolicy": {"gang": {"minCount": 4}},
                                                           "priorityClassName": "high"})) or (None, None)
    assert key == GangKey("ns", "pg", WORKLOAD_API)
    assert spec is not None and (spec.min_member, spec.gang, spec.refusal, spec.generation) == (4, True, "", 2)
    tier = parse_workload_podgroup(workload_podgroup({"schedulingPolicy": {"gang": {"minCount": 4}},
                                                      "schedulingConstraints": {"topology": [{"key": "zone"}]}}))
    assert tier is not None and (tier[1].domain_key, tier[1].refusal) == ("zone", "")
    whole = parse_workload_podgroup(workload_podgroup({"schedulingPolicy": {"gang": {"minCount": 2}},
                                                       "disruptionMode": "PodGroup"}))
    assert whole is not None and whole[1].refusal == ""  # hoss evicts a running gang whole: honoured
    basic = parse_workload_podgroup(workload_podgroup({"schedulingPolicy": {"basic": {}}}))
    assert basic is not None and not basic[1].gang and not basic[1].refusal
    for field, value, says in (
        ("schedulingConstraints", {"topology": [{"key": "zone"}, {"key": "rack"}]},
         "spec.schedulingConstraints.topology"),
        ("resourceClaims", [{"name": "c", "resourceClaimName": "c"}], "spec.resourceClaims"),
        ("disruptionMode", "Node", "spec.disruptionMode 'Node'"),
        ("somethingNew", 1, "spec.somethingNew"),
    ):
        parsed = parse_workload_podgroup(workload_podgroup({"schedulingPolicy": {"gang": {"minCount": 2}},
                                                            field: value}))
        assert parsed is not None and says in parsed[1].refusal, (field, parsed)
        state = gang_state(parsed[0], [{}] * 3, podgroups=dict([parsed]))
        assert not state.ready and says in state.waiting_message()


def test_volcano_podgroup_fields_are_honoured_or_refused_by_name() -> None:
    def parse(spec: dict[str, Any]) -> PodGroupSpec:
        parsed = parse_volcano_podgroup({"metadata": {"name": "v", "namespace": "ns"}, "spec": spec})
        assert parsed is not None and parsed[0] == GangKey("ns", "v", VOLCANO_API)
        return parsed[1]

    honoured = parse({"minMember": 3, "minTaskMember": {"worker": 2, "ps": 1}, "queue": "default",
                      "minResources": {"cpu": "3"}})
    assert (honoured.min_member, honoured.task_minimums, honoured.refusal) == (3, (("ps", 1), ("worker", 2)), "")
    assert "spec.queue 'research'" in parse({"minMember": 1, "queue": "research"}).refusal
    assert "spec.networkTopology" in parse({"minMember": 1, "networkTopology": {"mode": "hard"}}).refusal


def test_members_are_counted_by_gang_bound_running_finished_and_by_task() -> None:
    def pod(name: str, *, node: str = "", phase: str = "Pending", group: str = "g", task: str = "w") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "annotations": {
                    "scheduling.k8s.io/group-name": group, "volcano.sh/task-spec": task},
                    "ownerReferences": [{"name": "job-a", "uid": "j"}]},
                "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}

    counts = count_members([pod("a", node="n", phase="Running"), pod("b", node="n", task="ps"), pod("c"),
                            pod("d", phase="Succeeded"), pod("e", phase="Failed"), pod("x", group="other")],
                           GangKey("ns", "g", VOLCANO_API))
    assert (counts.bound, counts.running, counts.pending, counts.succeeded, counts.failed) == (2, 1, 1, 1, 1)
    assert counts.tasks == (("ps", 1), ("w", 1)) and counts.owners == "ns/job-a"


def test_podgroup_objects_are_parsed_and_bad_ones_ignored() -> None:
    good = {"metadata": {"name": "pg", "namespace": "ns"}, "spec": {"minMember": 8, "scheduleTimeoutSeconds": 30}}
    assert parse_podgroup(good) == (GangKey("ns", "pg"), PodGroupSpec(min_member=8, timeout_seconds=30.0))
    assert parse_podgroup({"metadata": {"name": "pg", "namespace": "ns"}, "spec": {}}) is None
    assert parse_podgroup({"spec": {"minMember": 2}}) is None


def member(name: str) -> PendingPod:
    return PendingPod(uid=f"uid-{name}", namespace="ns", name=name, policy="default", seen_at=0.0,
                      scheduling_group="pg", compact="{}", digest="d")


def test_a_kubernetes_podgroup_topology_key_travels_with_the_gang_and_basic_members_go_singly() -> None:
    key = GangKey("ns", "pg", WORKLOAD_API)
    pods = [member("m-0"), member("m-1")]
    pending = {p.uid: p for p in pods}
    tiered = GangBook().plan(pods, pending=pending, dispatched={}, attempts={}, now=0.0,
                             podgroups={key: PodGroupSpec(min_member=2, domain_key="zone")})
    assert [(i.gang, i.domain_key, i.min_available) for i in tiered.items] == [("ns/pg", "zone", 2)]
    basic = GangBook().plan(pods, pending=pending, dispatched={}, attempts={}, now=0.0,
                            podgroups={key: PodGroupSpec(min_member=1, gang=False)})
    assert not basic.items and [p.name for p in basic.singles] == ["m-0", "m-1"]


def test_a_volcano_gang_item_carries_each_tasks_minimum_and_the_rest_follow_once_it_started() -> None:
    key = GangKey("ns", "job", VOLCANO_API)
    pods = [PendingPod(uid=f"uid-{name}", namespace="ns", name=name, policy="default", seen_at=0.0,
                       annotations={"scheduling.k8s.io/group-name": "job", "volcano.sh/task-spec": task},
                       compact="{}", digest="d")
            for name, task in (("ps-0", "ps"), ("w-0", "worker"), ("w-1", "worker"), ("w-2", "worker"))]
    group = PodGroupSpec(min_member=2, task_minimums=(("ps", 1), ("worker", 1)))
    plan = GangBook().plan(pods, pending={p.uid: p for p in pods}, dispatched={}, attempts={}, now=0.0,
                           podgroups={key: group})
    [item] = plan.items
    assert [m.name for m in item.members] == ["ps-0", "w-0"] and item.min_available == 2
    assert sorted(pod.name for pod, _reason, _message in plan.waits) == ["w-1", "w-2"]


def test_a_gang_whose_members_request_less_than_its_min_resources_waits_naming_the_field() -> None:
    """scheduler-plugins and Volcano hold a gang until minResources is free; hoss reserves what the members request,
    all or nothing: members that request at least minResources go out, fewer wait with spec.minResources named."""
    def pod(name: str) -> PendingPod:
        labels = {"scheduling.x-k8s.io/pod-group": "pg"}
        raw = {"metadata": {"uid": f"uid-{name}", "name": name, "namespace": "ns", "labels": labels},
               "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
        return PendingPod(uid=f"uid-{name}", namespace="ns", name=name, policy="default", seen_at=0.0,
                          labels=labels, compact=encode(compact_pod(raw)).decode(), digest="d")

    pods = [pod("m-0"), pod("m-1")]

    def plan(min_resources: dict[str, str]) -> Any:
        parsed = parse_podgroup({"metadata": {"name": "pg", "namespace": "ns"},
                                 "spec": {"minMember": 2, "minResources": min_resources}})
        assert parsed is not None and parsed[1].refusal == ""
        return GangBook().plan(pods, pending={p.uid: p for p in pods}, dispatched={}, attempts={}, now=0.0,
                               podgroups=dict([parsed]))

    enough = plan({"cpu": "2"})
    assert [i.gang for i in enough.items] == ["ns/pg"] and not enough.waits
    short = plan({"cpu": "10"})
    assert not short.items and len(short.waits) == 2
    assert all(reason == "PodGroupRefused" and "gang ns/pg: spec.minResources asks cpu 10" in message
               for _pod, reason, message in short.waits), short.waits
    bad = parse_podgroup({"metadata": {"name": "pg", "namespace": "ns"},
                          "spec": {"minMember": 2, "minResources": {"cpu": "lots"}}})
    assert bad is not None and "spec.minResources[cpu]" in bad[1].refusal


def test_the_lightweight_name_label_without_a_usable_min_available_refuses_the_gang_naming_the_label() -> None:
    """scheduler-plugins' lightweight coscheduling reads the name and min-available labels together: a gang of
    whichever members are pending would bind a job arriving in waves in part, so hoss refuses it, by name."""
    key = GangKey("ns", "g")
    missing = gang_state(key, [{"pod-group.scheduling.sigs.k8s.io/name": "g"}] * 2, podgroups={})
    assert not missing.ready and "pod-group.scheduling.sigs.k8s.io/min-available is missing" in \
        missing.waiting_message()
    bad = gang_state(key, [{"pod-group.scheduling.sigs.k8s.io/name": "g",
                            "pod-group.scheduling.sigs.k8s.io/min-available": "two"}], podgroups={})
    assert not bad.ready and "not a positive integer ('two')" in bad.waiting_message()
    good = gang_state(key, [{"pod-group.scheduling.sigs.k8s.io/name": "g",
                             "pod-group.scheduling.sigs.k8s.io/min-available": "2"}] * 2, podgroups={})
    assert good.ready
