"""Where the ledger differs from the mirror of the apiserver: what the sync's audit (resolver/sync.py) counts, logs
and repairs by a rebuild. Pure: the audit reads the ledger and the mirror under the sync's lock and passes them in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from hoss.ledger.arguments import BoundPod
from hoss.ledger.results import LedgerSnapshot, PodEntry
from resolver.mirror import NodeRecord


def ledger_drift(
    *,
    nodes: Mapping[str, NodeRecord],
    snapshot: LedgerSnapshot,
    entries: Iterable[PodEntry],
    expected: Mapping[str, BoundPod],
    reservations: Collection[str],
) -> list[str]:
    """Each difference, in words: a node whose allocatable is not the apiserver's, a bound entry the apiserver does
    not have, an entry in another state, node or request than its pod's, a bound pod the ledger misses.

    ``expected`` holds what the ledger must hold as bound, by uid; ``reservations`` names the uids of Available
    Reservations, whose entries may hold less than their request (what their owners have not taken).
    """
    drift: list[str] = []
    for name, (alloc, _labels, _spec) in nodes.items():
        node = snapshot.nodes.get(name)
        if node is None or node.alloc != alloc:
            drift.append(f"node {name}: allocatable {None if node is None else node.alloc}, not {alloc}")
    seen = set()
    for entry in entries:
        want = expected.get(entry.uid)
        if want is None:
            if entry.state == "bound":
                drift.append(f"{entry.pod} bound on {entry.node} in the ledger, not in the apiserver")
            continue
        seen.add(entry.uid)
        # A Reservation's entry holds what its owners have not taken (hoss/ledger/lua/common.lua,
        # 'Reservations' shares'): at most its request.
        shared = entry.uid in reservations and set(entry.request) == set(want.request) and all(
            0 <= entry.request[r] <= amount for r, amount in want.request.items())
        if entry.state != "bound" or entry.node != want.node or (
                entry.request != dict(want.request) and not shared):
            drift.append(f"{want.pod} on {want.node} {dict(want.request)}: ledger has {entry.state} on "
                         f"{entry.node} {entry.request}")
    drift.extend(f"{p.pod} bound on {p.node} missing from the ledger"
                 for uid, p in expected.items() if uid not in seen)
    return drift
