"""Preemption, as kube-scheduler's DefaultPreemption does it, for a pod that fits nowhere.

The common path pays nothing: a worker calls this only for a pod (or gang: `gang_victims`, all or nothing) it
found unschedulable that has a priority above 0 or above the lowest in its pod index (a pod of priority 0 or
below preempts pods of lower, negative priority, as in kube-scheduler; in a cluster without PriorityClasses every
pod has 0 and none looks).

The pure part (no I/O), kube-scheduler's rules over the worker's node table and pod index:

- Candidate nodes: the nodes where the pod passes every filter of its profile once every pod of lower priority on
  them is gone (the filters run once over all nodes with those pods' requests taken off, and, when host ports or
  inter-pod terms may matter, those pods out of the pod index; each such candidate is then checked again with
  only its own victims gone, `select_victims` with the profile).
- Victims on a node (``SelectVictimsOnNode``): all lower-priority pods are removed; if the pod then fits (beside
  the room held for other nominated pods of at least its priority), pods are reprieved one by one, most important
  first (higher priority, then older), those whose eviction would violate a PodDisruptionBudget first; a pod
  stays a victim only if the preemptor no longer fits with it back (no longer passes the filters, in the deep
  check: a victim holding its host port or matching its anti-affinity stays a victim).
- PodDisruptionBudget violations (``filterPodsWithPDBViolation``): per node, each matching budget's
  ``status.disruptionsAllowed`` is counted down by the pods that match it; a pod that takes one below zero
  violates it. A budget with an empty selector matches nothing here, as in kube-scheduler.
- The node (``pickOneNodeForPreemption``): fewest PDB violations, then the lowest highest-victim priority, the
  smallest sum of priorities (each shifted by 2^31, so that fewer victims count less), the fewest victims, the
  latest start of the highest-priority victims (the ledger's stand-in for status.startTime is
  metadata.creationTimestamp), then the first.

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

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np

from resolver.errors import LedgerNotReadyError, LedgerUnavailable, PodSpecError, ResolverError
from resolver.events import pod_event
from resolver.kube import Json, KubeError, section
from resolver.ledger import Ledger, Nomination, QuotaReport
from resolver.resources import ResourceVector
from resolver.rest import KubeREST, segment
from workers.framework import Profile, evaluate, run_filters
from workers.nodes import NodeTable, PlacedPod
from workers.pod import PodView, placed_view
from workers.podterms import LabelSelector, label_selector

log = logging.getLogger(__name__)

NEVER = "Never"
PRIORITY_SHIFT = 2**31
"""kube-scheduler sums victim priorities shifted by MaxInt32 + 1, so every victim adds a positive amount."""


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as preemption reads it."""

    namespace: str
    name: str
    selector: LabelSelector | None
    """None: the budget matches no pod (an empty or missing selector, as kube-scheduler's preemption reads it)."""
    disruptions_allowed: int
    disrupted: frozenset[str] = frozenset()
    """status.disruptedPods: pods whose eviction the apiserver already counted."""

    def matches(self, pod: PlacedPod) -> bool:
        return (self.selector is not None and bool(pod.labels) and pod.namespace == self.namespace
                and self.selector.matches(pod.labels))


def parse_budget(raw: Mapping[str, object]) -> Budget:
    """A PodDisruptionBudget (policy/v1 JSON); raises `PodSpecError` naming a bad field."""
    metadata = section(raw, "metadata")
    spec = section(raw, "spec")
    status = section(raw, "status")
    namespace, name = str(metadata.get("namespace") or "default"), str(metadata.get("name") or "")
    selector_raw = spec.get("selector")
    selector = None
    if isinstance(selector_raw, dict) and (selector_raw.get("matchLabels") or selector_raw.get("matchExpressions")):
        selector = label_selector(selector_raw, field=f"poddisruptionbudget {namespace}/{name} spec.selector")
    allowed = status.get("disruptionsAllowed", 0)
    if isinstance(allowed, bool) or not isinstance(allowed, int):
        raise PodSpecError(field=f"poddisruptionbudget {namespace}/{name} status.disruptionsAllowed",
                           reason=f"expected an integer, got {allowed!r}")
    disrupted = status.get("disruptedPods")
    return Budget(namespace=namespace, name=name, selector=selector, disruptions_allowed=allowed,
                  disrupted=frozenset(disrupted) if isinstance(disrupted, dict) else frozenset())


@dataclass(frozen=True)
class Candidate:
    """A node where evicting `victims` (most important first) lets the pod fit."""

    node: str
    victims: tuple[PlacedPod, ...]
    violations: int
    """How many victims' evictions violate a PodDisruptionBudget."""


def _importance(pod: PlacedPod) -> tuple[int, str, str]:
    """Sort key, most important first: higher priority, then the older (an empty timestamp is 'now'), then by uid
    (kube-scheduler keeps its node's pod order there; a fixed order keeps the choice reproducible)."""
    return -pod.priority, pod.created or "~", pod.uid


def _fits(request: Mapping[str, int], free: Mapping[str, int]) -> bool:
    return all(amount <= free.get(resource, 0) for resource, amount in request.items() if amount > 0)


def _held(holds: Iterable[Nomination], node: str, uid: str, priority: int) -> ResourceVector:
    """Room held on node for nominated pods other than uid of at least `priority` (they count as running)."""
    held: ResourceVector = {}
    for hold in holds:
        if hold.node == node and hold.uid != uid and hold.priority >= priority:
            for resource, amount in hold.request.items():
                held[resource] = held.get(resource, 0) + amount
    return held


def split_by_budgets(pods: Sequence[PlacedPod], budgets: Sequence[Budget]) -> tuple[list[PlacedPod], list[PlacedPod]]:
    """(violating, not violating), each in the given order: kube-scheduler's filterPodsWithPDBViolation."""
    allowed = [budget.disruptions_allowed for budget in budgets]
    violating: list[PlacedPod] = []
    fine: list[PlacedPod] = []
    for pod in pods:
        violated = False
        for index, budget in enumerate(budgets):
            if not budget.matches(pod) or pod.name in budget.disrupted:
                continue
            allowed[index] -= 1
            if allowed[index] < 0:
                violated = True
        (violating if violated else fine).append(pod)
    return violating, fine


def select_victims(pod: PodView, node: str, table: NodeTable, budgets: Sequence[Budget],
                   holds: Iterable[Nomination] = (), *, profile: Profile | None = None) -> Candidate | None:
    """The fewest victims on `node` that make room for `pod` (kube-scheduler's SelectVictimsOnNode); None when
    even evicting every lower-priority pod is not enough. Without `profile` only resources are checked (the caller
    checked the other filters); with it, the profile's filters run again with the victims gone from the node's
    usage and pod index (host ports, inter-pod terms and spread they held), as kube-scheduler re-runs its filters,
    and each reprieve too. The table is left as it was."""
    lower = sorted((p for uid in table.pods_on.get(node, ()) if (p := table.pods[uid]).priority < pod.priority),
                   key=_importance)
    if not lower:
        return None
    alloc = dict(zip(table.resources, table.alloc[table.row(node)].tolist(), strict=True))
    used = table.used_of(node)
    held = _held(holds, node, pod.uid, pod.priority)
    free = {r: alloc.get(r, 0) - used.get(r, 0) - held.get(r, 0) for r in set(alloc) | set(used) | set(held)}
    for victim in lower:
        for resource, amount in victim.request.items():
            free[resource] = free.get(resource, 0) + amount
    if not _fits(pod.request, free):
        return None
    if profile is not None:
        for victim in lower:
            table.remove_pod(victim.uid)
            table.sub_used(node, victim.request)
    try:
        return _reprieve(pod, node, table, budgets=budgets, lower=lower, free=free, profile=profile)
    finally:
        if profile is not None:
            table.set_used(node, used)
            for victim in lower:
                if victim.uid not in table.pods:
                    table.place_pod(victim)


def _passes(profile: Profile, pod: PodView, table: NodeTable, node: str) -> bool:
    """Whether `pod` passes every filter of `profile` on `node` as the table stands."""
    feasible, _counts = run_filters(profile.filters, pod, table)
    return bool(feasible[table.row(node)])


def _reprieve(pod: PodView, node: str, table: NodeTable, *, budgets: Sequence[Budget], lower: Sequence[PlacedPod],
              free: dict[str, int], profile: Profile | None) -> Candidate | None:
    """`select_victims` once every lower-priority pod is out: reprieve them, most important first."""
    if profile is not None and not _passes(profile, pod, table, node):
        return None
    victims: list[PlacedPod] = []

    def reprieve(victim: PlacedPod) -> bool:
        back = {r: free.get(r, 0) - victim.request.get(r, 0) for r in set(free) | set(victim.request)}
        if _fits(pod.request, back):
            if profile is None:
                free.clear()
                free.update(back)
                return True
            table.place_pod(victim)
            table.add_used(node, victim.request)
            if _passes(profile, pod, table, node):
                free.clear()
                free.update(back)
                return True
            table.remove_pod(victim.uid)
            table.sub_used(node, victim.request)
        victims.append(victim)
        return False

    violating, fine = split_by_budgets(lower, budgets)
    violations = sum(1 for victim in violating if not reprieve(victim))
    for victim in fine:
        reprieve(victim)
    if not victims:
        return None  # it fits without evicting anyone: not a preemption (the room is the worker's to take)
    return Candidate(node=node, victims=tuple(sorted(victims, key=_importance)), violations=violations)


def _earliest_start(victims: Sequence[PlacedPod]) -> str:
    """The earliest start among the highest-priority victims (an empty timestamp counts as now)."""
    top = max(v.priority for v in victims)
    return min((v.created or "~") for v in victims if v.priority == top)


def pick(candidates: Sequence[Candidate]) -> Candidate | None:
    """kube-scheduler's pickOneNodeForPreemption over `candidates` (in node order for the final tie)."""
    left = list(candidates)
    if not left:
        return None
    criteria: list[Callable[[Candidate], object]] = [
        lambda c: c.violations,
        lambda c: max(v.priority for v in c.victims),
        lambda c: sum(v.priority + PRIORITY_SHIFT for v in c.victims),
        lambda c: len(c.victims),
    ]
    for key in criteria:
        best = min(key(c) for c in left)  # type: ignore[type-var]
        left = [c for c in left if key(c) == best]
        if len(left) == 1:
            return left[0]
    latest = max(_earliest_start(c.victims) for c in left)
    return next(c for c in left if _earliest_start(c.victims) == latest)


def candidates(profile: Profile, pod: PodView, table: NodeTable, budgets: Sequence[Budget],
               holds: Iterable[Nomination] = ()) -> list[Candidate]:
    """Every node where preemption can make room for `pod`, with its victims (see the module docstring)."""
    lower: dict[str, ResourceVector] = {}
    for placed in table.pods.values():
        if placed.priority < pod.priority and placed.node in table and placed.request:
            freed = lower.setdefault(placed.node, {})
            for resource, amount in placed.request.items():
                freed[resource] = freed.get(resource, 0) + amount
    if not lower:
        return []
    # Victims may hold what stops the pod besides room: host ports, pods its inter-pod terms or spread count, or
    # anti-affinity terms of their own. Then the what-if takes them out of the pod index too, and each candidate
    # node is checked again with only its own victims gone (kube-scheduler's filters on the node without them).
    deep = bool(pod.host_ports or pod.reads_pod_index) or any(
        (p := table.pods[uid]).ports or p.anti for node in lower for uid in table.pods_on.get(node, ())
        if table.pods[uid].priority < pod.priority)
    saved = {node: table.used_of(node) for node in lower}
    out = [p for p in table.pods.values() if p.priority < pod.priority and p.node in lower] if deep else []
    try:
        # What if every lower-priority pod were gone: which nodes would pass every filter? Synchronous, so no other
        # task of the worker sees the table in this state.
        for node, freed in lower.items():
            table.sub_used(node, freed)
        for placed in out:
            table.remove_pod(placed.uid)
        feasible = evaluate(profile, pod, table).feasible
        names = [table.names[row] for row in np.flatnonzero(feasible)]
    finally:
        for placed in out:
            table.place_pod(placed)
        for node, used in saved.items():
            table.set_used(node, used)
    holds = list(holds)
    found = []
    checked = 0
    for node in names:
        if node in lower:
            if deep and checked >= MAX_DEEP_CANDIDATES:
                break
            checked += 1
            candidate = select_victims(pod, node, table, budgets, holds, profile=profile if deep else None)
            if candidate is not None:
                found.append(candidate)
    return found


def keeps_quota_mins(pod: PodView, candidate: Candidate, quotas: QuotaReport) -> bool:
    """Whether a priority preemption's `candidate` respects the elastic quotas (CapacityScheduling's rule for
    victims): a pod whose namespace would borrow (use above its min once placed) evicts only pods of its own
    namespace; any other preemptor may evict pods of other namespaces only while each such tenant keeps at least its
    min of every resource the quotas govern."""
    governed = set(quotas.sum_min)
    uses = {use.quota.namespace: use for use in quotas.quotas}
    own = uses.get(pod.namespace)
    borrowing = own is not None and any(
        own.used.get(r, 0) + pod.request.get(r, 0) > own.quota.min.get(r, 0) for r in governed if pod.request.get(r))
    taken: dict[str, dict[str, int]] = {}
    for victim in candidate.victims:
        if victim.namespace == pod.namespace:
            continue
        if borrowing:
            return False
        freed = taken.setdefault(victim.namespace, {})
        for resource, amount in victim.request.items():
            freed[resource] = freed.get(resource, 0) + amount
    for namespace, freed in taken.items():
        use = uses.get(namespace)
        if use is not None and any(use.used.get(r, 0) - freed.get(r, 0) < use.quota.min.get(r, 0)
                                   for r in governed if freed.get(r)):
            return False
    return True


MAX_DEEP_CANDIDATES = 100
"""Candidate nodes checked with the filters re-run (kube-scheduler's minCandidateNodesAbsolute)."""


def reclaimable(pod: PodView, quotas: QuotaReport) -> str:
    """'' when `pod` may reclaim (its namespace has an elastic quota and stays within its min and max with it,
    for every resource it requests that a quota governs), else why not."""
    own = next((use for use in quotas.quotas if use.quota.namespace == pod.namespace), None)
    if own is None:
        return f"namespace {pod.namespace} has no elastic quota"
    for resource, amount in pod.request.items():
        if amount <= 0:
            continue
        used = own.used.get(resource, 0)
        if resource in own.quota.max and used + amount > own.quota.max[resource]:
            return f"quota {pod.namespace}: {resource} {used} used + {amount} requested > max"
        if resource in quotas.sum_min and used + amount > own.quota.min.get(resource, 0):
            return (f"quota {pod.namespace}: {resource} {used} used + {amount} requested > min "
                    f"{own.quota.min.get(resource, 0)}: only a tenant within its min reclaims")
    return ""


def _newest_lowest_first(pods: Iterable[PlacedPod]) -> list[PlacedPod]:
    """Lowest priority first, then the newest first (an empty timestamp is 'now'), then by uid."""
    by_uid = sorted(pods, key=lambda p: p.uid)
    newest = sorted(by_uid, key=lambda p: p.created or "~", reverse=True)
    return sorted(newest, key=lambda p: p.priority)


def reclaim_candidates(profile: Profile, pod: PodView, table: NodeTable, budgets: Sequence[Budget], *,
                       quotas: QuotaReport, holds: Iterable[Nomination] = (),
                       leaving: Iterable[PlacedPod] = (), coming: Mapping[str, int] | None = None) -> list[Candidate]:
    """Nodes where evicting pods of tenants above their min lets `pod` (of a tenant within its min, see
    `reclaimable`) in: CapacityScheduling's reclaim. Victims are pods of other namespaces with a quota that use more
    than their min of a resource the pod needs and the quotas govern, lowest priority and newest first, never one
    whose eviction would take its tenant below its min or violate a PodDisruptionBudget (whatever its priority, as
    CapacityScheduling picks victims across quotas). On each candidate node victims are taken until the pod fits
    there, then anywhere until the quota namespaces' use leaves room for it under the sum of min. `leaving`: pods
    already being evicted (they count as gone); `coming`: what other reclaiming pods will add."""
    governed = set(quotas.sum_min)
    wanted = {r: a for r, a in pod.request.items() if a > 0 and r in governed}
    gone = {p.uid for p in leaving}
    above: dict[str, dict[str, int]] = {}
    for use in quotas.quotas:
        above[use.quota.namespace] = {r: use.used.get(r, 0) - use.quota.min.get(r, 0) for r in governed}
    total = {r: quotas.sum_used.get(r, 0) + (coming or {}).get(r, 0) for r in governed}
    for placed in leaving:
        for r, a in placed.request.items():
            if r in governed:
                total[r] -= a
                if placed.namespace in above:
                    above[placed.namespace][r] -= a
    need = {r: total[r] + a - quotas.sum_min[r] for r, a in wanted.items()}
    eligible = _newest_lowest_first(
        p for p in table.pods.values()
        if p.uid not in gone and p.namespace != pod.namespace and p.namespace in above and not p.terminating
        and p.node in table and any(p.request.get(r, 0) > 0 and above[p.namespace][r] > 0 for r in wanted))
    _violating, eligible = split_by_budgets(eligible, budgets)
    if not eligible:
        return []
    on_node: dict[str, ResourceVector] = {}
    for placed in eligible:
        freed = on_node.setdefault(placed.node, {})
        for resource, amount in placed.request.items():
            freed[resource] = freed.get(resource, 0) + amount
    saved = {node: table.used_of(node) for node in on_node}
    try:
        for node, freed in on_node.items():  # what if every eligible pod were gone (synchronous, as in candidates)
            table.sub_used(node, freed)
        names = [table.names[row] for row in np.flatnonzero(evaluate(profile, pod, table).feasible)]
    finally:
        for node, used in saved.items():
            table.set_used(node, used)
    holds = list(holds)
    found = []
    for node in names:
        alloc = dict(zip(table.resources, table.alloc[table.row(node)].tolist(), strict=True))
        used = table.used_of(node)
        held = _held(holds, node, pod.uid, pod.priority)
        free = {r: alloc.get(r, 0) - used.get(r, 0) - held.get(r, 0) for r in set(alloc) | set(used) | set(held)}
        room = {ns: dict(left) for ns, left in above.items()}
        short = dict(need)
        victims: list[PlacedPod] = []

        def take(victim: PlacedPod, room: dict[str, dict[str, int]] = room, short: dict[str, int] = short,
                 victims: list[PlacedPod] = victims) -> None:
            left = room[victim.namespace]
            if any(victim.request.get(r, 0) > left[r] for r in left if victim.request.get(r, 0) > 0):
                return  # its tenant would fall below its min
            for r in left:
                left[r] -= victim.request.get(r, 0)
            for r in short:
                short[r] -= victim.request.get(r, 0)
            victims.append(victim)

        for victim in (p for p in eligible if p.node == node):
            if _fits(pod.request, free):
                break
            before = len(victims)
            take(victim)
            if len(victims) > before:
                for resource, amount in victim.request.items():
                    free[resource] = free.get(resource, 0) + amount
        if not _fits(pod.request, free):
            continue
        for victim in eligible:
            if all(v <= 0 for v in short.values()):
                break
            if victim not in victims:
                take(victim)
        if victims and all(v <= 0 for v in short.values()):
            found.append(Candidate(node=node, victims=tuple(sorted(victims, key=_importance)), violations=0))
    return found


@dataclass(frozen=True)
class GangStep:
    """One gang member's part of a gang preemption: its node, and the victims evicted there for it (may be none)."""

    member: PodView
    node: str
    victims: tuple[PlacedPod, ...]


def gang_victims(profile: Profile, members: Sequence[PodView], table: NodeTable, budgets: Sequence[Budget],
                 holds: Iterable[Nomination] = ()) -> list[GangStep] | None:
    """Victims for every one of `members`, or None: all or nothing. Members are planned one after another on the
    table as the earlier ones leave it (their victims out of usage and index, themselves placed): a member that
    fits without evicting anyone takes the best node, else kube-scheduler's choice among its candidates
    (`candidates`, `pick`). A member that finds neither makes the whole gang find nothing, so no pod is evicted
    for a gang that could not be placed whole. The table is left as it was."""
    holds = list(holds)
    steps: list[GangStep] = []
    used = {name: table.used_of(name) for name in table.names}
    removed: list[PlacedPod] = []
    placed: list[str] = []
    try:
        for member in members:
            evaluation = evaluate(profile, member, table)
            rows = np.flatnonzero(evaluation.feasible)
            victims: tuple[PlacedPod, ...]
            if rows.size:
                node, victims = table.names[int(rows[np.argmax(evaluation.scores[rows])])], ()
            else:
                chosen = pick(candidates(profile, member, table, budgets, holds))
                if chosen is None:
                    return None
                node, victims = chosen.node, chosen.victims
            for victim in victims:
                table.remove_pod(victim.uid)
                table.sub_used(node, victim.request)
                removed.append(victim)
            table.add_used(node, member.request)
            table.place_pod(placed_view(member, node))
            placed.append(member.uid)
            steps.append(GangStep(member=member, node=node, victims=tuple(victims)))
        return steps
    finally:
        for uid in placed:
            table.remove_pod(uid)
        for victim in removed:
            table.place_pod(victim)
        for name, usage in used.items():
            if table.used_of(name) != usage:
                table.set_used(name, usage)


def preemption_policy(raw: Mapping[str, object]) -> str:
    spec = raw.get("spec")
    policy = spec.get("preemptionPolicy") if isinstance(spec, dict) else None
    return policy if isinstance(policy, str) and policy else "PreemptLowerPriority"


def eligible(pod: PodView, table: NodeTable) -> bool:
    """Whether the worker should look at preemption at all for this unschedulable pod (cheap, no I/O): a positive
    priority, or some placed pod of strictly lower priority whatever the sign (kube-scheduler lets any pod preempt
    pods of lower priority; in a cluster without PriorityClasses every pod has 0 and none looks)."""
    if pod.priority > 0:
        return True  # also to say why none was made, as kube-scheduler's message does
    lowest = table.lowest_priority()
    return lowest is not None and lowest < pod.priority


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
                 clock: Callable[[], float] = time.monotonic) -> None:
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

    async def budgets(self) -> list[Budget]:
        """Every PodDisruptionBudget, listed at most once per `budgets_ttl_seconds`."""
        if self.clock() - self._budgets_at < self.budgets_ttl_seconds:
            return self._budgets
        body = await self.rest.request("GET", "/apis/policy/v1/poddisruptionbudgets")
        parsed = []
        for item in body.get("items") or []:
            try:
                parsed.append(parse_budget(item))
            except ResolverError as error:
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

    async def _act_gang(self, key: str, steps: Sequence[GangStep], message: str) -> str:
        acting = [step for step in steps if step.victims]
        refused = [f"{victim.namespace}/{victim.name or victim.uid}: {why}" for step in acting
                   for victim in step.victims if (why := await self._evict(victim, step.member, step.node,
                                                                            dry_run=True))]
        if refused:
            return (f"{message} preemption: eviction refused for {'; '.join(refused)} (dry run); nothing was "
                    f"evicted; the gang waits.")
        nominated: list[str] = []
        for step in acting:
            outcome = await self.ledger.nominate(uid=step.member.uid, node=step.node, priority=step.member.priority,
                                                 request=step.member.request, ttl_seconds=self.hold_seconds)
            if outcome != "nominated":
                for uid in nominated:
                    await self.ledger.unnominate(uid)
                return f"{message} preemption: not started ({outcome} on {step.node}); nothing was evicted."
            nominated.append(step.member.uid)
        failed = [f"{victim.namespace}/{victim.name or victim.uid}: {why}" for step in acting
                  for victim in step.victims if (why := await self._evict(victim, step.member, step.node))]
        if failed:
            # Refused after its dry run passed (a budget changed meanwhile): the others are gone already.
            for uid in nominated:
                await self.ledger.unnominate(uid)
            return (f"{message} preemption: eviction refused for {'; '.join(failed)} after the dry run passed; "
                    f"the gang waits.")
        for step in acting:
            await self._set_nominated(step.member, step.node)
        victims = [victim for step in acting for victim in step.victims]
        self.in_progress[key] = _InProgress(node="", victims=frozenset(v.uid for v in victims),
                                            until=self.clock() + self.hold_seconds)
        return (f"{message} preemption: in progress for the gang: evicted {len(victims)} lower-priority pod(s) "
                f"on {len({step.node for step in acting})} node(s) for {len(acting)} member(s); the room is held "
                f"for them.")

    async def has_quota(self, namespace: str) -> bool:
        """Whether `namespace` has an elastic quota (the ledger's list, read at most once per `budgets_ttl_seconds`:
        only pods of such namespaces look at reclaim)."""
        if self.clock() - self._quotas_at >= self.budgets_ttl_seconds:
            self._quota_namespaces = {use.quota.namespace for use in (await self.ledger.quotas()).quotas}
            self._quotas_at = self.clock()
        return namespace in self._quota_namespaces

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
        found = candidates(profile, pod, table, budgets, holds.values())
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
