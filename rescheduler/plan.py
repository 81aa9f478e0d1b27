"""The defragmenting rescheduler's planner: which pods to move where so that GPUs are not stranded. Pure.

The planner sees nodes (allocatable, used, room held in the ledger) and pods (request, node, whether they may be
moved, their PodDisruptionBudgets) as the process read them, and answers a `Plan`: the smallest set of moves
(fewest pods, then fewest GPUs moved) that reaches the best fragmentation it can find, or None.

Two questions are asked:

- `plan_for_pending`: a pending GPU pod. Without moves it would go where it fits most tightly (what the `gpu`
  policy does), or nowhere. For every node, the fewest movable pods whose departure lets the pod fit there, each
  relocated elsewhere (largest first, each where it leaves the fewest GPUs free); a plan is kept when the
  cluster's fragmentation afterwards is better than without moves (or the pod fits nowhere without them). The
  example of issue 15: node1 runs A (4 GPUs) and B (3), node2 is empty, C asks for 4: without moves C lands on
  node2 and both nodes are partly used; the plan moves B to node2 and C joins A (node1 full, node2 with 5 GPUs
  free in one piece).
- `plan_defragment`: the periodic pass, when GPUs stranded on partly used nodes pass a threshold. Candidates are
  drains (every GPU pod of a partly used node moved onto other partly used nodes, so that node becomes whole) and
  relocations (a placed pod moved to another node, with the pods there that make room for it moved too, the
  pending question asked for a placed pod). The best fragmentation wins, then the fewest moves, the fewest GPUs.

Fragmentation is compared as (whole free GPU nodes more, stranded GPUs fewer, partly used nodes fewer, largest
free piece larger), in that order.

What may move (`Pod.movable` is '' or the reason it may not, decided by the caller from the pod itself): only a
pod whose controller recreates it, never a gang member (a gang is never split: its members do not move at all),
never a pod that opted out (`hoss.io/movable: "false"`). A plan also never evicts more pods covered by a
PodDisruptionBudget than the budget allows (`Pod.budgets`, `allowed`). Where a pod may run at all (node
selector, taints; the caller's `Pod.nodes`) is respected for every target.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

GPU = "nvidia.com/gpu"

Vector = Mapping[str, int]


@dataclass(frozen=True)
class Node:
    name: str
    alloc: Vector
    used: Vector
    """Every pod's request on the node (bound and reserved), as the ledger counts it."""
    held: Vector = field(default_factory=dict)
    """Room the ledger holds on the node for pods not there yet (preemptors, earlier moves)."""

    @property
    def gpus(self) -> int:
        return self.alloc.get(GPU, 0)


@dataclass(frozen=True)
class Pod:
    key: str
    """namespace/name"""
    uid: str
    node: str
    """'' while pending"""
    request: Vector
    movable: str = ""
    """'' when a move may evict it, else why not (shown by the dry run)."""
    owner: str = ""
    """Its controller's uid: the replacement pod claims the held room by it."""
    budgets: tuple[str, ...] = ()
    """The PodDisruptionBudgets (namespace/name) that select it."""
    nodes: frozenset[str] | None = None
    """The nodes its selector, affinity and tolerations allow (resources aside); None: every node."""
    held: Vector | None = None
    """What the ledger holds for it on a target (its GPUs left out where they are DRA devices,
    `rescheduler.devices`); None: its request."""

    @property
    def gpus(self) -> int:
        return self.request.get(GPU, 0)


@dataclass(frozen=True)
class Move:
    pod: Pod
    source: str
    target: str

    def describe(self) -> str:
        return f"move {self.pod.key} ({self.pod.gpus} GPUs) from {self.source} to {self.target}"


@dataclass(frozen=True)
class Fragmentation:
    gpu_nodes: int
    whole_free: int
    partly_used: int
    full: int
    stranded: int
    largest_free: int

    def key(self) -> tuple[int, int, int, int]:
        """Larger is better."""
        return (self.whole_free, -self.stranded, -self.partly_used, self.largest_free)

    def describe(self) -> str:
        return (f"{self.whole_free} whole free, {self.partly_used} partly used, {self.full} full GPU nodes; "
                f"{self.stranded} GPUs stranded; largest free piece {self.largest_free}")


@dataclass(frozen=True)
class Plan:
    reason: str
    """'pending' (for `pending`) or 'fragmentation'."""
    moves: tuple[Move, ...]
    before: Fragmentation
    after: Fragmentation
    pending: Pod | None = None
    pending_node: str = ""
    """Where the pending pod goes once the moves are done."""

    @property
    def gpus_moved(self) -> int:
        return sum(m.pod.gpus for m in self.moves)

    def describe(self) -> list[str]:
        lines = []
        if self.pending is not None:
            lines.append(f"for pending pod {self.pending.key} ({self.pending.gpus} GPUs) on {self.pending_node}:")
        else:
            lines.append("to defragment GPUs:")
        lines += [f"  {m.describe()}" for m in self.moves]
        lines.append(f"  before: {self.before.describe()}")
        lines.append(f"  after:  {self.after.describe()}")
        return lines


# --- arithmetic over a tentative state ------------------------------------------------------------------------


def _add(a: Vector, b: Vector, sign: int = 1) -> dict[str, int]:
    out = dict(a)
    for resource, amount in b.items():
        out[resource] = out.get(resource, 0) + sign * amount
    return out


def _fits(request: Vector, free: Vector) -> bool:
    return all(amount <= 0 or amount <= free.get(resource, 0) for resource, amount in request.items())


class _State:
    """Used totals per node, changed tentatively by moves (holds stay as they were)."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.used = {n.name: dict(n.used) for n in self.nodes.values()}

    def copy(self) -> _State:
        other = _State(())
        other.nodes = self.nodes
        other.used = {name: dict(used) for name, used in self.used.items()}
        return other

    def free(self, name: str) -> dict[str, int]:
        node = self.nodes[name]
        return _add(_add(node.alloc, self.used[name], -1), node.held, -1)

    def fits(self, pod: Pod, name: str) -> bool:
        return (pod.nodes is None or name in pod.nodes) and _fits(pod.request, self.free(name))

    def take(self, pod: Pod, name: str) -> None:
        self.used[name] = _add(self.used[name], pod.request)

    def give(self, pod: Pod, name: str) -> None:
        self.used[name] = _add(self.used[name], pod.request, -1)

    def gpu_used(self, name: str) -> int:
        return self.used[name].get(GPU, 0) + self.nodes[name].held.get(GPU, 0)

    def fragmentation(self) -> Fragmentation:
        return fragmentation((n.gpus, self.gpu_used(n.name)) for n in self.nodes.values())


def fragmentation(nodes: Iterable[tuple[int, int]]) -> Fragmentation:
    """Of (allocatable, used) GPUs per node; nodes without GPUs are left out, an overcommitted one is full."""
    gpu_nodes = whole = partly = full = stranded = largest = 0
    for alloc, used in nodes:
        if alloc <= 0:
            continue
        gpu_nodes += 1
        free = max(0, alloc - used)
        largest = max(largest, free)
        if used <= 0:
            whole += 1
        elif free == 0:
            full += 1
        else:
            partly += 1
            stranded += free
    return Fragmentation(gpu_nodes=gpu_nodes, whole_free=whole, partly_used=partly, full=full, stranded=stranded,
                         largest_free=largest)


def best_fit(state: _State, pod: Pod, *, exclude: Iterable[str] = (), whole_ok: bool = True) -> str | None:
    """The node where `pod` fits leaving the fewest GPUs free (the `gpu` policy's choice), ties by name."""
    skip = set(exclude)
    best: tuple[int, str] | None = None
    for name in sorted(state.nodes):
        if name in skip or not state.fits(pod, name):
            continue
        if not whole_ok and state.gpu_used(name) <= 0 and state.nodes[name].gpus > 0:
            continue
        left = state.free(name).get(GPU, 0) - pod.gpus
        if best is None or left < best[0]:
            best = (left, name)
    return best[1] if best else None


def _relocate(state: _State, pods: Sequence[Pod], *, exclude: Iterable[str], whole_ok: bool) -> list[Move] | None:
    """Moves placing each of `pods` (taken off their nodes already) elsewhere, largest first; None if one fits
    nowhere. Changes `state`."""
    moves = []
    for pod in sorted(pods, key=lambda p: (-p.gpus, p.key)):
        target = best_fit(state, pod, exclude=exclude, whole_ok=whole_ok)
        if target is None:
            return None
        state.take(pod, target)
        moves.append(Move(pod=pod, source=pod.node, target=target))
    return moves


def _within_budgets(pods: Iterable[Pod], allowed: Mapping[str, int]) -> bool:
    counts: dict[str, int] = {}
    for pod in pods:
        for budget in pod.budgets:
            counts[budget] = counts.get(budget, 0) + 1
    return all(count <= allowed.get(budget, 0) for budget, count in counts.items())


def _movable_gpu_pods(pods: Iterable[Pod], node: str) -> list[Pod]:
    return [p for p in pods if p.node == node and not p.movable and p.gpus > 0]


# --- the two questions ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    moves: tuple[Move, ...]
    node: str
    after: Fragmentation

    def cost(self) -> tuple[int, int]:
        return (len(self.moves), sum(m.pod.gpus for m in self.moves))


def _make_room(state: _State, subject: Pod, node: str, pods: Sequence[Pod], *, allowed: Mapping[str, int],
               max_moves: int) -> list[_Candidate]:
    """The smallest sets of movable pods on `node` whose departure lets `subject` fit there, each relocated to
    another node (where `subject` leaves, too: a swap): every working set of the smallest size, as candidates."""
    if subject.nodes is not None and node not in subject.nodes:
        return []
    found: list[_Candidate] = []
    if state.fits(subject, node):
        after = state.copy()
        after.take(subject, node)
        return [_Candidate(moves=(), node=node, after=after.fragmentation())]
    others = [p for p in _movable_gpu_pods(pods, node) if p.uid != subject.uid]
    for size in range(1, max_moves + 1):
        for group in itertools.combinations(others, size):
            if not _within_budgets([*group, *([subject] if subject.node else [])], allowed):
                continue
            trial = state.copy()
            for pod in group:
                trial.give(pod, node)
            if not trial.fits(subject, node):
                continue
            trial.take(subject, node)
            moves = _relocate(trial, group, exclude=(node,), whole_ok=True)
            if moves is None:
                continue
            found.append(_Candidate(moves=tuple(moves), node=node, after=trial.fragmentation()))
        if found:
            return found
    return []


def _pick(candidates: Iterable[_Candidate], *, by_score_first: bool) -> _Candidate | None:
    ranked = sorted(
        candidates,
        key=(lambda c: (tuple(-x for x in c.after.key()), c.cost(), c.node)) if by_score_first
        else (lambda c: (c.cost(), tuple(-x for x in c.after.key()), c.node)),
    )
    return ranked[0] if ranked else None


def plan_for_pending(pending: Pod, nodes: Sequence[Node], pods: Sequence[Pod], *,
                     allowed: Mapping[str, int] | None = None, max_moves: int = 2) -> Plan | None:
    """A plan that makes room for `pending` where the cluster ends less fragmented than without moves, or None
    (it fits well enough as things are, or no plan of at most `max_moves` moves helps)."""
    if pending.gpus <= 0:
        return None
    state = _State(nodes)
    before = state.fragmentation()
    baseline_node = best_fit(state, pending)
    baseline: tuple[int, ...] | None = None
    if baseline_node is not None:
        trial = state.copy()
        trial.take(pending, baseline_node)
        baseline = trial.fragmentation().key()
    candidates = []
    for node in sorted(state.nodes):
        for candidate in _make_room(state, pending, node, pods, allowed=allowed or {}, max_moves=max_moves):
            if candidate.moves and (baseline is None or candidate.after.key() > baseline):
                candidates.append(candidate)
    best = _pick(candidates, by_score_first=False)
    if best is None:
        return None
    return Plan(reason="pending", moves=best.moves, before=before, after=best.after, pending=pending,
                pending_node=best.node)


def plan_defragment(nodes: Sequence[Node], pods: Sequence[Pod], *, allowed: Mapping[str, int] | None = None,
                    max_moves: int = 4) -> Plan | None:
    """The plan of at most `max_moves` moves that leaves the GPUs least fragmented, if it is better than now."""
    allowed = allowed or {}
    state = _State(nodes)
    before = state.fragmentation()
    candidates: list[_Candidate] = []
    # Drains: a partly used node's GPU pods all moved onto other partly used nodes.
    for name in sorted(state.nodes):
        node = state.nodes[name]
        gpu_used = state.gpu_used(name)
        if node.gpus <= 0 or gpu_used <= 0 or gpu_used >= node.gpus or node.held.get(GPU, 0) > 0:
            continue
        on_node = [p for p in pods if p.node == name and p.gpus > 0]
        if not on_node or len(on_node) > max_moves or any(p.movable for p in on_node):
            continue
        if not _within_budgets(on_node, allowed):
            continue
        trial = state.copy()
        for pod in on_node:
            trial.give(pod, name)
        moves = _relocate(trial, on_node, exclude=(name,), whole_ok=False)
        if moves is not None:
            candidates.append(_Candidate(moves=tuple(moves), node=name, after=trial.fragmentation()))
    # Relocations: a placed pod moved, with the pods that make room for it at its target.
    for subject in pods:
        if subject.movable or subject.gpus <= 0 or not subject.node:
            continue
        trial = state.copy()
        trial.give(subject, subject.node)
        for name in sorted(state.nodes):
            if name == subject.node:
                continue
            for candidate in _make_room(trial, subject, name, pods, allowed=allowed, max_moves=max_moves - 1):
                own = Move(pod=subject, source=subject.node, target=name)
                candidates.append(_Candidate(moves=(*candidate.moves, own), node=name, after=candidate.after))
    better = [c for c in candidates if c.moves and c.after.key() > before.key()]
    best = _pick(better, by_score_first=True)
    if best is None:
        return None
    return Plan(reason="fragmentation", moves=best.moves, before=before, after=best.after)
