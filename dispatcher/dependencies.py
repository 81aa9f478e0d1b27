"""Job dependencies: a pod (or every pod of a Job, through its template) waits until named Jobs or PodGroups are
Complete or Running. Pure: parsing the annotation, a Job's or PodGroup's state, and the verdict for one pod.

Annotation ``hoss.io/depends-on`` on the pod or the Job's pod template: a comma-separated list of
``[job/|podgroup/]<name>[:<condition>]`` naming Jobs (the default kind) or scheduler-plugins PodGroups in the
pod's namespace, condition ``Complete`` (the default) or ``Running``, e.g.
``prepare:Complete,podgroup/trainers:Running``. A Job is Complete with the condition Complete and Running with an
active pod (or once it succeeded); a PodGroup is Running in phase Running (or Scheduled, which scheduler-plugins
wrote before it had Scheduling; or Finished), Complete in
phase Finished. All entries must hold. A Job with the condition Failed (a PodGroup in phase Failed) gives its
dependents reason ``DependencyFailed`` (the dispatcher fails them, or lets them wait: ``failed_dependency``); a
cycle among Jobs' templates (a -> b -> a, or a Job naming itself) is refused with reason ``DependencyCycle``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ANNOTATION = "hoss.io/depends-on"
CONDITIONS = ("Complete", "Running")
WAITING = "WaitingForDependency"
FAILED = "DependencyFailed"
CYCLE = "DependencyCycle"
INVALID = "InvalidDependency"
KINDS = ("job", "podgroup")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_SYNTAX = "expected [job/|podgroup/]<name>[:Complete|Running], comma-separated"


class DependencyError(ValueError):
    """A ``hoss.io/depends-on`` value that cannot be read; the message names the annotation and the value."""


@dataclass(frozen=True)
class Dependency:
    job: str
    """The Job's (or PodGroup's) name."""
    condition: str
    kind: str = "job"
    """'job' or 'podgroup'."""

    def describe(self) -> str:
        return f"{self.kind} {self.job}"

    def spelled(self) -> str:
        """As the annotation names it."""
        return f"{'podgroup/' if self.kind == 'podgroup' else ''}{self.job}:{self.condition}"


@dataclass(frozen=True)
class JobState:
    """What a dependency reads of a Job."""

    name: str
    complete: bool
    failed: bool
    active: int
    succeeded: int
    depends_on: tuple[Dependency, ...] = ()
    """Its pod template's dependencies (for cycles); an unreadable annotation counts as none."""
    failure: str = ""
    """Why it failed, as its Failed condition (or PodGroup phase) says: e.g. 'condition Failed:
    BackoffLimitExceeded (Job has reached the specified backoff limit)'."""
    phase: str = ""
    """A PodGroup's status.phase ('' for a Job)."""

    def holds(self, condition: str) -> bool:
        if condition == "Complete":
            return self.complete
        return self.complete or self.active > 0 or self.succeeded > 0

    def describe(self) -> str:
        if self.phase:
            return f"phase {self.phase}"
        if self.failed:
            return "failed"
        if self.complete:
            return "complete"
        return f"{self.active} active, {self.succeeded} succeeded"


def parse(value: str) -> tuple[Dependency, ...]:
    """The dependencies an annotation value names; raises DependencyError naming the bad entry."""
    found = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        target, _, condition = entry.partition(":")
        target, condition = target.strip(), condition.strip() or "Complete"
        kind, slash, name = target.partition("/")
        if not slash:
            kind, name = "job", target
        if kind not in KINDS:
            raise DependencyError(f"{ANNOTATION} {value!r}: kind {kind!r} of {target!r} must be job or podgroup "
                                  f"({_SYNTAX})")
        if not _NAME.fullmatch(name) or len(name) > 253:
            what = "a PodGroup" if kind == "podgroup" else "a Job"
            raise DependencyError(f"{ANNOTATION} {value!r}: {name!r} is not {what} name ({_SYNTAX})")
        if condition not in CONDITIONS:
            raise DependencyError(f"{ANNOTATION} {value!r}: condition {condition!r} of {kind} {name!r} must be "
                                  f"Complete or Running")
        found.append(Dependency(job=name, condition=condition, kind=kind))
    if not found:
        raise DependencyError(f"{ANNOTATION} {value!r}: names no Job or PodGroup ({_SYNTAX})")
    return tuple(found)


def job_state(job: Mapping[str, object]) -> JobState:
    """A batch/v1 Job's state (lenient: missing fields read as none)."""
    metadata = job.get("metadata") if isinstance(job.get("metadata"), dict) else {}
    status = job.get("status") if isinstance(job.get("status"), dict) else {}
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    assert isinstance(metadata, dict) and isinstance(status, dict) and isinstance(spec, dict)
    listed = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    conditions = {c.get("type"): c.get("status") for c in listed}
    failed = next((c for c in listed if c.get("type") == "Failed" and c.get("status") == "True"), None)
    failure = ""
    if failed is not None:
        failure = f"condition Failed: {failed.get('reason') or 'no reason given'}"
        if failed.get("message"):
            failure += f" ({failed.get('message')})"
    template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    annotations = ((template or {}).get("metadata") or {}).get("annotations") or {}
    try:
        depends = parse(annotations[ANNOTATION]) if isinstance(annotations.get(ANNOTATION), str) else ()
    except DependencyError:
        depends = ()
    return JobState(
        name=str(metadata.get("name") or ""),
        complete=conditions.get("Complete") == "True",
        failed=conditions.get("Failed") == "True",
        active=int(status.get("active") or 0),
        succeeded=int(status.get("succeeded") or 0),
        depends_on=depends,
        failure=failure,
    )


def podgroup_state(group: Mapping[str, object]) -> JobState:
    """A scheduler-plugins PodGroup's state from its status.phase: Running or Scheduled counts as Running,
    Finished as Complete, Failed as failed (lenient: no phase reads as Pending)."""
    metadata = group.get("metadata") if isinstance(group.get("metadata"), dict) else {}
    status = group.get("status") if isinstance(group.get("status"), dict) else {}
    assert isinstance(metadata, dict) and isinstance(status, dict)
    phase = str(status.get("phase") or "Pending")
    return JobState(
        name=str(metadata.get("name") or ""),
        complete=phase == "Finished",
        failed=phase == "Failed",
        active=1 if phase in ("Running", "Scheduled") else 0,
        succeeded=0,
        failure="phase Failed" if phase == "Failed" else "",
        phase=phase,
    )


def _cycle(start: Sequence[Dependency], own_job: str | None, jobs: Mapping[str, JobState]) -> list[str] | None:
    """A cycle among Jobs reachable from the pod's dependencies (its own Job's edges are the pod's), as a path
    of Job names that ends where it starts, or None."""
    def edges(name: str) -> Sequence[Dependency]:
        if name == own_job:
            return start
        state = jobs.get(name)
        return state.depends_on if state is not None else ()

    path: list[str] = []
    on_path: set[str] = set()
    done: set[str] = set()

    def visit(name: str) -> list[str] | None:
        if name in on_path:
            return [*path[path.index(name):], name]
        if name in done:
            return None
        path.append(name)
        on_path.add(name)
        for dependency in edges(name):
            if dependency.kind != "job":
                continue  # a PodGroup depends on nothing
            found = visit(dependency.job)
            if found:
                return found
        path.pop()
        on_path.discard(name)
        done.add(name)
        return None

    roots = [own_job] if own_job else []
    roots += [d.job for d in start if d.kind == "job"]
    for root in roots:
        found = visit(root)
        if found:
            return found
    return None


def verdict(annotation: str | None, *, own_job: str | None, jobs: Mapping[str, JobState],
            podgroups: Mapping[str, JobState] | None = None) -> tuple[str, str] | None:
    """Why the pod must not be scheduled yet (reason, message), or None when every dependency holds.
    ``jobs`` and ``podgroups``: those of the pod's namespace by name; ``own_job``: the Job that controls the pod,
    if any."""
    if annotation is None:
        return None
    try:
        dependencies = parse(annotation)
    except DependencyError as error:
        return INVALID, f"{error}; the pod is not scheduled until the annotation is fixed"
    cycle = _cycle(dependencies, own_job, jobs)
    if cycle:
        return CYCLE, (f"dependency cycle: job {' -> job '.join(cycle)} ({ANNOTATION}); these pods can never "
                       f"start, remove the cycle")
    groups = podgroups or {}

    def state_of(dependency: Dependency) -> JobState | None:
        return (groups if dependency.kind == "podgroup" else jobs).get(dependency.job)

    failed = [(d, state) for d in dependencies if (state := state_of(d)) is not None and state.failed]
    if failed:
        names = "; ".join(f"{d.describe()} failed{f' ({state.failure})' if state.failure else ''}, so "
                          f"{d.spelled()} can never hold" for d, state in failed)
        return FAILED, names
    unmet = [d for d in dependencies if (state := state_of(d)) is None or not state.holds(d.condition)]
    if not unmet:
        return None
    parts = []
    for dependency in unmet:
        state = state_of(dependency)
        now = "not found" if state is None else state.describe()
        parts.append(f"{dependency.describe()} to be {dependency.condition} (now: {now})")
    return WAITING, "waiting for " + "; ".join(parts)
