"""Preemption, as kube-scheduler's DefaultPreemption does it, for a pod that fits nowhere.

The common path pays nothing: a worker calls this only for a pod (or gang: `gang_victims`, all or nothing) it
found unschedulable that has a priority above 0 or above the lowest in its pod index (a pod of priority 0 or
below preempts pods of lower, negative priority, as in kube-scheduler; in a cluster without PriorityClasses every
pod has 0 and none looks).

The I/O part (`Preemptor`): reads PodDisruptionBudgets (one list, kept a few seconds, only when a pod
preempts: the worker watches nothing), the nominations in the ledger, holds room on the chosen node for the
preemptor (``Ledger.nominate``: no other worker's reservation and no foreign binding of lower or equal priority
may take it), evicts the victims through the Eviction API (which refuses one a budget protects: the hold is
dropped and the pod waits for its backoff) with a ``Preempted`` event on each, then sets
``status.nominatedNodeName``, and words the preemptor's FailedScheduling message. While its victims are leaving,
a pod does not preempt again; once they are gone and it still fits nowhere (its room was taken by a pod of higher
priority), it looks again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from hoss.errors import HossError, LedgerNotReadyError, LedgerUnavailable
from hoss.framework.budget import Budget, parse_budget
from hoss.framework.cycle import Profile, evaluate
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView
from hoss.framework.podindex import PlacedPod
from hoss.kube.client import KubeError
from hoss.kube.events import pod_event
from hoss.kube.rest import KubeREST, segment
from hoss.ledger.client import Ledger
from hoss.model.objects import Json
from hoss.model.resources import ResourceVector
from workers.metrics import SchedulerMetrics
from workers.victims import (
    NEVER,
    Candidate,
    GangStep,
    candidates,
    eligible,
    gang_reclaim_victims,
    gang_victims,
    keeps_quota_mins,
    pick,
    preemption_policy,
    reclaim_candidates,
    reclaimable,
    whole_gangs,
)

log = logging.getLogger(__name__)



@dataclass
class _InProgress:
    node: str
    victims: frozenset[str]
    until: float
    reclaim: ResourceVector | None = None
    """A reclaim's request (what it will add to its quota namespace's use); None for a priority preemption."""


class Preemptor:
    """Runs preemption for a worker: budgets, nominations, evictions, events (see the module docstring)."""

    def __init__(self, rest: KubeREST, ledger: Ledger, *, record: Callable[[Json], None], component: str,
                 hold_seconds: float, budgets_ttl_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, metrics: SchedulerMetrics | None = None) -> None:
        self.rest = rest
        self.ledger = ledger
        self.record = record
        self.component = component
        self.hold_seconds = hold_seconds
        self.budgets_ttl_seconds = budgets_ttl_seconds
        self.clock = clock
        self._budgets: list[Budget] = []
        self._budgets_at = -1e18
        self._quota_namespaces: set[str] = set()
        self._quotas_at = -1e18
        self.in_progress: dict[str, _InProgress] = {}
        self.preempted = 0
        """Pods this worker evicted."""
        self.metrics = metrics
        """scheduler_preemption_victims: the victims of each preemption started, as kube-scheduler counts them."""

    async def budgets(self) -> list[Budget]:
        """Every PodDisruptionBudget, listed at most once per `budgets_ttl_seconds`."""
        if self.clock() - self._budgets_at < self.budgets_ttl_seconds:
            return self._budgets
        body = await self.rest.request("GET", "/apis/policy/v1/poddisruptionbudgets")
        parsed = []
        for item in body.get("items") or []:
            try:
                parsed.append(parse_budget(item))
            except HossError as error:
                log.warning("ignoring a PodDisruptionBudget: %s", error)
        self._budgets, self._budgets_at = parsed, self.clock()
        return parsed

    def forget(self, uid: str) -> None:
        """The pod was placed or is gone: its preemption is over (the ledger ended its nomination)."""
        self.in_progress.pop(uid, None)

    async def attempt(self, profile: Profile, pod: PodView, raw: Mapping[str, object], table: NodeTable,
                      message: str) -> str:
        """Preempt for `pod`, which fits nowhere (`message` says why); returns its FailedScheduling message. A pod
        of a namespace with an elastic quota reclaims first (CapacityScheduling); if that starts nothing, a pod of
        priority > 0 preempts lower-priority pods as kube-scheduler does."""
        if await self.has_quota(pod.namespace):
            started, text = await self._reclaim(profile, pod, raw, table, message)
            if started or not eligible(pod, table):
                return text
        if preemption_policy(raw) == NEVER:
            return f"{message} preemption: not eligible due to preemptionPolicy=Never."
        waiting = self.in_progress.get(pod.uid)
        if waiting is not None and self.clock() < waiting.until:
            left = sorted(uid for uid in waiting.victims if table.pods.get(uid, None) is not None
                          and table.pods[uid].node == waiting.node)
            if left:
                return (f"{message} preemption: in progress on node {waiting.node}: waiting for {len(left)} "
                        f"evicted pod(s) to leave; the room is held for this pod.")
        try:
            return await self._preempt(profile, pod, table, message)
        except (LedgerUnavailable, LedgerNotReadyError, KubeError, aiohttp.ClientError, OSError,
                TimeoutError) as error:
            log.warning("preemption for %s failed: %s", pod.key, error)
            return f"{message} preemption: failed: {error}"

    async def attempt_gang(self, profile: Profile, key: str, members: Sequence[tuple[PodView, Mapping[str, object]]],
                           table: NodeTable, message: str) -> str:
        """Preempt for a gang whose `members` (those it needs) do not fit together: victims for every member or
        none (`gang_victims`); every eviction is first tried as a dry run, so a budget that would refuse one
        evicts nothing. Then each member's room is held (nominated), the victims are evicted and each member's
        nominatedNodeName set. `key` names the gang's preemption while its victims leave. Returns the message."""
        if any(preemption_policy(raw) == NEVER for _view, raw in members):
            return f"{message} preemption: not eligible due to preemptionPolicy=Never."
        waiting = self.in_progress.get(key)
        if waiting is not None and self.clock() < waiting.until:
            left = [uid for uid in waiting.victims if uid in table.pods]
            if left:
                return (f"{message} preemption: in progress for the gang: waiting for {len(left)} evicted pod(s) "
                        f"to leave; the room is held for its members.")
        views = [view for view, _raw in members]
        try:
            holds = await self.ledger.nominations()
            steps = gang_victims(profile, views, table, await self.budgets(), holds.values())
            if steps is None or not any(step.victims for step in steps):
                return (f"{message} preemption: no victims make room for every member of the gang; nothing was "
                        f"evicted.")
            return await self._act_gang(key, steps, message)
        except (LedgerUnavailable, LedgerNotReadyError, KubeError, aiohttp.ClientError, OSError,
                TimeoutError) as error:
            log.warning("gang preemption for %s failed: %s", key, error)
            return f"{message} preemption: failed: {error}"

    async def reclaim_gang(self, profile: Profile, key: str, members: Sequence[tuple[PodView, Mapping[str, object]]],
                           table: NodeTable, message: str) -> tuple[bool, str]:
        """Reclaim for a gang that does not fit, or that its namespace's elastic quota refused (`message`), while
        other tenants borrow: victims
        for every member or none (`gang_reclaim_victims`), the tenant within its min with all of them; then as a
        gang's preemption (dry runs first, so a budget that would refuse one eviction evicts nothing). `key` names
        the gang's reclaim while its victims leave. Returns whether a reclaim is under way, and the message."""
        if any(preemption_policy(raw) == NEVER for _view, raw in members):
            return False, f"{message} reclaim: not eligible due to preemptionPolicy=Never."
        waiting = self.in_progress.get(key)
        if waiting is not None and self.clock() < waiting.until:
            left = [uid for uid in waiting.victims if uid in table.pods]
            if left:
                return True, (f"{message} reclaim: in progress for the gang: waiting for {len(left)} evicted pod(s) "
                              f"to leave; the room is held for its members.")
        views = [view for view, _raw in members]
        whole: ResourceVector = {}
        for view in views:
            for resource, amount in view.request.items():
                whole[resource] = whole.get(resource, 0) + amount
        try:
            quotas = await self.ledger.quotas()
            why = reclaimable(dataclasses.replace(views[0], request=whole), quotas)
            if why:
                return False, f"{message} reclaim: not attempted for the gang: {why}."
            now = self.clock()
            others = [p for uid, p in self.in_progress.items() if uid != key and now < p.until]
            leaving = [table.pods[uid] for p in others for uid in p.victims if uid in table.pods]
            coming: ResourceVector = {}
            for p in others:
                for resource, amount in (p.reclaim or {}).items():
                    coming[resource] = coming.get(resource, 0) + amount
            holds = await self.ledger.nominations()
            steps = gang_reclaim_victims(profile, views, table, await self.budgets(), quotas=quotas,
                                         holds=holds.values(), leaving=leaving, coming=coming)
            if steps is None or not any(step.victims for step in steps):
                return False, (f"{message} reclaim: no pods of tenants above their min make room for every member "
                               f"of the gang; nothing was evicted.")
            text = await self._act_gang(key, steps, message, what="reclaim", reclaim=whole)
        except (LedgerUnavailable, LedgerNotReadyError, KubeError, aiohttp.ClientError, OSError,
                TimeoutError) as error:
            log.warning("gang reclaim for %s failed: %s", key, error)
            return False, f"{message} reclaim: failed: {error}"
        return key in self.in_progress, text

    async def _act_gang(self, key: str, steps: Sequence[GangStep], message: str, *, what: str = "preemption",
                        reclaim: ResourceVector | None = None) -> str:
        acting = [step for step in steps if step.victims]
        refused = [f"{victim.namespace}/{victim.name or victim.uid}: {why}" for step in acting
                   for victim in step.victims if (why := await self._evict(victim, step.member, step.node,
                                                                            dry_run=True))]
        if refused:
            return (f"{message} {what}: eviction refused for {'; '.join(refused)} (dry run); nothing was "
                    f"evicted; the gang waits.")
        nominated: list[str] = []
        for step in acting:
            outcome = await self.ledger.nominate(uid=step.member.uid, node=step.node, priority=step.member.priority,
                                                 request=step.member.request, ttl_seconds=self.hold_seconds)
            if outcome != "nominated":
                for uid in nominated:
                    await self.ledger.unnominate(uid)
                return f"{message} {what}: not started ({outcome} on {step.node}); nothing was evicted."
            nominated.append(step.member.uid)
        for step in acting:
            self._count_victims(len(step.victims))
        failed = [f"{victim.namespace}/{victim.name or victim.uid}: {why}" for step in acting
                  for victim in step.victims if (why := await self._evict(victim, step.member, step.node))]
        if failed:
            # Refused after its dry run passed (a budget changed meanwhile): the others are gone already.
            for uid in nominated:
                await self.ledger.unnominate(uid)
            return (f"{message} {what}: eviction refused for {'; '.join(failed)} after the dry run passed; "
                    f"the gang waits.")
        for step in acting:
            await self._set_nominated(step.member, step.node)
        victims = [victim for step in acting for victim in step.victims]
        self.in_progress[key] = _InProgress(node="", victims=frozenset(v.uid for v in victims),
                                            until=self.clock() + self.hold_seconds, reclaim=reclaim)
        return (f"{message} {what}: in progress for the gang: evicted {len(victims)} "
                f"{'borrowed' if reclaim is not None else 'lower-priority'} pod(s) "
                f"on {len({step.node for step in acting})} node(s) for {len(acting)} member(s); the room is held "
                f"for them.")

    async def has_quota(self, namespace: str) -> bool:
        """Whether `namespace` has an elastic quota (the ledger's list, read at most once per `budgets_ttl_seconds`:
        only pods of such namespaces look at reclaim)."""
        if self.clock() - self._quotas_at >= self.budgets_ttl_seconds:
            self._quota_namespaces = {use.quota.namespace for use in (await self.ledger.quotas()).quotas}
            self._quotas_at = self.clock()
        return namespace in self._quota_namespaces

    async def may_preempt(self, pod: PodView, table: NodeTable) -> bool:
        """Whether `pod`, which fits nowhere, is worth an `attempt`: its priority is above the lowest placed
        (`eligible`), or its namespace has an elastic quota, so it may reclaim (a ledger error reads as none)."""
        if eligible(pod, table):
            return True
        try:
            return await self.has_quota(pod.namespace)
        except (LedgerUnavailable, LedgerNotReadyError):
            return False

    async def reclaim(self, profile: Profile, pod: PodView, raw: Mapping[str, object], table: NodeTable,
                      message: str) -> str:
        """Reclaim for `pod`, which its namespace's elastic quota refused (`message`) while other tenants borrow:
        evict borrowed pods (`reclaim_candidates`) through the preemption path; returns its FailedScheduling
        message."""
        return (await self._reclaim(profile, pod, raw, table, message))[1]

    async def _reclaim(self, profile: Profile, pod: PodView, raw: Mapping[str, object], table: NodeTable,
                       message: str) -> tuple[bool, str]:
        """(whether a reclaim is under way for the pod, its message)."""
        if preemption_policy(raw) == NEVER:
            return False, f"{message} reclaim: not eligible due to preemptionPolicy=Never."
        waiting = self.in_progress.get(pod.uid)
        if waiting is not None and self.clock() < waiting.until:
            left = sorted(uid for uid in waiting.victims if table.pods.get(uid, None) is not None
                          and table.pods[uid].node == waiting.node)
            if left:
                return True, (f"{message} reclaim: in progress on node {waiting.node}: waiting for {len(left)} "
                              f"evicted pod(s) to leave; the room is held for this pod.")
        try:
            quotas = await self.ledger.quotas()
            why = reclaimable(pod, quotas)
            if why:
                return False, f"{message} reclaim: not attempted: {why}."
            now = self.clock()
            others = [p for uid, p in self.in_progress.items() if uid != pod.uid and now < p.until]
            leaving = [table.pods[uid] for p in others for uid in p.victims if uid in table.pods]
            coming: ResourceVector = {}
            for p in others:
                for resource, amount in (p.reclaim or {}).items():
                    coming[resource] = coming.get(resource, 0) + amount
            holds = await self.ledger.nominations()
            found = reclaim_candidates(profile, pod, table, await self.budgets(), quotas=quotas,
                                       holds=holds.values(), leaving=leaving, coming=coming)
            chosen = pick(found)
            if chosen is None:
                self.in_progress.pop(pod.uid, None)
                if pod.uid in holds:
                    await self.ledger.unnominate(pod.uid)
                return False, (f"{message} reclaim: no pods of tenants above their min can make room (without "
                               f"taking a tenant below its min or violating a PodDisruptionBudget).")
            text = await self._act(pod, chosen, message, what="reclaim", kind="borrowed")
        except (LedgerUnavailable, LedgerNotReadyError, KubeError, aiohttp.ClientError, OSError,
                TimeoutError) as error:
            log.warning("reclaim for %s failed: %s", pod.key, error)
            return False, f"{message} reclaim: failed: {error}"
        return pod.uid in self.in_progress, text

    async def _preempt(self, profile: Profile, pod: PodView, table: NodeTable, message: str) -> str:
        if evaluate(profile, pod, table).feasible.any():
            # Room appeared since the decision (pods of the same batch that took it were refused): no eviction.
            return f"{message} preemption: not needed: a node has room now; retrying."
        holds = await self.ledger.nominations()
        budgets = await self.budgets()
        found = whole_gangs(pod, candidates(profile, pod, table, budgets, holds.values()), table, budgets)
        if found:
            await self.has_quota(pod.namespace)  # refreshes the list of namespaces with an elastic quota
        if found and self._quota_namespaces:
            # Elastic quotas: a borrowing tenant preempts only its own pods, and no tenant is taken below its min.
            quotas = await self.ledger.quotas()
            found = [candidate for candidate in found if keeps_quota_mins(pod, candidate, quotas)]
        chosen = pick(found)
        if chosen is None:
            self.in_progress.pop(pod.uid, None)
            if pod.uid in holds:
                await self.ledger.unnominate(pod.uid)
            return (f"{message} preemption: 0/{len(table)} nodes are available: no preemption victims found "
                    f"for incoming pod.")
        return await self._act(pod, chosen, message, what="preemption", kind="lower-priority")

    async def _act(self, pod: PodView, chosen: Candidate, message: str, *, what: str, kind: str) -> str:
        """Hold the room on the chosen node, evict its victims, set nominatedNodeName; the pod's message."""
        outcome = await self.ledger.nominate(uid=pod.uid, node=chosen.node, priority=pod.priority,
                                             request=pod.request, ttl_seconds=self.hold_seconds)
        if outcome != "nominated":
            return f"{message} {what}: not started ({outcome} on {chosen.node})."
        self._count_victims(len(chosen.victims))
        refused: list[str] = []
        for victim in chosen.victims:
            why = await self._evict(victim, pod, chosen.node)
            if why:
                refused.append(f"{victim.namespace}/{victim.name or victim.uid}: {why}")
        if refused:
            # A budget (or the apiserver) kept a victim: give the room back; the pod tries again after its backoff.
            await self.ledger.unnominate(pod.uid)
            self.in_progress.pop(pod.uid, None)
            return (f"{message} {what}: eviction on node {chosen.node} refused for "
                    f"{'; '.join(refused)}; the pod waits.")
        # Like kube-scheduler, the nomination shows once the victims are on their way out.
        await self._set_nominated(pod, chosen.node)
        self.in_progress[pod.uid] = _InProgress(node=chosen.node, victims=frozenset(v.uid for v in chosen.victims),
                                                until=self.clock() + self.hold_seconds,
                                                reclaim=dict(pod.request) if what == "reclaim" else None)
        names = ", ".join(f"{v.namespace}/{v.name or v.uid}" for v in chosen.victims)
        return (f"{message} {what}: in progress on node {chosen.node}: evicted {len(chosen.victims)} "
                f"{kind} pod(s) ({names}); the room is held for this pod.")

    def _count_victims(self, victims: int) -> None:
        """A preemption starts evicting `victims` pods for one preemptor (kube-scheduler observes it there too)."""
        if self.metrics is not None:
            self.metrics.preemption_victims.observe(victims)

    async def _set_nominated(self, pod: PodView, node: str) -> None:
        try:
            await self.rest.patch_pod_status(pod.namespace, pod.name, {"status": {"nominatedNodeName": node}})
        except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("cannot set status.nominatedNodeName of %s: %s", pod.key, error)

    async def _evict(self, victim: PlacedPod, preemptor: PodView, node: str, *, dry_run: bool = False) -> str:
        """Evict one victim; '' when it is evicted or gone, else why not. `dry_run`: only ask whether the
        apiserver would (a PodDisruptionBudget refuses a dry run too), evicting nothing."""
        if not victim.name:
            return "its name is unknown to the ledger (written by an older hoss)"
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": victim.name, "namespace": victim.namespace},
                "deleteOptions": {"preconditions": {"uid": victim.uid}}}
        path = f"/api/v1/namespaces/{segment(victim.namespace)}/pods/{segment(victim.name)}/eviction"
        try:
            await self.rest.request("POST", path, body=body, params={"dryRun": "All"} if dry_run else None)
        except KubeError as error:
            if error.status in (404, 409):
                return ""  # gone already, or replaced (uid precondition): nothing of it is left to evict
            return str(error)
        if dry_run:
            return ""
        self.preempted += 1
        log.info("preempted %s/%s on %s for %s", victim.namespace, victim.name, node, preemptor.key)
        self.record(pod_event(namespace=victim.namespace, name=victim.name, uid=victim.uid, reason="Preempted",
                              message=f"Preempted by {preemptor.key} on node {node}", component=self.component,
                              warning=False, action="Preempting"))
        return ""
