"""PodTopologySpread: pods spread over topology domains as kube-scheduler spreads them. Vectorised per domain.

Over the workers' pod index (`NodeTable.pods`, every pod holding a ledger entry), as kube-scheduler's plugin:

- which nodes count: a node counts for a constraint when it carries *every* topology key of the pod's
  constraints of that kind (DoNotSchedule for the filter, ScheduleAnyway for the score) and passes the
  constraint's node inclusion policies: ``nodeAffinityPolicy: Honor`` (the default) keeps only nodes matching the
  pod's nodeSelector and required node affinity, ``nodeTaintsPolicy: Honor`` (default Ignore) only nodes without
  a NoSchedule/NoExecute taint the pod does not tolerate. A domain (a value of the topology key) exists when a
  counted node has it; its count is the number of pods on its counted nodes that are in the pod's namespace, not
  terminating (metadata.deletionTimestamp set; kube-scheduler skips them, InterPodAffinity does not) and
  match the constraint's selector (an empty selector counts none; matchLabelKeys are merged, see
  `workers.podterms`).
- filter (DoNotSchedule): a node without a constraint's key is refused with ``node(s) didn't match pod topology
  spread constraints (missing required label)``; else ``count(node's domain) + (1 if the pod matches the
  selector) - global minimum`` must not exceed maxSkew, else ``node(s) didn't match pod topology spread
  constraints``. The global minimum is the smallest domain count, or 0 when there are fewer domains than
  minDomains. Constraints are checked in order and a node is reported under the first one it fails.
- score (ScheduleAnyway, kube-scheduler's default weight 2): feasible nodes lacking a key are ignored (score 0);
  for the others, per constraint ``count * log(domains + 2) + maxSkew - 1`` (on ``kubernetes.io/hostname`` the
  node's own count, and the number of scored nodes as the domains), summed and rounded; normalised as
  kube-scheduler does, ``100 * (max + min - score) // max`` (all 100 when max is 0), so emptier domains win.

Not done: the cluster-default constraints kube-scheduler applies to pods that have none (``ScheduleAnyway`` on
hostname and zone for pods of Services and controllers) need the Services and controllers, which workers do not
have; hoss spreads such pods by its profiles' scores instead. The cost for a pod without constraints is one tuple
check per plugin call. Races between workers on DoNotSchedule constraints are settled by the ledger (the
constraints' topology keys are inter-pod domain keys: see `resolver/lua/common.lua`, inter-pod domains).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from workers.framework import MAX_NODE_SCORE, BoolArray, FilterResult, FloatArray, TakesNoArgs
from workers.nodes import NodeTable
from workers.plugins.affinity import NodeAffinity
from workers.plugins.taints import TaintToleration
from workers.pod import PodView
from workers.podterms import SpreadConstraint

CONSTRAINTS_NOT_MATCH = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL = f"{CONSTRAINTS_NOT_MATCH} (missing required label)"
HOSTNAME = "kubernetes.io/hostname"
IGNORED = -1.0
"""A raw score marking a node the score ignores (it lacks a topology key); normalised to 0."""

IntArray = NDArray[np.int64]


class _Inclusion:
    """The nodes each inclusion policy keeps, computed once per decision and only when a constraint asks."""

    def __init__(self, pod: PodView, nodes: NodeTable) -> None:
        self.pod, self.nodes = pod, nodes
        self._affinity: BoolArray | None = None
        self._taints: BoolArray | None = None

    def mask(self, constraint: SpreadConstraint) -> BoolArray:
        kept = np.ones(len(self.nodes), dtype=np.bool_)
        if constraint.honor_node_affinity and (self.pod.node_selector or self.pod.required_affinity is not None):
            if self._affinity is None:
                self._affinity = NodeAffinity().filter(self.pod, self.nodes).mask
            kept &= self._affinity
        if constraint.honor_node_taints:
            if self._taints is None:
                self._taints = TaintToleration().filter(self.pod, self.nodes).mask
            kept &= self._taints
        return kept


def pods_per_node(nodes: NodeTable, constraint: SpreadConstraint, namespace: str) -> IntArray:
    """Per row, the pods on the node that count for `constraint` (the incoming pod's `namespace`)."""
    counts = np.zeros(len(nodes), dtype=np.int64)
    if constraint.selector is None or not constraint.selector.requirements:
        return counts
    rows = [row for pod in nodes.pods_matching(constraint.selector)
            if pod.namespace == namespace and not pod.terminating and (row := nodes.index.get(pod.node)) is not None]
    if rows:
        np.add.at(counts, np.asarray(rows, dtype=np.intp), 1)
    return counts


def domain_counts(nodes: NodeTable, key: str, counted: BoolArray, per_node: IntArray) -> tuple[IntArray, BoolArray]:
    """Per value code of label `key`: the pods on the `counted` nodes of that domain, and whether the domain
    exists (some counted node has that value)."""
    codes = nodes.label_codes(key)
    size = len(nodes.label_values(key))
    chosen = counted & (codes >= 0)
    present = np.bincount(codes[chosen], minlength=size) > 0
    counts = np.bincount(codes[chosen], weights=per_node[chosen], minlength=size).astype(np.int64)
    return counts, present


def _has_keys(nodes: NodeTable, constraints: Sequence[SpreadConstraint]) -> BoolArray:
    has = np.ones(len(nodes), dtype=np.bool_)
    for constraint in constraints:
        has &= nodes.label_codes(constraint.topology_key) >= 0
    return has


class PodTopologySpread(TakesNoArgs):
    """Filter (DoNotSchedule) and score (ScheduleAnyway) of topology spread constraints; see the module docstring."""

    name = "PodTopologySpread"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        hard = pod.hard_spread if pod.spread_constraints else ()
        if not hard:
            return FilterResult.from_reasons(rows, {})
        with_all_keys = _has_keys(nodes, hard)
        inclusion = _Inclusion(pod, nodes)
        undecided = np.ones(rows, dtype=np.bool_)
        missing = np.zeros(rows, dtype=np.bool_)
        mismatch = np.zeros(rows, dtype=np.bool_)
        for constraint in hard:
            codes = nodes.label_codes(constraint.topology_key)
            counted = with_all_keys & inclusion.mask(constraint)
            counts, present = domain_counts(nodes, constraint.topology_key, counted,
                                            pods_per_node(nodes, constraint, pod.namespace))
            domains = int(np.count_nonzero(present))
            minimum = 0 if domains < constraint.min_domains else int(counts[present].min())
            has = codes >= 0
            own = np.where(has, counts[np.where(has, codes, 0)] if counts.size else 0, 0)
            skew = own + int(constraint.matches_itself(pod.labels)) - minimum
            lacking = undecided & ~has
            missing |= lacking
            undecided &= has
            over = undecided & (skew > constraint.max_skew)
            mismatch |= over
            undecided &= ~over
        reasons: dict[str, BoolArray] = {}
        if missing.any():
            reasons[MISSING_LABEL] = missing
        if mismatch.any():
            reasons[CONSTRAINTS_NOT_MATCH] = mismatch
        return FilterResult.from_reasons(rows, reasons)

    def skips(self, pod: PodView, nodes: NodeTable) -> bool:
        """No ScheduleAnyway constraint: nothing to score (every node would get 0)."""
        return all(c.hard for c in pod.spread_constraints)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        rows = len(nodes)
        soft = [c for c in pod.spread_constraints if not c.hard] if pod.spread_constraints else []
        if not soft:
            return np.full(rows, IGNORED, dtype=np.float64)  # nothing to score: every node normalises to 0
        with_all_keys = _has_keys(nodes, soft)
        scored = feasible & with_all_keys
        inclusion = _Inclusion(pod, nodes)
        total = np.zeros(rows, dtype=np.float64)
        for constraint in soft:
            per_node = pods_per_node(nodes, constraint, pod.namespace)
            if constraint.topology_key == HOSTNAME:
                count = per_node
                size = int(np.count_nonzero(scored))
            else:
                codes = nodes.label_codes(constraint.topology_key)
                values = len(nodes.label_values(constraint.topology_key))
                size = int(np.count_nonzero(np.bincount(codes[scored], minlength=values)))
                counts, _present = domain_counts(nodes, constraint.topology_key,
                                                 with_all_keys & inclusion.mask(constraint), per_node)
                count = np.where(codes >= 0, counts[np.where(codes >= 0, codes, 0)] if counts.size else 0, 0)
            total += count * math.log(size + 2) + (constraint.max_skew - 1)
        raw = np.floor(total + 0.5)  # Go's math.Round, on non-negative values
        raw[~with_all_keys] = IGNORED
        return raw

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        """kube-scheduler's NormalizeScore: ``100 * (max + min - s) // max`` over the scored nodes, 100 each when
        max is 0; ignored nodes get 0."""
        normalized = np.zeros(scores.shape, dtype=np.float64)
        valid = feasible & (scores >= 0)
        if not valid.any():
            return normalized
        values = scores[valid]
        low, high = float(values.min()), float(values.max())
        if high == 0:
            normalized[valid] = MAX_NODE_SCORE
        else:
            normalized[valid] = np.floor(MAX_NODE_SCORE * (high + low - values) / high)
        return normalized
