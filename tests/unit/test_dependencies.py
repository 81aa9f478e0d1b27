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
    verdict,
)


def test_the_syntax() -> None:
    assert parse("a:Complete, b:Running,c") == (Dependency("a", "Complete"), Dependency("b", "Running"),
                                                Dependency("c", "Complete"))
    for bad, says in (("A", "not a Job name"), ("a:Done", "must be Complete or Running"), (" , ", "names no Job"),
                      ("a:complete", "must be Complete or Running")):
        with pytest.raises(DependencyError, match=says):
            parse(bad)


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
    assert reason == FAILED and "job a failed" in message


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
