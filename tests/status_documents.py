"""The dispatcher's /status documents made for tests (what `hoss status` and the dashboard render)."""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.status import LedgerStatus, QueueStatus, SystemStatus, ThroughputStatus, WorkerStatus


def worker_row(worker_id: str, *, alive: bool, routed: bool | None) -> WorkerStatus:
    """A /status worker row with nothing queued."""
    return WorkerStatus(id=worker_id, policies=["default"], alive=alive, routed=routed, queue_depth=0, in_flight=0,
                        outstanding=0, heartbeat_age_seconds=0.5 if alive else None, counters={})


def status_with(workers: Sequence[WorkerStatus] = (), *, ledger: LedgerStatus | None = None) -> SystemStatus:
    """A leader's /status with these workers (and this ledger) and nothing else."""
    return SystemStatus(
        leader=True, identity="d1", leader_identity="d1", redis="ok", conflicts=0, workers=list(workers),
        queues=QueueStatus(pending_total=0, undispatched=0, waiting_for_worker=[]),
        throughput=ThroughputStatus(bound_per_second_1m=0.0, dispatched_total=0, bound_total=0),
        ledger=ledger, resolver=None,
    )
