"""TaintToleration and NodeUnschedulable: nodes that repel the pod. Pure, vectorised.

TaintToleration rejects a node with a ``NoSchedule`` or ``NoExecute`` taint the pod does not tolerate
(``PreferNoSchedule`` is a preference, left to scoring). A node is reported under its first untolerated taint,
in the node's own taint order, as kube-scheduler prints it: ``node(s) had untolerated taint {key: value}``.
The tolerations are checked once per distinct taint in the cluster, not per node.

NodeUnschedulable rejects cordoned nodes (``spec.unschedulable``) unless the pod tolerates
``node.kubernetes.io/unschedulable:NoSchedule``.
"""

from __future__ import annotations

import numpy as np

from workers.framework import BoolArray, FilterResult, TakesNoArgs
from workers.nodes import NodeTable, Taint
from workers.pod import PodView

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
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


class NodeUnschedulable(TakesNoArgs):
    """Filter: rejects cordoned nodes unless the pod tolerates the unschedulable taint."""

    name = "NodeUnschedulable"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        if pod.tolerates(UNSCHEDULABLE_TAINT) or not nodes.unschedulable.any():
            return FilterResult.from_reasons(rows, {})
        return FilterResult.from_reasons(rows, {UNSCHEDULABLE: nodes.unschedulable.copy()})
