"""NodeResourcesFit: the pod's whole request must fit in every node's free resources. Pure, vectorised.

Free is allocatable minus the ledger's usage (bound + assumed). Every requested resource counts -- cpu, memory,
pods, GPUs, hugepages, any extended resource -- and a resource a node does not report has nothing free there, so
a GPU pod never fits a CPU node. This is the same rule the ledger's reserve script applies, so a node this filter
passes is one the reservation can take unless another worker got there first. An extended resource a DeviceClass
serves (`PodView.dra_resources`) is checked only where the node has it in allocatable (a device plugin serves it
there); a node without it leaves it to DynamicResources, as kube-scheduler's shouldDelegateResourceToDRA.

Its figures (`hoss why`): per short resource, asked against free and allocatable; the nodes whose allocatable is the
same form one class, and the one with the most free (for the request) comes closest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hoss.framework.cycle import BoolArray, FilterResult, TakesNoArgs
from hoss.framework.explain import Figures, JsonValue
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView
from hoss.model.resources import format_quantity

TOO_MANY_PODS = "Too many pods"


def insufficient_reason(resource: str) -> str:
    """kube-scheduler's reason for a resource the node has too little of."""
    return TOO_MANY_PODS if resource == "pods" else f"Insufficient {resource}"


class NodeResourcesFit(TakesNoArgs):
    """Filter: rejects nodes without room for the request, with one reason per short resource."""

    name = "NodeResourcesFit"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        reasons: dict[str, BoolArray] = {}
        dra = pod.dra_resources
        for resource, amount in pod.request.items():
            if amount <= 0:
                continue
            short = nodes.free_column(resource) < amount
            if resource in dra:
                short &= nodes.alloc_column(resource) > 0
            if short.any():
                reasons[insufficient_reason(resource)] = short
        return FilterResult.from_reasons(len(nodes), reasons)

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """Per node, each short resource: asked, free and allocatable."""
        picked = np.asarray(rows, dtype=np.intp)
        columns = [(resource, amount, nodes.free_column(resource)[picked], nodes.alloc_column(resource)[picked])
                   for resource, amount in pod.request.items() if amount > 0]
        found = []
        for position in range(len(rows)):
            short = [(resource, amount, int(free[position]), int(alloc[position]))
                     for resource, amount, free, alloc in columns if free[position] < amount
                     and (resource not in pod.dra_resources or alloc[position] > 0)]
            values: dict[str, JsonValue] = {resource: {"asked": amount, "free": free, "allocatable": alloc}
                                            for resource, amount, free, alloc in short}
            found.append(Figures(
                text="; ".join(f"{resource}: asked {format_quantity(resource, amount)}, free "
                               f"{format_quantity(resource, free)} of {format_quantity(resource, alloc)}"
                               for resource, amount, free, alloc in short),
                group="; ".join(f"{resource}: asked {format_quantity(resource, amount)}, allocatable "
                                f"{format_quantity(resource, alloc)}" for resource, amount, _free, alloc in short),
                values=values,
                closeness=min((max(free, 0) / amount for resource, amount, free, _alloc in short), default=0.0),
            ))
        return found
