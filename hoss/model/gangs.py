"""Which gang a pod belongs to, read from the pod alone. Pure.

One rule for every component: the dispatcher groups pending pods by it (dispatcher/gangs.py), and the ledger's
entry meta carries it (`hoss.model.compact.pod_meta`, key ``gang``), so that a worker choosing preemption victims
knows the running gangs (workers/victims.py, `whole_gangs`).

A pod belongs to a gang by, in this order: ``spec.schedulingGroup.podGroupName`` (a Kubernetes
``scheduling.k8s.io/v1alpha2`` PodGroup), the label ``scheduling.x-k8s.io/pod-group`` or
``pod-group.scheduling.sigs.k8s.io/name`` (scheduler-plugins), or Volcano's annotation
``scheduling.k8s.io/group-name``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"
NAME_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"

PLUGINS_API = "scheduling.x-k8s.io"
"""scheduler-plugins' PodGroup, and the lightweight labels."""
WORKLOAD_API = "scheduling.k8s.io"
"""Kubernetes' own PodGroup (scheduling.k8s.io/v1alpha2), named by a pod's spec.schedulingGroup."""
VOLCANO_API = "scheduling.volcano.sh"
"""Volcano's PodGroup (scheduling.volcano.sh/v1beta1), named by the annotation scheduling.k8s.io/group-name."""


@dataclass(frozen=True, order=True)
class GangKey:
    namespace: str
    name: str
    api: str = PLUGINS_API
    """The API group of the PodGroup that defines the gang: two PodGroups of one name in different groups are
    different gangs."""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def needs_object(self) -> bool:
        """True when the gang is defined by a PodGroup object (not by labels alone)."""
        return self.api != PLUGINS_API

    @property
    def ident(self) -> str:
        """One string naming the gang, its API included (the ledger meta's ``gang``)."""
        return f"{self.api}/{self.namespace}/{self.name}"


def gang_of(namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str], *,
            scheduling_group: str | None = None) -> GangKey | None:
    """The gang a pod belongs to: its spec.schedulingGroup first, then the labels, then Volcano's annotation."""
    if scheduling_group:
        return GangKey(namespace, scheduling_group, WORKLOAD_API)
    name = labels.get(PODGROUP_LABEL) or labels.get(NAME_LABEL)
    if name:
        return GangKey(namespace, name)
    volcano = annotations.get(VOLCANO_ANNOTATION)
    return GangKey(namespace, volcano, VOLCANO_API) if volcano else None


def scheduling_group_of(spec: Mapping[str, object]) -> str | None:
    """spec.schedulingGroup.podGroupName of a raw pod spec (None when absent or not a string)."""
    group = spec.get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, dict) else None
    return name if isinstance(name, str) and name else None


def raw_gang_of(pod: Mapping[str, object]) -> GangKey | None:
    """The gang of a raw pod (JSON), as `gang_of` decides it."""
    metadata, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        return None
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    return gang_of(str(metadata.get("namespace") or "default"), labels if isinstance(labels, dict) else {},
                   annotations if isinstance(annotations, dict) else {}, scheduling_group=scheduling_group_of(spec))
