"""NodeResourcesFit: the pod's whole request must fit in every node's free resources. Pure, vectorised.

Free is allocatable minus the ledger's usage (bound + assumed). Every requested resource counts -- cpu, memory,
pods, GPUs, hugepages, any extended resource -- and a resource a node does not report has nothing free there, so
a GPU pod never fits a CPU node. This is the same rule the ledger's reserve script applies, so a node this filter
passes is one the reservation can take unless another worker got there first.
"""

from __future__ import annotations

from hoss.framework.cycle import BoolArray, FilterResult, TakesNoArgs
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView

TOO_MANY_PODS = "Too many pods"


def insufficient_reason(resource: str) -> str:
    """kube-scheduler's reason for a resource the node has too little of."""
    return TOO_MANY_PODS if resource == "pods" else f"Insufficient {resource}"


class NodeResourcesFit(TakesNoArgs):
    """Filter: rejects nodes without room for the request, with one reason per short resource."""

    name = "NodeResourcesFit"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        reasons: dict[str, BoolArray] = {}
        for resource, amount in pod.request.items():
            if amount <= 0:
                continue
            short = nodes.free_column(resource) < amount
            if short.any():
                reasons[insufficient_reason(resource)] = short
        return FilterResult.from_reasons(len(nodes), reasons)
