"""Gangs (all-or-nothing pod groups) as users already write them, and when a gang is ready to be sent. Pure.

A pod belongs to a gang through any of:
- label ``scheduling.x-k8s.io/pod-group: <name>`` with a scheduler-plugins ``PodGroup`` of that name in the pod's
  namespace (``spec.minMember``, ``spec.scheduleTimeoutSeconds``);
- labels ``pod-group.scheduling.sigs.k8s.io/name`` and ``pod-group.scheduling.sigs.k8s.io/min-available``;
- Volcano's annotation ``scheduling.k8s.io/group-name`` (min-available read from the label above when present).

The dispatcher holds a gang's members until at least min-available of them are pending or bound (members already
bound count, as in scheduler-plugins' Coscheduling), then sends all pending members to one worker as one item; the
worker reserves them with one all-or-nothing ledger call. Once min-available are bound the gang has started: extra
and replacement members go out singly, on the gang's policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"
NAME_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
MIN_AVAILABLE_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"


@dataclass(frozen=True, order=True)
class GangKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodGroupSpec:
    """What a PodGroup object (or the labels) say about a gang."""

    min_member: int
    timeout_seconds: float | None = None


def gang_of(namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> GangKey | None:
    name = labels.get(PODGROUP_LABEL) or labels.get(NAME_LABEL) or annotations.get(VOLCANO_ANNOTATION)
    return GangKey(namespace, name) if name else None


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


def parse_podgroup(obj: Mapping[str, object]) -> tuple[GangKey, PodGroupSpec] | None:
    """A scheduler-plugins PodGroup (raw JSON); None when it lacks a name or a usable minMember."""
    metadata = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace")
    min_member = spec.get("minMember")
    if not isinstance(name, str) or not isinstance(namespace, str) or not isinstance(min_member, int):
        return None
    timeout = spec.get("scheduleTimeoutSeconds")
    return GangKey(namespace, name), PodGroupSpec(
        min_member=max(1, min_member), timeout_seconds=float(timeout) if isinstance(timeout, int) else None
    )


@dataclass(frozen=True)
class GangState:
    """A gang among the pending pods: how many are pending and how many it needs."""

    key: GangKey
    pending: int
    min_available: int | None
    """None: unknown yet (a pod-group label whose PodGroup has not been seen)."""
    bound: int = 0
    """Members bound already; they count toward min-available."""

    @property
    def ready(self) -> bool:
        return self.min_available is not None and self.pending + self.bound >= self.min_available

    @property
    def started(self) -> bool:
        """min-available members are bound: further members are placed singly."""
        return self.min_available is not None and self.bound >= self.min_available

    @property
    def still_needed(self) -> int:
        """How many of the pending members must be placed together (min-available less those bound)."""
        return max(1, (self.min_available or self.pending) - self.bound)

    def waiting_message(self) -> str:
        if self.min_available is None:
            return f"gang {self.key}: waiting for PodGroup {self.key.name} (minMember) to be created"
        if self.bound:
            return (f"gang {self.key}: {self.pending} pending and {self.bound} bound of {self.min_available} "
                    f"required members; none is scheduled until min-available are there")
        return (f"gang {self.key}: {self.pending} of {self.min_available} required members are pending; "
                f"none is scheduled until min-available are there")


@dataclass(frozen=True)
class GangCounts:
    """A gang's members as the apiserver has them: bound (scheduled) and running."""

    bound: int
    running: int


def member_selector(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """The label selector that lists a gang's members (None for a gang named only by Volcano's annotation, which
    no selector can find: its bound members are not counted)."""
    for label in (PODGROUP_LABEL, NAME_LABEL):
        if labels.get(label):
            return f"{label}={labels[label]}"
    return None


def count_members(pods: Sequence[Mapping[str, object]]) -> GangCounts:
    """Bound and running members among a gang's pods (raw JSON); deleting and finished pods do not count."""
    bound = running = 0
    for pod in pods:
        metadata, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
        if not isinstance(metadata, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
            continue
        if metadata.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        if spec.get("nodeName"):
            bound += 1
            running += status.get("phase") == "Running"
    return GangCounts(bound=bound, running=running)


def podgroup_phase(min_member: int, counts: GangCounts) -> str:
    """scheduler-plugins' PodGroup phase from its counts: Running, Scheduled, else Pending."""
    if counts.running >= min_member:
        return "Running"
    if counts.bound >= min_member:
        return "Scheduled"
    return "Pending"


def gang_state(
    key: GangKey,
    member_labels: Sequence[Mapping[str, str]],
    *,
    podgroups: Mapping[GangKey, PodGroupSpec],
    bound: int = 0,
) -> GangState:
    """Decide how many members ``key`` needs: its PodGroup's minMember, else the min-available label."""
    group = podgroups.get(key)
    minimum = group.min_member if group is not None else None
    if minimum is None:
        values = [v for v in (label_min_available(labels) for labels in member_labels) if v is not None]
        minimum = max(values) if values else None
    if minimum is None and not any(PODGROUP_LABEL in labels for labels in member_labels):
        # Volcano's annotation (or a name label) alone: the members present form the gang.
        minimum = len(member_labels)
    return GangState(key=key, pending=len(member_labels), min_available=minimum, bound=bound)
