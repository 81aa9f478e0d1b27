"""The status hoss writes on a gang's PodGroup, per API (dispatcher/podgroup_status.py)."""

from __future__ import annotations

from dispatcher.gangs import VOLCANO_API, WORKLOAD_API, GangCounts, GangKey, PodGroupSpec
from dispatcher.podgroup_status import plugins_phase, status_change

NOW = "2026-11-27T22:00:00Z"


def counts(**kw: int) -> GangCounts:
    return GangCounts(bound=kw.get("bound", 0), running=kw.get("running", 0), succeeded=kw.get("succeeded", 0),
                      failed=kw.get("failed", 0), pending=kw.get("pending", 0))


def test_scheduler_plugins_phases_follow_the_members_and_final_phases_stay() -> None:
    assert plugins_phase(3, counts(pending=2), "") == "Pending"
    assert plugins_phase(3, counts(pending=3), "") == "Scheduling"
    assert plugins_phase(3, counts(bound=3, running=1), "Scheduling") == "Scheduling"
    assert plugins_phase(3, counts(bound=3, running=3), "Scheduling") == "Running"
    assert plugins_phase(3, counts(bound=1, running=1, succeeded=2), "Running") == "Running"
    assert plugins_phase(3, counts(succeeded=3), "Running") == "Finished"
    assert plugins_phase(3, counts(bound=2, running=2, failed=1), "Running") == "Failed"
    assert plugins_phase(3, counts(pending=3), "Finished") == "Finished"
    assert plugins_phase(3, counts(bound=2, running=2), "Scheduling") == "Pending"  # a member went away


def test_scheduler_plugins_status_sets_schedule_start_time_once_and_says_nothing_twice() -> None:
    key, group = GangKey("ns", "g"), PodGroupSpec(min_member=2)
    first = status_change(key, group, counts(pending=2), {}, now=NOW)
    assert first is not None and first.status["phase"] == "Scheduling" and first.status["scheduleStartTime"] == NOW
    assert first.reason == "Scheduling"
    later = status_change(key, group, counts(bound=2, running=2), first.status, now="2026-11-27T23:00:00Z")
    assert later is not None and later.status["scheduleStartTime"] == NOW and later.status["phase"] == "Running"
    assert status_change(key, group, counts(bound=2, running=2), later.status, now=NOW) is None
    done = status_change(key, group, counts(succeeded=2), later.status, now=NOW)
    assert done is not None and done.final and done.status["phase"] == "Finished"


def test_a_kubernetes_podgroup_gets_podgroup_scheduled_true_once_placed_and_never_back_to_false() -> None:
    key, group = GangKey("ns", "g", WORKLOAD_API), PodGroupSpec(min_member=2, generation=3)
    assert status_change(key, group, counts(pending=2), {}, now=NOW) is None  # nothing to say while it waits
    told = status_change(key, group, GangCounts(bound=0, running=0, pending=2, unschedulable="0/3 nodes fit"), {},
                         now=NOW)
    assert told is not None
    [condition] = told.status["conditions"]
    assert (condition["status"], condition["reason"], condition["message"], condition["observedGeneration"]) == (
        "False", "Unschedulable", "0/3 nodes fit", 3)
    placed = status_change(key, group, counts(bound=2), told.status, now=NOW)
    assert placed is not None and placed.status["conditions"][0]["status"] == "True"
    assert placed.status["conditions"][0]["reason"] == "Scheduled"
    assert status_change(key, group, GangCounts(bound=1, running=1, unschedulable="lost one"), placed.status,
                         now=NOW) is None


def test_a_volcano_podgroup_runs_then_completes() -> None:
    key, group = GangKey("ns", "v", VOLCANO_API), PodGroupSpec(min_member=2)
    running = status_change(key, group, counts(bound=2, running=2), {}, now=NOW)
    assert running is not None and running.status == {"phase": "Running", "running": 2, "succeeded": 0, "failed": 0}
    completed = status_change(key, group, counts(succeeded=2), running.status, now=NOW)
    assert completed is not None and completed.status["phase"] == "Completed" and completed.final


def test_an_accepted_volcano_podgroup_is_inqueue_before_its_members_exist_and_a_refused_one_stays_pending() -> None:
    """Volcano's job controller makes a job's pods only once its PodGroup left Pending (the scheduler's enqueue):
    a group hoss accepts goes Inqueue with no member yet; one it refuses stays Pending, the event naming the
    field; Running counts members bound (Volcano's allocated), before they run."""
    key = GangKey("ns", "v", VOLCANO_API)
    admitted = status_change(key, PodGroupSpec(min_member=2), counts(), {}, now=NOW)
    assert admitted is not None and admitted.status["phase"] == "Inqueue" and admitted.reason == "Inqueue"
    refused = status_change(key, PodGroupSpec(min_member=2, refusal="spec.queue 'research' is refused"), counts(), {},
                            now=NOW)
    assert refused is not None and refused.status["phase"] == "Pending" and "spec.queue 'research'" in refused.message
    bound = status_change(key, PodGroupSpec(min_member=2), counts(bound=2), admitted.status, now=NOW)
    assert bound is not None and bound.status["phase"] == "Running"
