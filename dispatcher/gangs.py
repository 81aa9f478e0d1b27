"""Gangs (all-or-nothing pod groups) as users already write them, and when a gang is ready to be sent. Pure.

A pod belongs to a gang through any of:
- ``spec.schedulingGroup.podGroupName`` (Kubernetes 1.36): a ``scheduling.k8s.io/v1alpha2`` PodGroup of that name
  in the pod's namespace (``spec.schedulingPolicy.gang.minCount``; dispatcher/workloads.py reads it);
- label ``scheduling.x-k8s.io/pod-group: <name>`` with a scheduler-plugins ``PodGroup`` of that name in the pod's
  namespace (``spec.minMember``, ``spec.scheduleTimeoutSeconds``);
- labels ``pod-group.scheduling.sigs.k8s.io/name`` and ``pod-group.scheduling.sigs.k8s.io/min-available`` (the
  name without a usable min-available refuses the gang, naming the label);
- Volcano's annotation ``scheduling.k8s.io/group-name`` with a Volcano ``PodGroup`` (``scheduling.volcano.sh``) of
  that name (``spec.minMember``, ``spec.minTaskMember`` by the pods' ``volcano.sh/task-spec`` annotation).

A gang that names a PodGroup object waits for it: until it is seen its members are held, with the reason. A
PodGroup that asks for something hoss does not honour is refused: its members wait with a message naming the field.

The dispatcher holds a gang's members until at least min-available of them are pending or bound (members already
bound count, as in scheduler-plugins' Coscheduling), then sends all pending members to one worker as one item; the
worker reserves them with one all-or-nothing ledger call. Once min-available are bound the gang has started: extra
and replacement members go out singly, on the gang's policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hoss.errors import QuantityError, SpecError
from hoss.model.compact import decode
from hoss.model.gangs import (
    NAME_LABEL,
    PLUGINS_API,
    PODGROUP_LABEL,
    VOLCANO_ANNOTATION,
    VOLCANO_API,
    WORKLOAD_API,
    GangKey,
    gang_of,
    raw_gang_of,
    scheduling_group_of,
)
from hoss.model.objects import Json
from hoss.model.resources import format_quantity, parse_quantity, pod_requests, to_base_units

__all__ = ["NAME_LABEL", "PLUGINS_API", "PODGROUP_LABEL", "VOLCANO_ANNOTATION", "VOLCANO_API", "WORKLOAD_API",
           "GangKey", "gang_of", "raw_gang_of", "scheduling_group_of"]

MIN_AVAILABLE_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"
VOLCANO_TASK_ANNOTATION = "volcano.sh/task-spec"
"""The task of a Volcano job's pod (the key of the PodGroup's spec.minTaskMember)."""


@dataclass(frozen=True)
class PodGroupSpec:
    """What a PodGroup object (or the labels) say about a gang."""

    min_member: int
    timeout_seconds: float | None = None
    gang: bool = True
    """False for a Kubernetes PodGroup with the basic policy: its members are placed one by one."""
    task_minimums: tuple[tuple[str, int], ...] = ()
    """Volcano's spec.minTaskMember: per task, the members that must be placed together."""
    refusal: str = ""
    """Why hoss refuses the PodGroup (naming the field and value); its members wait with this message."""
    generation: int = 0
    """metadata.generation, for the observedGeneration of the conditions written on it."""
    uid: str = ""
    """metadata.uid, for the events recorded about it."""
    domain_key: str = ""
    """A Kubernetes PodGroup's schedulingConstraints.topology key: the gang goes within one domain of it."""
    status: Json = field(default_factory=dict, compare=False)
    """Its status as last seen."""
    min_resources: tuple[tuple[str, int], ...] = ()
    """spec.minResources in base units (scheduler-plugins' and Volcano's): the gang goes out only when its members
    request at least that much, since hoss reserves what they request, all or nothing, and holds no more."""


def parse_min_resources(spec: Mapping[str, object]) -> tuple[tuple[tuple[str, int], ...], str]:
    """spec.minResources in base units, and a refusal naming the field when it cannot be read."""
    raw = spec.get("minResources")
    if raw is None:
        return (), ""
    if not isinstance(raw, dict):
        return (), f"spec.minResources {raw!r} is not a map of resource to quantity"
    amounts = []
    for resource, quantity in sorted(raw.items()):
        try:
            amounts.append((str(resource), to_base_units(str(resource), parse_quantity(
                quantity, field=f"spec.minResources[{resource}]"))))
        except QuantityError as error:
            return (), str(error)
    return tuple(amounts), ""


def short_of_min_resources(group: PodGroupSpec | None, members: Sequence[Mapping[str, Any]]) -> str:
    """Why a gang about to go out is held: its PodGroup's minResources asks more of a resource than its members
    (pods, raw or compact) request, together. scheduler-plugins and Volcano would wait until that much is free;
    hoss reserves the members' requests and holds no room beyond them, so it says so rather than ignore the field.
    '' when the members request enough (or a pod cannot be read: the worker refuses that pod on its own)."""
    if group is None or not group.min_resources:
        return ""
    total: dict[str, int] = {}
    try:
        for member in members:
            for resource, amount in pod_requests(member).items():
                total[resource] = total.get(resource, 0) + amount
    except SpecError:
        return ""
    for resource, wanted in group.min_resources:
        if total.get(resource, 0) < wanted:
            return (f"spec.minResources asks {resource} {format_quantity(resource, wanted)} but its "
                    f"{len(members)} members request {format_quantity(resource, total.get(resource, 0))}; "
                    f"hoss reserves what the members request, all or nothing, and holds no room beyond it: refused "
                    f"until the members request that much")
    return ""


def decoded_members(compacts: Sequence[str]) -> list[Json] | None:
    """The members' compact forms decoded; None when one cannot be read."""
    try:
        return [decode(form) for form in compacts]
    except ValueError:
        return None


def label_min_available(labels: Mapping[str, str]) -> int | None:
    """min-available from the lightweight label; None when absent or not a positive integer."""
    raw = labels.get(MIN_AVAILABLE_LABEL)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 1 else None


PLUGINS_FIELDS = frozenset({"minMember", "minResources", "scheduleTimeoutSeconds"})


def parse_podgroup(obj: Mapping[str, object]) -> tuple[GangKey, PodGroupSpec] | None:
    """A scheduler-plugins PodGroup (raw JSON); None when it lacks a name or a usable minMember. A spec field
    scheduler-plugins does not define refuses the gang (named in its members' message), never dropped."""
    metadata = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace")
    min_member = spec.get("minMember")
    if not isinstance(name, str) or not isinstance(namespace, str) or not isinstance(min_member, int):
        return None
    timeout = spec.get("scheduleTimeoutSeconds")
    extra = sorted(set(spec) - PLUGINS_FIELDS)
    min_resources, unreadable = parse_min_resources(spec)
    return GangKey(namespace, name), PodGroupSpec(
        min_member=max(1, min_member), timeout_seconds=float(timeout) if isinstance(timeout, int) else None,
        refusal=f"hoss does not know spec.{extra[0]} ({spec[extra[0]]!r}); refused rather than ignored"
        if extra else unreadable, min_resources=min_resources, **object_facts(obj),
    )


def object_facts(obj: Mapping[str, object]) -> dict[str, Any]:
    """A PodGroup's uid, generation and status (for `PodGroupSpec`)."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    generation, uid, status = metadata.get("generation"), metadata.get("uid"), obj.get("status")
    return {"generation": generation if isinstance(generation, int) else 0, "uid": uid if isinstance(uid, str) else "",
            "status": dict(status) if isinstance(status, dict) else {}}


@dataclass(frozen=True)
class GangState:
    """A gang among the pending pods: how many are pending and how many it needs."""

    key: GangKey
    pending: int
    min_available: int | None
    """None: unknown yet (a gang whose PodGroup has not been seen)."""
    bound: int = 0
    """Members bound already; they count toward min-available."""
    short_tasks: tuple[tuple[str, int, int], ...] = ()
    """Volcano tasks with fewer members pending or bound than spec.minTaskMember: (task, have, need)."""
    refusal: str = ""
    """Why the gang's PodGroup is refused (its members wait)."""

    @property
    def ready(self) -> bool:
        return (self.min_available is not None and not self.refusal and not self.short_tasks
                and self.pending + self.bound >= self.min_available)

    @property
    def started(self) -> bool:
        """min-available members are bound: further members are placed singly."""
        return self.min_available is not None and not self.refusal and self.bound >= self.min_available

    @property
    def still_needed(self) -> int:
        """How many of the pending members must be placed together (min-available less those bound)."""
        return max(1, (self.min_available or self.pending) - self.bound)

    def waiting_message(self) -> str:
        if self.refusal:
            return f"gang {self.key}: {self.refusal}"
        if self.min_available is None:
            what = {WORKLOAD_API: "PodGroup (scheduling.k8s.io/v1alpha2)",
                    VOLCANO_API: "Volcano PodGroup (scheduling.volcano.sh/v1beta1)"}.get(self.key.api, "PodGroup")
            return f"gang {self.key}: waiting for {what} {self.key.name} to be created"
        if self.short_tasks:
            tasks = ", ".join(f"task {task}: {have} of {need}" for task, have, need in self.short_tasks)
            return (f"gang {self.key}: too few members of its tasks ({tasks} by minTaskMember); none is scheduled "
                    f"until every task has its minimum")
        if self.bound:
            return (f"gang {self.key}: {self.pending} pending and {self.bound} bound of {self.min_available} "
                    f"required members; none is scheduled until min-available are there")
        return (f"gang {self.key}: {self.pending} of {self.min_available} required members are pending; "
                f"none is scheduled until min-available are there")


@dataclass(frozen=True)
class GangCounts:
    """A gang's members as the apiserver has them: bound (scheduled), running, finished, and why one waits."""

    bound: int
    running: int
    succeeded: int = 0
    failed: int = 0
    tasks: tuple[tuple[str, int], ...] = ()
    """Bound members by Volcano task (``volcano.sh/task-spec``)."""
    unschedulable: str = ""
    """The message of a pending member's PodScheduled=False condition (reason Unschedulable), if one has it."""
    pending: int = 0
    """Members not bound yet."""
    owners: str = ""
    """The members' owners, namespace/name, sorted and comma-separated (scheduler-plugins' occupiedBy)."""


def member_selector(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """The label selector that lists a gang's members: its label, or '' (the whole namespace, filtered by
    `raw_gang_of`) for a gang named by spec.schedulingGroup or Volcano's annotation, which no selector finds."""
    for label in (PODGROUP_LABEL, NAME_LABEL):
        if labels.get(label):
            return f"{label}={labels[label]}"
    return ""


def task_of(annotations: Mapping[str, str]) -> str:
    return annotations.get(VOLCANO_TASK_ANNOTATION, "")


def count_members(pods: Sequence[Mapping[str, object]], key: GangKey | None = None) -> GangCounts:
    """Bound, running, succeeded and failed members among a gang's pods (raw JSON; those of another gang are
    skipped when ``key`` is given); deleting pods do not count."""
    bound = running = succeeded = failed = 0
    tasks: dict[str, int] = {}
    unschedulable = ""
    pending = 0
    owners: set[str] = set()
    for pod in pods:
        metadata, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
        if not isinstance(metadata, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
            continue
        if key is not None and raw_gang_of(pod) != key:
            continue
        for reference in metadata.get("ownerReferences") or []:
            if isinstance(reference, dict) and reference.get("name"):
                owners.add(f"{metadata.get('namespace')}/{reference['name']}")
        phase = status.get("phase")
        if phase == "Succeeded":
            succeeded += 1
            continue
        if phase == "Failed":
            failed += 1
            continue
        if metadata.get("deletionTimestamp"):
            continue
        if spec.get("nodeName"):
            bound += 1
            running += phase == "Running"
            annotations = metadata.get("annotations") or {}
            task = task_of(annotations) if isinstance(annotations, dict) else ""
            if task:
                tasks[task] = tasks.get(task, 0) + 1
            continue
        pending += 1
        if not unschedulable:
            for condition in status.get("conditions") or []:
                if isinstance(condition, dict) and condition.get("type") == "PodScheduled" \
                        and condition.get("reason") == "Unschedulable" and condition.get("message"):
                    unschedulable = str(condition["message"])
    return GangCounts(bound=bound, running=running, succeeded=succeeded, failed=failed,
                      tasks=tuple(sorted(tasks.items())), unschedulable=unschedulable, pending=pending,
                      owners=",".join(sorted(owners)))


def gang_state(
    key: GangKey,
    member_labels: Sequence[Mapping[str, str]],
    *,
    podgroups: Mapping[GangKey, PodGroupSpec],
    bound: int = 0,
    member_tasks: Sequence[str] = (),
    bound_tasks: Mapping[str, int] | None = None,
) -> GangState:
    """Decide how many members ``key`` needs: its PodGroup's minMember (minCount), else the min-available label.
    ``member_tasks``: the pending members' Volcano tasks; ``bound_tasks``: bound members by task."""
    group = podgroups.get(key)
    minimum = group.min_member if group is not None else None
    refusal = group.refusal if group is not None else ""
    if minimum is None and not key.needs_object:
        values = [v for v in (label_min_available(labels) for labels in member_labels) if v is not None]
        minimum = max(values) if values else None
        if minimum is None and not any(PODGROUP_LABEL in labels for labels in member_labels):
            # The name label without a usable min-available: scheduler-plugins' lightweight coscheduling reads the
            # two labels together; a gang of whichever members happen to be pending would bind a job arriving in
            # waves in part, so the gang is refused, naming the label.
            given = sorted({labels.get(MIN_AVAILABLE_LABEL, "") for labels in member_labels} - {""})
            what = f"not a positive integer ({given[0]!r})" if given else "missing"
            refusal = f"label {MIN_AVAILABLE_LABEL} is {what}; the label {NAME_LABEL} makes a gang only with it"
    short: list[tuple[str, int, int]] = []
    if group is not None and group.task_minimums:
        pending_tasks: dict[str, int] = {}
        for task in member_tasks:
            pending_tasks[task] = pending_tasks.get(task, 0) + 1
        for task, need in group.task_minimums:
            have = pending_tasks.get(task, 0) + (bound_tasks or {}).get(task, 0)
            if have < need:
                short.append((task, have, need))
    return GangState(key=key, pending=len(member_labels), min_available=minimum, bound=bound,
                     short_tasks=tuple(short), refusal=refusal)
