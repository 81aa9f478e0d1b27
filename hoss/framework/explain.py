"""Why a pod cannot run on each node, with the figures: the first filter of its profile that rejects it there, as the
worker's decision reports it, and what that filter measured. Pure, no I/O, and never on the worker's path.

The worker counts rejection reasons over all nodes (kube-scheduler's FitError message, `cycle.run_filters`); this
module keeps them per node. It runs the same filters over the same table in the same order, by the same rule (a
node is reported under the first filter that rejects it, with that filter's reasons for it), so a node is rejected
here exactly when the worker rejects it, and for the same reasons; the worker's loop stays as it was, at its cost.
Then it asks that filter for its figures on the nodes it was the first to reject: free against asked for a
resource, the taint not tolerated, the node-affinity requirement not met, the node's pool, the spread constraint's
skew. A filter gives them through an optional ``figures(pod, nodes, rows)`` method (`ExplainingFilter`); a filter
without it (a custom plugin) is reported with its reasons alone.

Nodes with the same filter, reasons and `Figures.group` form one class (`classes`): on 5,000 nodes the answer is a
handful of lines, each with the node of its class that comes closest to passing. `score_parts` splits the total
score of the feasible nodes into the profile's weighted plugins (the terms `cycle.evaluate` sums).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hoss.framework.cycle import (
    BoolArray,
    FilterPlugin,
    FloatArray,
    Profile,
    check_shape,
    normalized_score,
    skips_pod,
    unexplained_reason,
)
from hoss.framework.errors import PluginError
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]


@dataclass(frozen=True)
class Figures:
    """What a filter measured on one node it rejected."""

    text: str
    """For people: ``cpu: asked 3, free 2 of 16``."""
    group: str
    """The part of `text` that the nodes of one class share (the allocatable, not the free amount): nodes with the
    same filter, reasons and group form one class."""
    values: Mapping[str, JsonValue] = field(default_factory=dict)
    """The same figures for programs (base units: milli-CPU, bytes, counts)."""
    closeness: float = 0.0
    """Orders the nodes of one class: the highest is the nearest to passing (e.g. the most free of the short
    resource for the request)."""


class ExplainingFilter(FilterPlugin, Protocol):
    """A filter that can say, per node it rejected, what it measured there."""

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """The figures of each of `rows` (nodes this filter rejects), in that order."""
        ...


@dataclass(frozen=True)
class NodeVerdict:
    """One node's verdict for the pod."""

    node: str
    filter: str
    """The first filter that rejects the pod there; "" when every filter passes it."""
    reasons: tuple[str, ...] = ()
    """That filter's reasons for this node, kube-scheduler's words (several when e.g. two resources are short)."""
    figures: Figures | None = None

    @property
    def feasible(self) -> bool:
        return not self.filter


@dataclass(frozen=True)
class FilterExplanation:
    """Every node's verdict, by row of the table, and the feasible mask they add up to."""

    feasible: BoolArray
    verdicts: list[NodeVerdict]


def explain_filters(filters: Sequence[FilterPlugin], pod: PodView, nodes: NodeTable) -> FilterExplanation:
    """Per node, the first of `filters` that rejects `pod` there, its reasons and its figures: `cycle.run_filters`'s
    rule kept per node (a unit test holds the two to the same counts)."""
    rows = len(nodes)
    feasible = np.ones(rows, dtype=np.bool_)
    first: dict[int, tuple[str, tuple[str, ...], Figures | None]] = {}
    for plugin in filters:
        result = plugin.filter(pod, nodes)
        check_shape(plugin.name, result.mask, rows=rows)
        newly_rejected = feasible & ~result.mask
        feasible &= result.mask
        if not newly_rejected.any():
            continue
        reasons: dict[int, list[str]] = {}
        for reason, marked in result.reasons.items():
            check_shape(plugin.name, marked, rows=rows)
            for row in np.flatnonzero(marked & newly_rejected).tolist():
                reasons.setdefault(row, []).append(reason)
        these = np.flatnonzero(newly_rejected).tolist()
        measure = getattr(plugin, "figures", None)
        figures: list[Figures | None] = list(measure(pod, nodes, these)) if measure is not None else [None] * len(these)
        if len(figures) != len(these):
            raise PluginError(f"plugin {plugin.name} gave figures for {len(figures)} nodes, not {len(these)}")
        for row, measured in zip(these, figures, strict=True):
            first[row] = (plugin.name, tuple(reasons.get(row) or [unexplained_reason(plugin.name)]), measured)
    verdicts = []
    for row, name in enumerate(nodes.names):
        plugin_name, why, measured = first.get(row, ("", (), None))
        verdicts.append(NodeVerdict(node=name, filter=plugin_name, reasons=why, figures=measured))
    return FilterExplanation(feasible=feasible, verdicts=verdicts)


@dataclass(frozen=True)
class VerdictClass:
    """Nodes that reject the pod alike: the same filter, reasons and figures' group."""

    filter: str
    reasons: tuple[str, ...]
    group: str
    nodes: list[str]
    """The class's nodes, by name."""
    closest: NodeVerdict
    """The node of the class that comes nearest to passing (the highest `Figures.closeness`, then by name)."""


def classes(verdicts: Sequence[NodeVerdict]) -> list[VerdictClass]:
    """The rejected nodes grouped into classes, the largest first (then by filter and group)."""
    grouped: dict[tuple[str, tuple[str, ...], str], list[NodeVerdict]] = {}
    for verdict in verdicts:
        if verdict.feasible:
            continue
        group = verdict.figures.group if verdict.figures is not None else ""
        grouped.setdefault((verdict.filter, verdict.reasons, group), []).append(verdict)
    found = []
    for (name, reasons, group), members in grouped.items():
        members.sort(key=lambda v: v.node)
        closest = max(members, key=lambda v: v.figures.closeness if v.figures is not None else 0.0)
        found.append(VerdictClass(filter=name, reasons=reasons, group=group, nodes=[v.node for v in members],
                                  closest=closest))
    found.sort(key=lambda c: (-len(c.nodes), c.filter, c.group, c.reasons))
    return found


def score_parts(profile: Profile, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> dict[str, FloatArray]:
    """Per score plugin of the profile (skipped ones left out), its weighted normalised score per row: the terms of
    the total `cycle.evaluate` ranks the feasible nodes by."""
    parts: dict[str, FloatArray] = {}
    if not feasible.any():
        return parts
    for plugin, weight in profile.scores:
        if not skips_pod(plugin, pod, nodes):
            parts[plugin.name] = parts.get(plugin.name, 0) + weight * normalized_score(plugin, pod, nodes, feasible)
    return parts
