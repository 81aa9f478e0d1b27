"""Job dependencies (hoss.io/depends-on, dispatcher/dependencies.py): the syntax, when a dependency holds, a failed
dependency and a cycle reported instead of waited on, and the dispatcher holding such pods back until Jobs allow."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.dependencies import (
    CYCLE,
    FAILED,
    INVALID,
    WAITING,
    Dependency,
    DependencyError,
    JobState,
    job_state,
    parse,
    podgroup_state,
    verdict,
)


def test_the_syntax() -> None:
    assert parse("a:Complete, b:Running,c") == (Dependency("a", "Complete"), Dependency("b", "Running"),
                                                Dependency("c", "Complete"))
    for bad, says in (("A", "not a Job name"), ("a:Done", "must be Complete or Running"), (" , ", "names no Job"),
                      ("a:complete", "must be Complete or Running")):
        with pytest.raises(DependencyError, match=says):
            parse(bad)


def test_the_syntax_of_podgroups_and_explicit_jobs() -> None:
    assert parse("podgroup/trainers:Running, job/prepare") == (Dependency("trainers", "Running", "podgroup"),
                                                               Dependency("prepare", "Complete", "job"))
    for bad, says in (("pods/a", "kind 'pods' of 'pods/a' must be job or podgroup"),
                      ("podgroup/A_b", "'A_b' is not a PodGroup name"), ("podgroup/", "is not a PodGroup name"),
                      ("podgroup/g:Finished", "condition 'Finished' of podgroup 'g' must be Complete or Running")):
        with pytest.raises(DependencyError, match=says):
            parse(bad)
    reason, message = verdict("podgroup/g:Soon", own_job=None, jobs={}) or ("", "")
    assert reason == INVALID and "'podgroup/g:Soon'" in message


def test_podgroup_phases() -> None:
    def group(phase: str | None) -> dict[str, JobState]:
        raw: dict[str, Any] = {"metadata": {"name": "g"}, "status": {"phase": phase} if phase else {}}
        return {"g": podgroup_state(raw)}

    for phase, running, complete in (("Pending", False, False), (None, False, False), ("Scheduled", True, False),
                                     ("Running", True, False), ("Finished", True, True)):
        assert (verdict("podgroup/g:Running", own_job=None, jobs={}, podgroups=group(phase)) is None) == running
        assert (verdict("podgroup/g", own_job=None, jobs={}, podgroups=group(phase)) is None) == complete
    assert verdict("podgroup/g", own_job=None, jobs={}, podgroups=group(None)) == (
        WAITING, "waiting for podgroup g to be Complete (now: phase Pending)")
    assert verdict("podgroup/g", own_job=None, jobs={}, podgroups={}) == (
        WAITING, "waiting for podgroup g to be Complete (now: not found)")
    # A Job and a PodGroup of the same name are different things.
    assert verdict("g:Running", own_job=None, jobs={}, podgroups=group("Running"))[0] == WAITING  # type: ignore[index]
    assert verdict("podgroup/g:Running", own_job=None, jobs=states(job("g")), podgroups=group("Failed")) == (
        FAILED, "podgroup g failed (phase Failed), so podgroup/g:Running can never hold")


def job(name: str, *, conditions: dict[str, str] | None = None, active: int = 0, succeeded: int = 0,
        depends_on: str | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {}}
    if depends_on is not None:
        template["metadata"] = {"annotations": {"hoss.io/depends-on": depends_on}}
    return {"metadata": {"name": name}, "spec": {"template": template},
            "status": {"active": active, "succeeded": succeeded,
                       "conditions": [{"type": t, "status": s} for t, s in (conditions or {}).items()]}}


def states(*jobs: dict[str, Any]) -> dict[str, JobState]:
    return {j["metadata"]["name"]: job_state(j) for j in jobs}


def test_complete_and_running() -> None:
    assert verdict("a", own_job=None, jobs=states(job("a", conditions={"Complete": "True"}))) is None
    waiting = verdict("a", own_job=None, jobs=states(job("a", active=1)))
    assert waiting == (WAITING, "waiting for job a to be Complete (now: 1 active, 0 succeeded)")
    assert verdict("a:Running", own_job=None, jobs=states(job("a", active=1))) is None
    assert verdict("a:Running", own_job=None, jobs=states(job("a", conditions={"Complete": "True"}))) is None
    assert verdict("a:Running", own_job=None, jobs=states(job("a"))) is not None
    missing = verdict("a,b:Running", own_job=None, jobs=states(job("a", conditions={"Complete": "True"})))
    assert missing == (WAITING, "waiting for job b to be Running (now: not found)")
    assert verdict(None, own_job=None, jobs={}) is None


def test_a_failed_dependency_is_reported_not_waited_on() -> None:
    reason, message = verdict("a", own_job=None, jobs=states(job("a", conditions={"Failed": "True"}))) or ("", "")
    assert (reason, message) == (FAILED, "job a failed (condition Failed: no reason given), so a:Complete can "
                                         "never hold")
    failed = job("a", conditions={"Failed": "True"})
    failed["status"]["conditions"][0].update(reason="DeadlineExceeded", message="Job was active longer than "
                                             "specified deadline")
    assert verdict("b:Running,a:Running", own_job=None, jobs=states(failed, job("b", active=1))) == (
        FAILED, "job a failed (condition Failed: DeadlineExceeded (Job was active longer than specified deadline)), "
                "so a:Running can never hold")


def test_cycles_are_refused_with_the_path() -> None:
    jobs = states(job("a", depends_on="b"), job("b", depends_on="a:Running"))
    reason, message = verdict("b", own_job="a", jobs=jobs) or ("", "")
    assert reason == CYCLE and "job a -> job b -> job a" in message
    assert verdict("a", own_job="a", jobs={})[0] == CYCLE  # type: ignore[index]  # a Job naming itself
    # A pod outside the Jobs that depends on a cycle is told too (it would wait forever).
    assert verdict("a", own_job=None, jobs=jobs)[0] == CYCLE  # type: ignore[index]
    # A diamond is no cycle.
    diamond = states(job("a"), job("b", depends_on="a"), job("c", depends_on="a"))
    assert verdict("b,c", own_job="d", jobs=diamond)[0] == WAITING  # type: ignore[index]


def test_a_malformed_annotation_is_named() -> None:
    reason, message = verdict("a:Soon", own_job=None, jobs={}) or ("", "")
    assert reason == INVALID and "'a:Soon'" in message and "hoss.io/depends-on" in message
