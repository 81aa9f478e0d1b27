"""Carrying out a move plan: hold the room first, then evict, then watch the replacements take the held room.

1. **Hold.** Every target of the plan and the pending pod's node are held in the ledger in one all-or-nothing call
   (`Ledger.hold_moves`) before anything is evicted. A hold counts what the plan's own evictions free on its node,
   has a priority above every pod's (no other pod, no other worker, no foreign binding may take the room; the
   webhook judges foreign bindings with the same scripts) and ends at its deadline (``hold_seconds``) if nobody
   claims it. The pending pod's hold is keyed by its uid; a moved pod's hold by ``move/<uid>`` with its
   controller's uid as owner: the replacement its controller creates (same controller, a request no larger)
   claims it, whatever its name. Workers steer both onto the held node (`hoss.framework.feed.NodeFeed.held_nodes`).
2. **Evict** each moved pod through the Eviction API with a uid precondition: PodDisruptionBudgets are honoured by
   the apiserver. A refused eviction stops the plan: the holds of the pods not evicted, and the pending pod's,
   are dropped. A ``Normal Rescheduled`` event goes on every moved pod and a ``Defragmenting`` event on every
   node involved. Evictions are rate-limited for the whole process (``max_evictions_per_minute``): a plan that
   would exceed the limit waits for the next round.
3. **Release the gate** of a pending pod created with the ``hoss.io/defragment`` scheduling gate.
4. **Outcome.** The plan is complete when every hold was claimed (the replacements and the pending pod reserved
   their room); after ``outcome_timeout_seconds`` what is left is dropped and the plan is reported as timed out.
   A replacement that asks more than the pod it replaces (its controller's template changed meanwhile) cannot
   claim the hold: while waiting, the executor looks at the moved pods' replacements, drops the hold of one that
   asks more at once (the pod is placed as any pod, where it fits), and reports the plan ``replacement larger``
   naming it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hoss.errors import HossError
from hoss.kube.client import KubeError
from hoss.kube.events import node_event, pod_event
from hoss.kube.rest import KubeREST, segment
from hoss.ledger.arguments import MoveHold
from hoss.ledger.client import Ledger
from hoss.ledger.results import Conflict, UnknownNode
from hoss.model import compact
from hoss.model.objects import Json
from hoss.model.resources import format_quantity, pod_requests
from rescheduler.cluster import DEFRAGMENT_GATE, ClusterView
from rescheduler.metrics import REFUSED_BY_EVICTION, REFUSED_BY_LEDGER, REFUSED_BY_RATE_LIMIT, ReschedulerMetrics
from rescheduler.plan import Plan, Pod

log = logging.getLogger(__name__)

COMPONENT = "hoss-rescheduler"
MERGE_PATCH = "application/merge-patch+json"
REFUSED_BY_OUTCOME = {"refused": REFUSED_BY_LEDGER, "eviction refused": REFUSED_BY_EVICTION,
                      "rate limited": REFUSED_BY_RATE_LIMIT}
"""The outcomes that mean a refusal stopped the plan, and who refused (hoss_rescheduler_refusals_total{by})."""


def _held(pod: Pod) -> dict[str, int]:
    """What the ledger holds for the pod (its GPUs left out where they are DRA devices)."""
    return dict(pod.held if pod.held is not None else pod.request)


def plan_holds(plan: Plan) -> list[MoveHold]:
    """The holds of a plan: each move's target (claimed by the moved pod's controller), and the pending pod's node;
    each counting what the plan's evictions free on its node."""
    freeing: dict[str, dict[str, int]] = {}
    for move in plan.moves:
        bucket = freeing.setdefault(move.source, {})
        for resource, amount in _held(move.pod).items():
            bucket[resource] = bucket.get(resource, 0) + amount
    holds = [MoveHold(key=f"move/{m.pod.uid}", node=m.target, request=_held(m.pod), owner=m.pod.owner,
                      freeing=freeing.get(m.target, {})) for m in plan.moves]
    if plan.pending is not None:
        holds.append(MoveHold(key=plan.pending.uid, node=plan.pending_node, request=_held(plan.pending),
                              freeing=freeing.get(plan.pending_node, {})))
    return holds


@dataclass
class PlanRecord:
    """A plan and what became of it, for /status and the dashboard."""

    plan: Plan
    started: float = field(default_factory=time.time)
    outcome: str = "holding"
    """holding -> evicting -> waiting -> completed | replacement larger | refused | eviction refused | timed out |
    rate limited"""
    detail: str = ""
    finished: float | None = None
    evicted: list[str] = field(default_factory=list)

    def to_json(self) -> Json:
        plan = self.plan
        return {
            "reason": plan.reason,
            "pending": plan.pending.key if plan.pending else None,
            "pending_node": plan.pending_node or None,
            "moves": [{"pod": m.pod.key, "gpus": m.pod.gpus, "from": m.source, "to": m.target} for m in plan.moves],
            "before": vars(plan.before), "after": vars(plan.after),
            "outcome": self.outcome, "detail": self.detail, "evicted": list(self.evicted),
            "started": self.started, "finished": self.finished,
        }


class EvictionLimit:
    """At most `per_minute` evictions in any 60 s (the whole process)."""

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self.times: deque[float] = deque()

    def room(self) -> int:
        now = self.clock()
        while self.times and now - self.times[0] >= 60.0:
            self.times.popleft()
        return self.per_minute - len(self.times)

    def take(self) -> None:
        self.times.append(self.clock())


class Executor:
    """Runs plans one at a time (see the module docstring)."""

    def __init__(self, rest: KubeREST, ledger: Ledger, *, limit: EvictionLimit, hold_seconds: float,
                 outcome_timeout_seconds: float, record: Callable[[Json], Any] | None = None,
                 metrics: ReschedulerMetrics | None = None) -> None:
        self.rest = rest
        self.ledger = ledger
        self.limit = limit
        self.hold_seconds = hold_seconds
        self.outcome_timeout_seconds = outcome_timeout_seconds
        self.record = record or (lambda _event: None)
        self.history: deque[PlanRecord] = deque(maxlen=20)
        self.evictions = 0
        self.metrics = metrics if metrics is not None else ReschedulerMetrics()

    async def run(self, plan: Plan, view: ClusterView) -> PlanRecord:
        entry = PlanRecord(plan=plan)
        self.history.appendleft(entry)
        if self.limit.room() < len(plan.moves):
            return self._finish(entry, "rate limited",
                                f"{len(plan.moves)} evictions would exceed {self.limit.per_minute} a minute")
        holds = plan_holds(plan)
        answer = await self.ledger.hold_moves(holds, ttl_seconds=self.hold_seconds)
        if isinstance(answer, Conflict):
            return self._finish(entry, "refused", f"the room on {answer.node} is gone: {answer.resource} "
                                                  f"wanted {answer.wanted}, free {answer.free}")
        if isinstance(answer, UnknownNode):
            return self._finish(entry, "refused", f"node {answer.node} is gone")
        if isinstance(answer, str):
            return self._finish(entry, "refused", f"the pending pod was placed on {answer} meanwhile")
        entry.outcome = "evicting"
        for move in plan.moves:
            why = await self._evict(view.raw[move.pod.uid], plan, move.source, move.target)
            if why:
                # The replacements of the pods evicted already keep their room; the rest of the plan is dropped.
                evicted = {m.pod.uid for m in plan.moves if m.pod.key in entry.evicted}
                for hold in holds:
                    if hold.key.removeprefix("move/") not in evicted:
                        await self.ledger.unnominate(hold.key)
                if plan.pending is not None and plan.pending.uid in view.gated:
                    await self.release_gate(view.raw[plan.pending.uid])
                return self._finish(entry, "eviction refused", f"{move.pod.key}: {why}")
            entry.evicted.append(move.pod.key)
        if plan.pending is not None and plan.pending.uid in view.gated:
            await self.release_gate(view.raw[plan.pending.uid])
        entry.outcome = "waiting"
        deadline = time.monotonic() + self.outcome_timeout_seconds
        keys = {h.key for h in holds}
        outgrown: list[str] = []
        while True:
            left = keys & set(await self.ledger.nominations())
            for hold, why in await self._outgrown(plan, [h for h in holds if h.key in left], view):
                await self.ledger.unnominate(hold.key)
                left.discard(hold.key)
                outgrown.append(why)
                log.info("plan: %s", why)
            if not left:
                if outgrown:
                    return self._finish(entry, "replacement larger", "; ".join(outgrown))
                return self._finish(entry, "completed", "every held room was taken by the pod it was held for")
            if time.monotonic() >= deadline:
                for key in left:
                    await self.ledger.unnominate(key)
                return self._finish(entry, "timed out", f"not claimed in {self.outcome_timeout_seconds:g} s: "
                                                        f"{', '.join(sorted(left))}")
            await asyncio.sleep(0.5)

    async def _outgrown(self, plan: Plan, holds: list[MoveHold], view: ClusterView) -> list[tuple[MoveHold, str]]:
        """The unclaimed holds of moved pods whose replacement asks more than the moved pod (it cannot claim the
        hold), each with what to report."""
        moves = {f"move/{m.pod.uid}": m for m in plan.moves}
        waiting = [(hold, moves[hold.key]) for hold in holds if hold.key in moves and hold.owner]
        if not waiting:
            return []
        found: list[tuple[MoveHold, str]] = []
        listed: dict[str, list[Json]] = {}
        for hold, move in waiting:
            namespace = move.pod.key.split("/", 1)[0]
            if namespace not in listed:
                try:
                    body = await self.rest.request("GET", f"/api/v1/namespaces/{segment(namespace)}/pods")
                except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
                    log.warning("cannot list the pods of %s: %s", namespace, error)
                    return found
                listed[namespace] = list(body.get("items") or [])
            for raw in listed[namespace]:
                metadata = raw.get("metadata") or {}
                if (str(metadata.get("uid") or "") in view.raw or metadata.get("deletionTimestamp")
                        or compact.controller_uid(raw) != hold.owner):
                    continue  # not a new pod of the moved pod's controller
                try:
                    request = pod_requests(raw)
                except HossError:
                    continue
                more = {r: a for r, a in request.items() if a > hold.request.get(r, 0)}
                if more:
                    asks = ", ".join(f"{r} {format_quantity(r, a)} (moved pod: "
                                     f"{format_quantity(r, hold.request.get(r, 0))})" for r, a in sorted(more.items()))
                    found.append((hold, f"replacement {namespace}/{metadata.get('name')} of {move.pod.key} asks "
                                        f"more ({asks}): it cannot take the room held on {hold.node}, which was "
                                        f"dropped; it is placed as any pod"))
                    break
        return found

    def _finish(self, entry: PlanRecord, outcome: str, detail: str) -> PlanRecord:
        entry.outcome, entry.detail, entry.finished = outcome, detail, time.time()
        self.metrics.plans.labels(entry.plan.reason, outcome).inc()
        refused_by = REFUSED_BY_OUTCOME.get(outcome)
        if refused_by is not None:
            self.metrics.refusals.labels(refused_by).inc()
        log.info("plan %s: %s (%s)", "; ".join(m.describe() for m in entry.plan.moves), outcome, detail)
        return entry

    async def _evict(self, raw: Json, plan: Plan, source: str, target: str) -> str:
        """Evict one pod; '' when it is evicted (or already gone), else why not."""
        metadata = raw.get("metadata") or {}
        namespace, name, uid = metadata.get("namespace", "default"), metadata.get("name", ""), metadata.get("uid")
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        try:
            await self.rest.request("POST", f"/api/v1/namespaces/{segment(namespace)}/pods/{segment(name)}/eviction",
                                    body=body)
        except KubeError as error:
            if error.status in (404, 409):
                return ""
            return str(error)
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            return f"the apiserver did not answer: {error}"
        self.limit.take()
        self.evictions += 1
        self.metrics.evictions.inc()
        why = (f"to make room for {plan.pending.key} on {plan.pending_node}" if plan.pending is not None
               else "to defragment GPUs")
        self.record(pod_event(namespace=namespace, name=name, uid=str(uid), reason="Rescheduled", warning=False,
                              action="Evicting", component=COMPONENT,
                              message=f"Evicted by hoss-rescheduler to move it from node {source} to node {target} "
                                      f"(room held there for its replacement) {why}"))
        for node, text in ((source, f"hoss-rescheduler moves {namespace}/{name} from this node to {target} {why}"),
                           (target, f"hoss-rescheduler holds room on this node for the replacement of "
                                    f"{namespace}/{name} (moved from {source}) {why}")):
            self.record(node_event(name=node, uid=node, reason="Defragmenting", message=text, component=COMPONENT,
                                   warning=False))
        return ""

    async def release_gate(self, raw: Json) -> None:
        """Remove the hoss.io/defragment scheduling gate of a pending pod (the other gates stay)."""
        metadata = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        gates = [g for g in spec.get("schedulingGates") or []
                 if isinstance(g, dict) and g.get("name") != DEFRAGMENT_GATE]
        path = f"/api/v1/namespaces/{segment(metadata.get('namespace', 'default'))}/pods/{segment(metadata['name'])}"
        try:
            await self.rest.request("PATCH", path, body={"spec": {"schedulingGates": gates or None}},
                                    content_type=MERGE_PATCH)
        except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("cannot remove the %s gate of %s/%s: %s", DEFRAGMENT_GATE, metadata.get("namespace"),
                        metadata.get("name"), error)
