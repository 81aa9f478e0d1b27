"""NodePorts: the pod's host ports must be free on the node. Pure, vectorised over the pods holding each port.

kube-scheduler's rule (``HostPortInfo.CheckConflict``): ports are (protocol, hostIP, hostPort) with an empty
protocol read as TCP and an empty hostIP as 0.0.0.0; a wanted port conflicts with a held one of the same
protocol and port when the IPs are equal or either is 0.0.0.0. Held ports are those of every pod with a ledger
entry on the node, bound or reserved (`NodeTable.port_taken`, fed from the ledger's change stream), so a pod a
worker just reserved counts at once. The ledger's reserve scripts apply the same rule atomically, so two workers
racing for one port on one node cannot both win. A rejected node reads ``node(s) didn't have free ports for the
requested pod ports``; its figures (`hoss why`) name each port taken there and the pods that hold it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hoss.framework.cycle import FilterResult, TakesNoArgs
from hoss.framework.explain import Figures, JsonValue
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView

PORTS_TAKEN = "node(s) didn't have free ports for the requested pod ports"


class NodePorts(TakesNoArgs):
    """Filter: rejects nodes where a pod already holds one of the pod's host ports."""

    name = "NodePorts"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        if not pod.host_ports:
            return FilterResult.from_reasons(rows, {})
        taken = np.zeros(rows, dtype=np.bool_)
        for port in pod.host_ports:
            taken |= nodes.port_taken(port)
        return FilterResult.from_reasons(rows, {PORTS_TAKEN: taken} if taken.any() else {})

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """Per node, the pod's host ports taken there, each with the pods (namespace/name) holding it."""
        found = []
        for row in rows:
            node = nodes.names[row]
            placed = [nodes.pods[uid] for uid in sorted(nodes.pods_on.get(node, ()))]
            taken: dict[str, JsonValue] = {}
            for port in pod.host_ports:
                holders: list[JsonValue] = [f"{p.namespace}/{p.name or p.uid}" for p in placed
                                            if any(held.conflicts(port) for held in p.ports)]
                if holders:
                    taken[str(port)] = holders
            text = "; ".join(f"host port {port} held by {', '.join(map(str, holders))}"
                             for port, holders in taken.items() if isinstance(holders, list))
            found.append(Figures(text=text, group="host port(s) " + ", ".join(taken), values={"ports": taken}))
        return found
