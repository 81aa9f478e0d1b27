"""One round of the rescheduler: read the cluster, pick a plan, carry it out (or only report it in a dry run).

Which plan: first the pending GPU pods, oldest first (a pod with the hoss.io/defragment scheduling gate at once,
others once they have waited ``min_pending_seconds``): the first that a plan of at most ``max_moves`` moves helps
(`plan.plan_for_pending`). Then, when the GPUs stranded on partly used nodes add up to ``min_stranded_gpus``, the
periodic pass (`plan.plan_defragment`). A gated pod that no plan helps has its gate removed at once: it schedules
as it would have.

The last plans and their outcomes are kept (`Rescheduler.status`) for the process's /status and written to Redis
(``{hoss}:resched:status``, JSON) where the dispatcher's /status and dashboard read them.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from redis.asyncio import Redis

from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from hoss.ledger.keys import RESCHED_STATUS_KEY
from hoss.model.objects import Json
from rescheduler.cluster import ClusterView, read_cluster
from rescheduler.execute import EvictionLimit, Executor, PlanRecord
from rescheduler.metrics import ReschedulerMetrics
from rescheduler.plan import Plan, fragmentation, plan_defragment, plan_for_pending
from rescheduler.settings import ReschedulerSettings

log = logging.getLogger(__name__)

STATUS_KEY = RESCHED_STATUS_KEY
"""Where the leader publishes its status (JSON) for the dispatcher's /status and dashboard."""


def _age_seconds(raw: Json, now: float) -> float:
    created = (raw.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(created, str):
        return 0.0
    try:
        stamp = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return now - stamp.timestamp()


def choose(view: ClusterView, settings: ReschedulerSettings, *, now: float | None = None) -> tuple[Plan | None,
                                                                                                   list[str]]:
    """The plan to carry out (or None), and the uids of gated pods no plan helps (their gate is to be removed)."""
    now = time.time() if now is None else now
    ungate: list[str] = []
    for pod in view.pending:
        gated = pod.uid in view.gated
        if not gated and _age_seconds(view.raw[pod.uid], now) < settings.min_pending_seconds:
            continue
        plan = plan_for_pending(pod, view.nodes, view.placed, allowed=view.allowed, max_moves=settings.max_moves)
        if plan is not None:
            return plan, ungate
        if gated:
            ungate.append(pod.uid)
    if settings.min_stranded_gpus > 0:
        spread = fragmentation((n.gpus, n.used.get("nvidia.com/gpu", 0) + n.held.get("nvidia.com/gpu", 0))
                               for n in view.nodes)
        if spread.stranded >= settings.min_stranded_gpus:
            return plan_defragment(view.nodes, view.placed, allowed=view.allowed,
                                   max_moves=settings.max_moves), ungate
    return None, ungate


@dataclass
class RoundResult:
    plan: Plan | None
    record: PlanRecord | None
    """None in a dry run, or when there was no plan."""


class Rescheduler:
    """Rounds over one apiserver and ledger (the process runs them while it leads; `hoss reschedule` runs one)."""

    def __init__(self, settings: ReschedulerSettings, *, rest: KubeREST, ledger: Ledger,
                 redis: Redis | None = None) -> None:
        self.settings = settings
        self.rest = rest
        self.ledger = ledger
        self.redis = redis
        self.metrics = ReschedulerMetrics()
        """Served on the process's /metrics (`rescheduler.metrics`)."""
        self.executor = Executor(rest, ledger, limit=EvictionLimit(settings.max_evictions_per_minute),
                                 hold_seconds=settings.hold_seconds,
                                 outcome_timeout_seconds=settings.outcome_timeout_seconds,
                                 record=self._post_event, metrics=self.metrics)
        self.rounds = 0
        self.last_round: float | None = None
        self.last_fragmentation: Json | None = None
        self.dry_plans: list[Json] = []
        self._posting: set[asyncio.Task[None]] = set()
        self.dry_run_round = False

    def _post_event(self, event: Json) -> None:
        """Posted at once (a plan may wait minutes for its outcome), in the background."""
        if self.dry_run_round:
            return
        task = asyncio.get_running_loop().create_task(self._post(event))
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def _post(self, event: Json) -> None:
        try:
            await self.rest.create_event(event)
        except Exception as error:
            log.warning("cannot record event %s: %s", event.get("reason"), error)

    async def round(self, *, dry_run: bool | None = None) -> RoundResult:
        dry = self.settings.dry_run if dry_run is None else dry_run
        self.dry_run_round = dry
        view = await read_cluster(self.rest, self.ledger, node_selector=self.settings.node_labels,
                                  movable_kinds=self.settings.movable_owner_kinds,
                                  scheduler_names=self.settings.scheduler_names)
        plan, ungate = choose(view, self.settings)
        self.rounds += 1
        self.last_round = time.time()
        spread = fragmentation((n.gpus, n.used.get("nvidia.com/gpu", 0)) for n in view.nodes)
        self.last_fragmentation = vars(spread)
        self.metrics.rounds.inc()
        self.metrics.stranded_gpus.set(spread.stranded)
        self.metrics.whole_free_nodes.set(spread.whole_free)
        record = None
        if dry:
            if plan is not None:
                self.dry_plans = [plan_json(plan)]
                self.metrics.plans.labels(plan.reason, "dry run").inc()
        else:
            for uid in ungate:
                await self.executor.release_gate(view.raw[uid])
            if plan is not None:
                record = await self.executor.run(plan, view)
            if self._posting:
                await asyncio.wait(set(self._posting), timeout=10)
        self.metrics.last_round.set(time.time())
        await self.publish()
        return RoundResult(plan=plan, record=record)

    def status(self) -> Json:
        return {
            "dry_run": self.settings.dry_run,
            "rounds": self.rounds,
            "last_round": self.last_round,
            "evictions": self.executor.evictions,
            "fragmentation": self.last_fragmentation,
            "plans": [r.to_json() for r in self.executor.history] or self.dry_plans,
            "settings": {"interval_seconds": self.settings.interval_seconds,
                         "min_stranded_gpus": self.settings.min_stranded_gpus,
                         "max_moves": self.settings.max_moves,
                         "max_evictions_per_minute": self.settings.max_evictions_per_minute},
        }

    async def publish(self) -> None:
        if self.redis is None:
            return
        try:
            await self.redis.set(STATUS_KEY, orjson.dumps({**self.status(), "published": time.time()}))
        except Exception as error:
            log.warning("cannot publish the rescheduler status: %s", error)


def plan_json(plan: Plan) -> Json:
    return {"reason": plan.reason, "pending": plan.pending.key if plan.pending else None,
            "pending_node": plan.pending_node or None,
            "moves": [{"pod": m.pod.key, "gpus": m.pod.gpus, "from": m.source, "to": m.target} for m in plan.moves],
            "before": vars(plan.before), "after": vars(plan.after), "outcome": "dry run"}


def describe(plan: Plan | None, lines: Sequence[str] = ()) -> str:
    if plan is None:
        return "no plan: nothing to move (no pending GPU pod a move would help, fragmentation under the threshold)"
    return "\n".join([*plan.describe(), *lines])
