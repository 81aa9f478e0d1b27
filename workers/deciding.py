"""Deciding where the pods of a batch may go: the best few nodes (candidates) of each, or why none fits.

Each pod is filtered and scored on every node with its policy's profile, in turn:
- a pod the rescheduler holds room for goes onto a node of its hold (`decide_held`);
- a pod owned by Reservations is decided with their room given back on their nodes (`decide_with_reservations`);
- a profile with extenders consults them between evaluating and choosing (`workers.extender`);
- pods with the same scheduling signature (same policy, namespace, labels and spec, such as the pods of one Job)
  share one filter and score pass while its best node is untouched by earlier pods of the batch.
Every placement is counted in the node table at once (`hold_in_batch`), so later pods of the batch see it, and
undone when the ledger has answered (`settle_batch`): its change stream then brings the truth.

The profiles in use (`Policies`) change only between two batches: a reloaded policy file is staged and adopted
before the next batch (`Decider.stage`, `Decider.adopt`), so no batch is decided half with the old profiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np

from hoss.framework.cycle import Evaluation, Placement, Profile, Unschedulable, choose, evaluate
from hoss.framework.errors import ProfileError
from hoss.framework.feed import NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, placed_view
from hoss.framework.profiles import profiles_from_text
from hoss.ledger.results import BatchResult, LedgerNotReady, Reserved
from hoss.model import compact
from workers.extender import decide_with_extenders
from workers.intake import Work, signature
from workers.metrics import Tally
from workers.reservations import Hint, hints_of, preferred_first
from workers.settings import WorkerSettings
from workers.timing import Sampler

Shared = dict[bytes, tuple[Evaluation, set[str]]]
"""Signature -> its evaluation in this batch, and the nodes the batch placed pods on since."""
Decided = tuple[Work, PodView, Placement]


@dataclass(frozen=True)
class Policies:
    """One reading of the policy file: the profiles by name and the default profile's name."""

    profiles: Mapping[str, Profile]
    default: str


def parse_policies(text: str, *, source: str, served: Sequence[str]) -> Policies:
    """The policy file's profiles (`profiles_from_text`); a file without a profile this worker serves (``policies``)
    is refused, naming them, as at start as on a reload: the dispatcher keeps sending this worker those pods."""
    profiles, default = profiles_from_text(text, source=source)
    missing = [name for name in served if name not in profiles]
    if missing:
        raise ProfileError(field="profiles", source=source,
                           reason=f"this worker serves {', '.join(missing)} (--policies), which the file does not "
                                  f"define; profiles there: {', '.join(sorted(profiles))}")
    return Policies(profiles, default)


def decide_held(profile: Profile, pod: PodView, nodes: NodeTable, held: Sequence[str], *, rng: np.random.Generator,
                top: int) -> Placement | Unschedulable:
    """A pod the rescheduler holds room for (it made room for it, or it replaces a pod it moved) goes onto a
    node of its hold, as kube-scheduler tries a nominated node first; until the room is free there (the moved
    pods are still leaving), it waits, so that it does not take room elsewhere and undo the plan."""
    evaluation = evaluate(profile, pod, nodes)
    allowed = np.array([name in held for name in nodes.names], dtype=bool)
    others = int(np.count_nonzero(evaluation.feasible & ~allowed))
    restricted = evaluation.restricted(allowed, {not_held_reason(held): others} if others else None)
    return choose(restricted, nodes, rng=rng, top=top)


def not_held_reason(held: Sequence[str]) -> str:
    """The reason of a feasible node outside the rescheduler's hold for the pod."""
    return f"node(s) were not where hoss-rescheduler holds room for the pod ({', '.join(held)})"


def decide_with_reservations(profile: Profile, pod: PodView, hints: Sequence[Hint], nodes: NodeTable, *,
                             rng: np.random.Generator, top: int) -> Placement | Unschedulable:
    """Decide with the room of the Reservations that own the pod given back on their nodes, and a feasible
    Reservation node first (workers/reservations.py). The table is as before when this returns. A hint is what the
    Reservation's status claims: only one whose entry the ledger holds on that node gives room back (one marked
    Available on a node without room holds none, see reservation_refusal in hoss/ledger/lua/common.lua)."""
    freed = [h for h in hints if h.node in nodes and h.serves(pod.request)
             and (entry := nodes.pods.get(h.uid)) is not None and entry.node == h.node]
    short = restricted_short(pod, hints)
    for hint in freed:
        nodes.sub_used(hint.node, hint.request)
    try:
        evaluation = evaluate(profile, pod, nodes)
        if short:
            allowed = np.array([name not in short for name in nodes.names], dtype=bool)
            excluded = int(np.count_nonzero(evaluation.feasible & ~allowed))
            evaluation = evaluation.restricted(allowed, {RESTRICTED_SHORT_REASON: excluded} if excluded else None)
        decision = choose(evaluation, nodes, rng=rng, top=top)
    finally:
        for hint in freed:
            nodes.add_used(hint.node, hint.request)
    if not isinstance(decision, Placement):
        return decision
    feasible = [h.node for h in freed if evaluation.feasible[nodes.index[h.node]]]
    candidates = preferred_first(decision.candidates, feasible)
    if candidates == decision.candidates:
        return decision
    scores = dict(zip(decision.candidates, decision.scores, strict=True))
    best = max(decision.scores, default=0.0)
    return dataclasses.replace(decision, candidates=candidates,
                               scores=[scores.get(c, best) for c in candidates])


RESTRICTED_SHORT_REASON = "node(s) had a Reservation with allocatePolicy Restricted with too little left for the pod"


def restricted_short(pod: PodView, hints: Sequence[Hint]) -> set[str]:
    """The nodes an owner pod may not go to, as Koordinator's reservation filter decides: those where it matches
    Reservations with allocatePolicy Restricted and none of them has enough left for what it asks of their
    reserved resources (the pod may then take no free room of that node either)."""
    restricted = {h.node for h in hints if h.restricted}
    return restricted - {h.node for h in hints if h.restricted and h.serves(pod.request)}


def hold_in_batch(nodes: NodeTable, pod: PodView, node: str, shared: Shared) -> None:
    """Count the pod's placement on `node` in the table at once, so later pods of the batch see it."""
    nodes.hold_locally(node, nodes.request_on(node, pod))
    inter_pod = pod.reads_pod_index
    if pod.host_ports or inter_pod:
        # ... and its host ports and inter-pod terms (the ledger's stream confirms or the results undo it)
        nodes.place_pod(placed_view(pod, node))
    if inter_pod:
        shared.clear()  # shared evaluations predate this pod: it may change other nodes' feasibility
    for _evaluation, touched in shared.values():
        touched.add(node)


def settle_batch(nodes: NodeTable, decided: Sequence[Decided], results: list[BatchResult] | LedgerNotReady) -> None:
    """Undo `hold_in_batch` for the batch the ledger answered: its room, and each tentative placement that did not
    happen as planned."""
    for index, (_work, pod, decision) in enumerate(decided):
        if decision.candidates[0] in nodes:
            nodes.drop_locally(decision.candidates[0], nodes.request_on(decision.candidates[0], pod))
        tentative = pod.host_ports or pod.reads_pod_index
        placed = nodes.pods.get(pod.uid) if tentative else None
        result = results[index] if isinstance(results, list) else None
        if placed is not None and placed.node == decision.candidates[0] and not (
                isinstance(result, Reserved) and result.node == placed.node):
            nodes.remove_pod(pod.uid)  # the tentative placement did not happen


class Decider:
    """Decides one pod at a time over `nodes` (the worker's table, which `feed` keeps current)."""

    def __init__(self, settings: WorkerSettings, policies: Policies, nodes: NodeTable, feed: NodeFeed, *,
                 tally: Tally) -> None:
        self.policies = policies
        """The profiles in use: replaced only by `adopt`, between two batches."""
        self._staged: Policies | None = None
        self.nodes = nodes
        self.feed = feed
        self.tally = tally
        self.top = settings.candidates
        self.rng = np.random.default_rng(settings.seed)
        self.sampler = Sampler(tally.scheduler, seed=settings.seed)
        """Times the plugins of one evaluation in ten (`workers.timing`)."""
        self.http: aiohttp.ClientSession | None = None
        """For the extenders, opened at the first pod that needs one."""

    @property
    def default_profile(self) -> str:
        return self.policies.default

    def stage(self, policies: Policies) -> None:
        """Policies reloaded from the file: in use from the next `adopt`, never halfway through a batch."""
        self._staged = policies

    def adopt(self) -> Policies | None:
        """Put the staged policies in use (before a batch is decided); the new policies, or None when none were
        staged. Pods decided before keep their decisions."""
        staged, self._staged = self._staged, None
        if staged is not None:
            self.policies = staged
        return staged

    def profile_of(self, policy: str) -> Profile:
        """The policy's profile; the default for a policy this worker does not know."""
        profiles = self.policies.profiles
        return profiles.get(policy) or profiles[self.policies.default]

    async def decide(self, profile: Profile, work: Work, shared: Shared) -> Placement | Unschedulable:
        """Candidates for the item's pod, or why it fits nowhere (see the module docstring)."""
        pod = work.pod
        assert pod is not None
        if profile.extenders:
            if self.http is None:
                self.http = aiohttp.ClientSession()
            return await decide_with_extenders(self.sampler.profile(profile), pod, work.raw, self.nodes,
                                               rng=self.rng, top=self.top, session=self.http)
        if self.feed.holds:
            held = self.feed.held_nodes(pod.uid, compact.controller_uid(work.raw), pod.request)
            if held:
                return decide_held(self.sampler.profile(profile), pod, self.nodes, held, rng=self.rng, top=self.top)
        hints = hints_of(work.raw)
        if hints:
            return decide_with_reservations(self.sampler.profile(profile), pod, hints, self.nodes, rng=self.rng,
                                            top=self.top)
        key = signature(work)
        cached = shared.get(key)
        if cached is not None and len(cached[0].feasible) == len(self.nodes):
            evaluation, touched = cached
            decision = choose(evaluation, self.nodes, rng=self.rng, top=self.top)
            if isinstance(decision, Placement) and decision.candidates[0] not in touched:
                self.tally.decisions.labels("shared").inc()
                return decision
        evaluation = evaluate(self.sampler.profile(profile), pod, self.nodes)
        shared[key] = (evaluation, set())
        self.tally.decisions.labels("full").inc()
        return choose(evaluation, self.nodes, rng=self.rng, top=self.top)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
