"""Gangs (all-or-nothing pod groups) as users already write them, and when a gang is ready to be sent. Pure.

A pod belongs to a gang through any of:
- label ``scheduling.x-k8s.io/pod-group: <name>`` with a scheduler-plugins ``PodGroup`` of that name in the pod's
  namespace (``spec.minMember``, ``spec.scheduleTimeoutSeconds``);
- labels ``pod-group.scheduling.sigs.k8s.io/name`` and ``pod-group.scheduling.sigs.k8s.io/min-available``;
- Volcano's annotation ``scheduling.k8s.io/group-name`` (min-available read from the label above when present).

The dispatcher holds a gang's members until at least min-available of them are pending, then sends all pending
members to one worker as one item; the worker reserves them with one all-or-nothing ledger call.
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

    @property
    def ready(self) -> bool:
        return self.min_available is not None and self.pending >= self.min_available

    def waiting_message(self) -> str:
        if self.min_available is None:
            return f"gang {self.key}: waiting for PodGroup {self.key.name} (minMember) to be created"
        return (f"gang {self.key}: {self.pending} of {self.min_available} required members are pending; "
                f"none is scheduled until min-available are there")


def gang_state(
    key: GangKey,
    member_labels: Sequence[Mapping[str, str]],
    *,
    podgroups: Mapping[GangKey, PodGroupSpec],
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
    return GangState(key=key, pending=len(member_labels), min_available=minimum)
