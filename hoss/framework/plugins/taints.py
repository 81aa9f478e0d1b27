"""TaintToleration and NodeUnschedulable: nodes that repel the pod. Pure, vectorised.

TaintToleration rejects a node with a ``NoSchedule`` or ``NoExecute`` taint the pod does not tolerate
(``PreferNoSchedule`` is a preference, left to scoring). A node is reported under its first untolerated taint,
in the node's own taint order, as kube-scheduler prints it: ``node(s) had untolerated taint {key: value}``.
The tolerations are checked once per distinct taint in the cluster, not per node.

As a score (kube-scheduler's default weight 3), TaintToleration counts per node the ``PreferNoSchedule`` taints
that none of the pod's tolerations with effect ``PreferNoSchedule`` or empty tolerates, and normalises in
reverse as kube-scheduler does: ``100 - 100 * count // max`` over the feasible nodes (all 100 when no feasible
node has such a taint), so the nodes with the fewest untolerated preferences win.

NodeUnschedulable rejects cordoned nodes (``spec.unschedulable``) unless the pod tolerates
``node.kubernetes.io/unschedulable:NoSchedule``.

Their figures (`hoss why`): the node's first untolerated taint in full (key, value and effect), and the cordon.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hoss.framework.cycle import BoolArray, FilterResult, FloatArray, TakesNoArgs, default_normalize
from hoss.framework.explain import Figures
from hoss.framework.node import Taint
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
PREFER_NO_SCHEDULE = "PreferNoSchedule"
UNSCHEDULABLE_TAINT = Taint(key="node.kubernetes.io/unschedulable", value="", effect="NoSchedule")
UNSCHEDULABLE = "node(s) were unschedulable"


def untolerated_reason(taint: Taint) -> str:
    """kube-scheduler's reason for a node whose first untolerated taint is `taint`."""
    return f"node(s) had untolerated taint {taint}"


class TaintToleration(TakesNoArgs):
    """Filter: rejects nodes with a NoSchedule/NoExecute taint the pod does not tolerate."""

    name = "TaintToleration"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        columns = [
            column
            for column, taint in enumerate(nodes.taint_kinds)
            if taint.effect in BLOCKING_EFFECTS and not pod.tolerates(taint)
        ]
        if not columns:
            return FilterResult.from_reasons(rows, {})
        positions = nodes.taint_positions[:, columns]
        present = positions >= 0
        rejected = present.any(axis=1)
        # The untolerated taint listed first on each node: the smallest position among the present ones.
        first = np.argmin(np.where(present, positions, np.iinfo(np.int32).max), axis=1)
        reasons: dict[str, BoolArray] = {}
        for slot, column in enumerate(columns):
            marked = rejected & (first == slot)
            if marked.any():
                reason = untolerated_reason(nodes.taint_kinds[column])
                # Two taints that differ only by effect print the same.
                reasons[reason] = reasons[reason] | marked if reason in reasons else marked
        return FilterResult.from_reasons(rows, reasons)

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """Per node, its first NoSchedule/NoExecute taint (in the node's order) that the pod does not tolerate."""
        found = []
        for row in rows:
            taint = next((t for t in nodes.taints[row] if t.effect in BLOCKING_EFFECTS and not pod.tolerates(t)), None)
            if taint is None:
                found.append(Figures(text="", group=""))
                continue
            spelled = f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"
            text = f"taint {spelled} not tolerated"
            found.append(Figures(text=text, group=text,
                                 values={"key": taint.key, "value": taint.value, "effect": taint.effect}))
        return found

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        """How many PreferNoSchedule taints of each node the pod's PreferNoSchedule tolerations leave untolerated."""
        tolerations = [t for t in pod.tolerations if t.effect in ("", PREFER_NO_SCHEDULE)]
        columns = [
            column
            for column, taint in enumerate(nodes.taint_kinds)
            if taint.effect == PREFER_NO_SCHEDULE and not any(t.tolerates(taint) for t in tolerations)
        ]
        if not columns:
            return np.zeros(len(nodes), dtype=np.float64)
        counts: FloatArray = (nodes.taint_positions[:, columns] >= 0).sum(axis=1).astype(np.float64)
        return counts

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return default_normalize(scores, feasible, reverse=True)


class NodeUnschedulable(TakesNoArgs):
    """Filter: rejects cordoned nodes unless the pod tolerates the unschedulable taint."""

    name = "NodeUnschedulable"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        if pod.tolerates(UNSCHEDULABLE_TAINT) or not nodes.unschedulable.any():
            return FilterResult.from_reasons(rows, {})
        return FilterResult.from_reasons(rows, {UNSCHEDULABLE: nodes.unschedulable.copy()})

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """The cordon, the same on every node it rejects."""
        text = (f"cordoned (spec.unschedulable); the pod does not tolerate {UNSCHEDULABLE_TAINT.key}:"
                f"{UNSCHEDULABLE_TAINT.effect}")
        return [Figures(text=text, group=text, values={"unschedulable": True}) for _row in rows]
