"""Job dependencies: a pod (or every pod of a Job, through its template) waits until named Jobs are Complete or
Running. Pure: parsing the annotation, a Job's state, and the verdict for one pod.

Annotation ``hoss.io/depends-on`` on the pod or the Job's pod template: a comma-separated list of
``<job>[:<condition>]`` naming Jobs in the pod's namespace, condition ``Complete`` (the default: the Job has the
condition Complete) or ``Running`` (the Job has an active pod, or has already succeeded), e.g.
``prepare:Complete,tensorboard:Running``. All entries must hold. A Job that failed (condition Failed) makes its
dependents wait with reason ``DependencyFailed`` instead of forever in silence; a cycle among Jobs' templates
(a -> b -> a, or a Job naming itself) is refused with reason ``DependencyCycle``.
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
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class DependencyError(ValueError):
    """A ``hoss.io/depends-on`` value that cannot be read; the message names the annotation and the value."""


@dataclass(frozen=True)
class Dependency:
    job: str
    condition: str


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

    def holds(self, condition: str) -> bool:
        if condition == "Complete":
            return self.complete
        return self.complete or self.active > 0 or self.succeeded > 0

    def describe(self) -> str:
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
        job, _, condition = entry.partition(":")
        job, condition = job.strip(), condition.strip() or "Complete"
        if not _NAME.fullmatch(job) or len(job) > 253:
            raise DependencyError(f"{ANNOTATION} {value!r}: {job!r} is not a Job name (expected "
                                  f"<job>[:Complete|Running], comma-separated)")
        if condition not in CONDITIONS:
            raise DependencyError(f"{ANNOTATION} {value!r}: condition {condition!r} of job {job!r} must be "
                                  f"Complete or Running")
        found.append(Dependency(job=job, condition=condition))
    if not found:
        raise DependencyError(f"{ANNOTATION} {value!r}: names no Job (expected <job>[:Complete|Running], ...)")
    return tuple(found)


def job_state(job: Mapping[str, object]) -> JobState:
    """A batch/v1 Job's state (lenient: missing fields read as none)."""
    metadata = job.get("metadata") if isinstance(job.get("metadata"), dict) else {}
    status = job.get("status") if isinstance(job.get("status"), dict) else {}
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    assert isinstance(metadata, dict) and isinstance(status, dict) and isinstance(spec, dict)
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or [] if isinstance(c, dict)}
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
            found = visit(dependency.job)
            if found:
                return found
        path.pop()
        on_path.discard(name)
        done.add(name)
        return None

    roots = [own_job] if own_job else []
    roots += [d.job for d in start]
    for root in roots:
        found = visit(root)
        if found:
            return found
    return None


def verdict(annotation: str | None, *, own_job: str | None,
            jobs: Mapping[str, JobState]) -> tuple[str, str] | None:
    """Why the pod must not be scheduled yet (reason, message), or None when every dependency holds.
    ``jobs``: the Jobs of the pod's namespace by name; ``own_job``: the Job that controls the pod, if any."""
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
    failed = [d for d in dependencies if (state := jobs.get(d.job)) is not None and state.failed]
    if failed:
        names = ", ".join(f"job {d.job} failed, so {d.job}:{d.condition} can never hold" for d in failed)
        return FAILED, f"{names}; the pod is not scheduled (re-create the job to retry)"
    unmet = [d for d in dependencies if (state := jobs.get(d.job)) is None or not state.holds(d.condition)]
    if not unmet:
        return None
    parts = []
    for dependency in unmet:
        state = jobs.get(dependency.job)
        now = "not found" if state is None else state.describe()
        parts.append(f"job {dependency.job} to be {dependency.condition} (now: {now})")
    return WAITING, "waiting for " + "; ".join(parts)
