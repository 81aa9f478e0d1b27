"""Routing decisions, pure: which policy a pod asks for, and which live worker gets it.

Power of two choices: of the live workers serving the policy, two are drawn at random and the less loaded one
wins. It spreads load nearly as well as picking the global minimum, and it does not send every pod of a burst to
the one worker that looked idlest in a stale heartbeat.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.queue import WorkerInfo

POLICY_LABEL = "hoss.io/policy"


def policy_of(pod: Mapping[str, Any], *, default: str) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(POLICY_LABEL)
    return str(value) if value else default


def choose_worker(
    workers: Sequence[WorkerInfo], policy: str, *, loads: Mapping[str, int], rng: random.Random
) -> WorkerInfo | None:
    """The worker to send a ``policy`` pod to, or None when no live worker serves it.

    ``loads`` is each worker's outstanding work as the dispatcher counts it (sent and not yet acknowledged);
    a worker missing from it counts its own heartbeat's queue depth and in-flight.
    """
    serving = [w for w in workers if w.serves(policy)]
    if not serving:
        return None
    if len(serving) == 1:
        return serving[0]
    first, second = rng.sample(serving, 2)

    def load(worker: WorkerInfo) -> int:
        return loads.get(worker.id, worker.load)

    return first if load(first) <= load(second) else second
