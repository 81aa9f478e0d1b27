"""Which pods form a gang and when a gang is complete enough to send."""

from __future__ import annotations

from dispatcher.gangs import GangKey, PodGroupSpec, gang_of, gang_state, parse_podgroup


def test_each_way_of_naming_a_gang_is_recognised() -> None:
    assert gang_of("ns", {"scheduling.x-k8s.io/pod-group": "a"}, {}) == GangKey("ns", "a")
    assert gang_of("ns", {"pod-group.scheduling.sigs.k8s.io/name": "b"}, {}) == GangKey("ns", "b")
    assert gang_of("ns", {}, {"scheduling.k8s.io/group-name": "c"}) == GangKey("ns", "c")
    assert gang_of("ns", {"app": "x"}, {}) is None


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


def test_volcano_annotation_alone_takes_the_pending_members_as_the_gang() -> None:
    assert gang_state(GangKey("ns", "v"), [{}, {}], podgroups={}).ready


def test_podgroup_objects_are_parsed_and_bad_ones_ignored() -> None:
    good = {"metadata": {"name": "pg", "namespace": "ns"}, "spec": {"minMember": 8, "scheduleTimeoutSeconds": 30}}
    assert parse_podgroup(good) == (GangKey("ns", "pg"), PodGroupSpec(min_member=8, timeout_seconds=30.0))
    assert parse_podgroup({"metadata": {"name": "pg", "namespace": "ns"}, "spec": {}}) is None
    assert parse_podgroup({"spec": {"minMember": 2}}) is None
