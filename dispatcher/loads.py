"""What the dispatcher knows of its workers' load: the pod uids each holds (`Assignments`, the dispatched map with
running counts), and per live worker its backlog and whether it stalled, from its heartbeats and the work sent to
it since (`WorkerWatch`). Pure: times are passed in.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

from hoss.queue import WorkerInfo


class Assignments(dict[str, str]):
    """pod uid -> worker id, with a running count of uids per worker (no recount per dispatch)."""

    def __init__(self, initial: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        for uid, worker in (initial or {}).items():
            self[uid] = worker

    def __setitem__(self, uid: str, worker: str) -> None:
        previous = self.get(uid)
        if previous is not None:
            self.counts[previous] -= 1
        super().__setitem__(uid, worker)
        self.counts[worker] += 1

    def __delitem__(self, uid: str) -> None:
        self.counts[self[uid]] -= 1
        super().__delitem__(uid)

    def pop(self, uid: str, default: Any = None) -> Any:
        if uid in self:
            self.counts[self[uid]] -= 1
        return super().pop(uid, default)


def worker_loads(workers: Sequence[WorkerInfo], dispatched: Mapping[str, str]) -> dict[str, int]:
    """Outstanding uids per live worker as the dispatched map counts them (0 for a worker with none)."""
    counts = dispatched.counts if isinstance(dispatched, Assignments) else collections.Counter(dispatched.values())
    return {worker.id: counts[worker.id] for worker in workers}


class WorkerWatch:
    """Per worker: its heartbeat's progress as last seen, the first send since that progress last moved, and the
    sends its last heartbeat does not count yet."""

    def __init__(self) -> None:
        self.progress: dict[str, tuple[float, int]] = {}
        """worker id -> (started_unix, progress) last seen."""
        self.sent_since: dict[str, float] = {}
        """worker id -> monotonic time of the first send since its progress last moved."""
        self.sends: dict[str, collections.deque[tuple[float, int]]] = {}
        """worker id -> (unix time, pods) of each send."""
        self.routed: collections.Counter[str] = collections.Counter()
        """worker id -> pods sent to it, while it lives (hoss_dispatcher_pods_routed_total)."""

    def stalled(self, live: Sequence[WorkerInfo], *, now: float, stall_seconds: float) -> set[str]:
        """Live workers that were sent work ``stall_seconds`` ago and have not read or decided anything since
        (their heartbeat's progress counter stood still): a loop of theirs is stuck."""
        stalled: set[str] = set()
        for worker in live:
            seen = (worker.started_unix, worker.progress)
            if self.progress.get(worker.id) != seen:
                self.progress[worker.id] = seen
                self.sent_since.pop(worker.id, None)
                continue
            since = self.sent_since.get(worker.id)
            if since is not None and now - since >= stall_seconds:
                stalled.add(worker.id)
        return stalled

    def note_beats(self, live: Sequence[WorkerInfo]) -> None:
        """Forget the sends that every live worker's heartbeat already counts (and those of workers gone)."""
        beats = {worker.id: worker.heartbeat_unix for worker in live}
        for worker_id in [w for w in self.routed if w not in beats]:
            del self.routed[worker_id]  # its series ends with it
        for worker_id in list(self.sends):
            sends = self.sends[worker_id]
            if worker_id not in beats:
                del self.sends[worker_id]
                continue
            while sends and sends[0][0] <= beats[worker_id]:
                sends.popleft()

    def backlog(self, workers: Sequence[WorkerInfo], *, now_unix: float) -> dict[str, int]:
        """Each worker's pods waiting for a decision, as far as the dispatcher can tell: those its last heartbeat
        called ready plus those sent since, less what it decides at its ``decide_rate`` in the time since that beat
        (dispatcher/routing.py)."""
        backlog = {}
        for worker in workers:
            since = sum(n for when, n in self.sends.get(worker.id, ()) if when > worker.heartbeat_unix)
            decided = worker.decide_rate * max(0.0, now_unix - worker.heartbeat_unix)
            backlog[worker.id] = max(0, round(worker.ready + since - decided))
        return backlog

    def sent(self, worker_id: str, pods: int, *, now: float, now_unix: float) -> None:
        """`pods` were sent to the worker at monotonic time ``now`` (``now_unix`` on the wall clock)."""
        self.sends.setdefault(worker_id, collections.deque()).append((now_unix, pods))
        self.routed[worker_id] += pods
        self.sent_since.setdefault(worker_id, now)

    def forget(self, worker_id: str) -> None:
        """The worker's work was taken back: what was seen of its progress no longer matters."""
        self.progress.pop(worker_id, None)
        self.sent_since.pop(worker_id, None)


def worker_figures(workers: Sequence[WorkerInfo], dispatched: Mapping[str, str], watch: WorkerWatch, *,
                   now_unix: float) -> dict[str, dict[str, float]]:
    """Per worker routed to, what /metrics shows of it (dispatcher.metrics.WorkersCollector): its estimated backlog,
    the pods assigned to it, its heartbeat's age and the pods sent to it."""
    backlog = watch.backlog(workers, now_unix=now_unix)
    assigned = worker_loads(workers, dispatched)
    return {worker.id: {"backlog": backlog[worker.id], "assigned": assigned[worker.id],
                        "heartbeat_age_seconds": max(now_unix - worker.heartbeat_unix, 0.0),
                        "routed": watch.routed[worker.id]} for worker in workers}
