"""Victims for preemption, as kube-scheduler's DefaultPreemption chooses them. Pure, no I/O.

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
- Gangs (`whole_gangs`): a running gang is a victim whole or not at all. A candidate whose victims include a gang
  member takes every other member of that gang (on any node) as a victim too, and is dropped when one of them is
  not of lower priority than the pod; the budgets' violations are counted over them all. The worker does not know
  a gang's minimum, so it never leaves part of a gang running. Reclaim takes no gang member.
- The node (``pickOneNodeForPreemption``): fewest PDB violations, then the lowest highest-victim priority, the
  smallest sum of priorities (each shifted by 2^31, so that fewer victims count less), the fewest victims, the
  latest start of the highest-priority victims (the ledger's stand-in for status.startTime is
  metadata.creationTimestamp), then the first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hoss.framework.budget import Budget
from hoss.framework.cycle import Profile, evaluate, run_filters
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, placed_view
from hoss.framework.podindex import PlacedPod
from hoss.ledger.results import Nomination, QuotaReport
from hoss.model.resources import ResourceVector

log = logging.getLogger(__name__)

NEVER = "Never"
PRIORITY_SHIFT = 2**31
"""kube-scheduler sums victim priorities shifted by MaxInt32 + 1, so every victim adds a positive amount."""


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
    # Victims may hold what stops the pod besides room: host ports, pods its inter-pod terms or spread count,
    # anti-affinity terms of their own, or a ReadWriteOncePod claim it needs. Then the what-if takes them out of
    # the pod index too, and each candidate node is checked again with only its own victims gone (kube-scheduler's
    # filters on the node without them).
    once = bool(pod.storage is not None and pod.storage.once)  # VolumeRestrictions reads the index's claims
    deep = bool(pod.host_ports or pod.reads_pod_index or once) or any(
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


def whole_gangs(pod: PodView, found: Sequence[Candidate], table: NodeTable,
                budgets: Sequence[Budget]) -> list[Candidate]:
    """`found` with each running gang among a candidate's victims taken whole, or the candidate dropped when a
    member of such a gang is not of lower priority than `pod` (see the module docstring)."""
    members: dict[str, list[PlacedPod]] = {}
    for placed in table.pods.values():
        if placed.gang:
            members.setdefault(placed.gang, []).append(placed)
    if not members:
        return list(found)
    kept = []
    for candidate in found:
        gangs = {victim.gang for victim in candidate.victims if victim.gang}
        if not gangs:
            kept.append(candidate)
            continue
        extra = [m for gang in sorted(gangs) for m in members.get(gang, ())]
        if any(m.priority >= pod.priority for m in extra):
            continue  # part of the gang would have to stay: none of it goes
        victims = {v.uid: v for v in candidate.victims} | {m.uid: m for m in extra}
        violating, _fine = split_by_budgets(sorted(victims.values(), key=_importance), budgets)
        kept.append(Candidate(node=candidate.node, victims=tuple(sorted(victims.values(), key=_importance)),
                              violations=len(violating)))
    return kept


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
        and not p.gang and p.node in table
        and any(p.request.get(r, 0) > 0 and above[p.namespace][r] > 0 for r in wanted))
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
                chosen = pick(whole_gangs(member, candidates(profile, member, table, budgets, holds), table,
                                          budgets))
                if chosen is None:
                    return None
                node, victims = chosen.node, chosen.victims
            for victim in victims:
                table.remove_pod(victim.uid)
                table.sub_used(victim.node, victim.request)  # a whole gang's members may be on other nodes
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


def gang_reclaim_victims(profile: Profile, members: Sequence[PodView], table: NodeTable, budgets: Sequence[Budget],
                         *, quotas: QuotaReport, holds: Iterable[Nomination] = (),
                         leaving: Sequence[PlacedPod] = (), coming: Mapping[str, int] | None = None,
                         ) -> list[GangStep] | None:
    """Reclaim for every one of `members` (a gang whose tenant is within its min with all of them), or None: all
    or nothing. As `gang_victims`, members are planned one after another on the table, each seeing the earlier
    ones placed and their victims gone, and the quota use they add (`reclaim_candidates`' `leaving`, `coming`): a
    member that fits and leaves the quotas' sum of min room takes no victim, else kube-scheduler's choice among its
    reclaim candidates. The table is left as it was."""
    holds = list(holds)
    governed = set(quotas.sum_min)
    gone: list[PlacedPod] = list(leaving)
    adding: dict[str, int] = dict(coming or {})
    steps: list[GangStep] = []
    used = {name: table.used_of(name) for name in table.names}
    removed: list[PlacedPod] = []
    placed: list[str] = []
    try:
        for member in members:
            total = {r: quotas.sum_used.get(r, 0) + adding.get(r, 0)
                     - sum(p.request.get(r, 0) for p in gone) for r in governed}
            short = any(total[r] + member.request.get(r, 0) > quotas.sum_min[r]
                        for r in governed if member.request.get(r, 0) > 0)
            evaluation = evaluate(profile, member, table)
            rows = np.flatnonzero(evaluation.feasible)
            victims: tuple[PlacedPod, ...]
            if rows.size and not short:
                node, victims = table.names[int(rows[np.argmax(evaluation.scores[rows])])], ()
            else:
                chosen = pick(reclaim_candidates(profile, member, table, budgets, quotas=quotas, holds=holds,
                                                 leaving=gone, coming=adding))
                if chosen is None:
                    return None
                node, victims = chosen.node, chosen.victims
            for victim in victims:
                table.remove_pod(victim.uid)
                table.sub_used(victim.node, victim.request)
                removed.append(victim)
                gone.append(victim)
            table.add_used(node, member.request)
            table.place_pod(placed_view(member, node))
            placed.append(member.uid)
            for resource, amount in member.request.items():
                adding[resource] = adding.get(resource, 0) + amount
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
