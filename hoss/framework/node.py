"""The scheduler's view of a node, parsed once from the raw node. Pure, no I/O.

`parse_node` is the one entry for raw nodes: it checks every field the scheduler reads (taints and their effects,
the Ready condition, spec.unschedulable, labels) and raises `NodeSpecError` naming the field by its JSON path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hoss.errors import NodeSpecError
from hoss.framework import payload
from hoss.model.resources import ResourceVector, node_allocatable

TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Taint:
    """A node taint; its identity is (key, value, effect), as kube-scheduler compares them."""

    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        # kube-scheduler's spelling in "node(s) had untolerated taint {key: value}".
        return f"{{{self.key}: {self.value}}}"


@dataclass(frozen=True)
class NodeView:
    """What the scheduler needs of one node, parsed once from the raw node."""

    name: str
    allocatable: ResourceVector
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    ready: bool


def parse_node(node: Mapping[str, Any]) -> NodeView:
    """The typed view of a raw node; raises `NodeSpecError` naming the bad field."""
    error = NodeSpecError
    metadata = payload.mapping(node.get("metadata"), field="metadata", error=error, required=True)
    spec = payload.mapping(node.get("spec"), field="spec", error=error)
    status = payload.mapping(node.get("status"), field="status", error=error)
    taints = []
    for position, raw in enumerate(payload.items(spec.get("taints"), field="spec.taints", error=error)):
        field = f"spec.taints[{position}]"
        taint = payload.mapping(raw, field=field, error=error, required=True)
        effect = payload.string(taint.get("effect"), field=f"{field}.effect", error=error, required=True)
        if effect not in TAINT_EFFECTS:
            raise NodeSpecError(field=f"{field}.effect", reason=f"unknown effect {effect!r}")
        taints.append(
            Taint(
                key=payload.string(taint.get("key"), field=f"{field}.key", error=error, required=True),
                value=payload.string(taint.get("value"), field=f"{field}.value", error=error),
                effect=effect,
            )
        )
    ready = False
    for position, raw in enumerate(payload.items(status.get("conditions"), field="status.conditions", error=error)):
        condition = payload.mapping(raw, field=f"status.conditions[{position}]", error=error, required=True)
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    return NodeView(
        name=payload.string(metadata.get("name"), field="metadata.name", error=error, required=True),
        allocatable=node_allocatable(node),
        labels=payload.string_map(metadata.get("labels"), field="metadata.labels", error=error),
        taints=tuple(taints),
        unschedulable=payload.boolean(spec.get("unschedulable"), field="spec.unschedulable", error=error),
        ready=ready,
    )
