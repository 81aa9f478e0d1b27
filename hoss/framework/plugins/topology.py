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
  `hoss.framework.podterms`).
- filter (DoNotSchedule): a node without a constraint's key is refused with ``node(s) didn't match pod topology
  spread constraints (missing required label)``; else ``count(node's domain) + (1 if the pod matches the
  selector) - global minimum`` must not exceed maxSkew, else ``node(s) didn't match pod topology spread
  constraints``. The global minimum is the smallest domain count, or 0 when there are fewer domains than
  minDomains. Constraints are checked in order and a node is reported under the first one it fails.
  Its figures (`hoss why`): the label a node lacks, or its domain's count, the global minimum and the skew.
- score (ScheduleAnyway, kube-scheduler's default weight 2): feasible nodes lacking a key are ignored (score 0);
  for the others, per constraint ``count * log(domains + 2) + maxSkew - 1`` (on ``kubernetes.io/hostname`` the
  node's own count, and the number of scored nodes as the domains), summed and rounded; normalised as
  kube-scheduler does, ``100 * (max + min - score) // max`` (all 100 when max is 0), so emptier domains win.

Cluster-default constraints, as kube-scheduler's: a pod without constraints of its own gets the profile's
defaults (args ``defaultingType: System``, the default: ScheduleAnyway on hostname with maxSkew 3 and on
``topology.kubernetes.io/zone`` with maxSkew 5; ``List`` with ``defaultConstraints``, ScheduleAnyway only; an
empty List disables them) with the selector of the Services, ReplicationController, ReplicaSet or StatefulSet
that select it, which the dispatcher puts in its compact form (`dispatcher.spreading`); none when that selector
is empty. With System defaults a node lacking a key is still scored (kube-scheduler's requireAllTopologies is
false then): it just gets nothing for that constraint. The cost for a pod without constraints or default
selector is one tuple check per plugin call. Races between workers on DoNotSchedule constraints are settled by
the ledger (the constraints' topology keys are inter-pod domain keys: see `hoss/ledger/lua/common.lua`, inter-pod
domains).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from hoss.framework.cycle import MAX_NODE_SCORE, BoolArray, FilterResult, FloatArray
from hoss.framework.explain import Figures
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.affinity import NodeAffinity
from hoss.framework.plugins.taints import TaintToleration
from hoss.framework.pod import PodView
from hoss.framework.podterms import SpreadConstraint

CONSTRAINTS_NOT_MATCH = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL = f"{CONSTRAINTS_NOT_MATCH} (missing required label)"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
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


@dataclass(frozen=True)
class _Skew:
    """One DoNotSchedule constraint measured over every node: whether the node has its key, and the skew the pod
    would make there (the count of the node's domain, plus one when the pod matches itself, less the global
    minimum)."""

    constraint: SpreadConstraint
    has: BoolArray
    own: IntArray
    itself: int
    minimum: int

    @property
    def skew(self) -> IntArray:
        return self.own + self.itself - self.minimum


def _skews(pod: PodView, nodes: NodeTable, hard: Sequence[SpreadConstraint]) -> list[_Skew]:
    """Each of the `hard` constraints measured as the filter reads it (see the module docstring)."""
    with_all_keys = _has_keys(nodes, hard)
    inclusion = _Inclusion(pod, nodes)
    measured = []
    for constraint in hard:
        codes = nodes.label_codes(constraint.topology_key)
        counted = with_all_keys & inclusion.mask(constraint)
        counts, present = domain_counts(nodes, constraint.topology_key, counted,
                                        pods_per_node(nodes, constraint, pod.namespace))
        domains = int(np.count_nonzero(present))
        minimum = 0 if domains < constraint.min_domains else int(counts[present].min())
        has = codes >= 0
        own = np.where(has, counts[np.where(has, codes, 0)] if counts.size else 0, 0)
        measured.append(_Skew(constraint=constraint, has=has, own=own,
                              itself=int(constraint.matches_itself(pod.labels)), minimum=minimum))
    return measured


SYSTEM_DEFAULTS = ((HOSTNAME, 3), (ZONE, 5))
"""kube-scheduler's System defaulting: ScheduleAnyway on hostname (maxSkew 3) and zone (maxSkew 5)."""


class DefaultConstraint(BaseModel):
    """One of a profile's List default constraints (kube-scheduler's ``defaultConstraints`` entry)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    max_skew: StrictInt = Field(alias="maxSkew", ge=1)
    topology_key: str = Field(alias="topologyKey", min_length=1)
    when_unsatisfiable: Literal["ScheduleAnyway"] = Field(alias="whenUnsatisfiable")
    """Only ScheduleAnyway: a DoNotSchedule default would need the ledger's race rule, which reads the pod's
    own constraints."""


class PodTopologySpreadArgs(BaseModel):
    """Args of PodTopologySpread, as kube-scheduler's PodTopologySpreadArgs."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    defaulting_type: Literal["System", "List"] = Field(default="System", alias="defaultingType")
    """System: kube-scheduler's defaults (`SYSTEM_DEFAULTS`); List: `default_constraints` (empty: none)."""
    default_constraints: list[DefaultConstraint] = Field(default_factory=list, alias="defaultConstraints")

    @model_validator(mode="after")
    def _system_takes_no_list(self) -> PodTopologySpreadArgs:
        if self.defaulting_type == "System" and self.default_constraints:
            raise ValueError("defaultConstraints must be empty when defaultingType is System")
        return self


class PodTopologySpread:
    """Filter (DoNotSchedule) and score (ScheduleAnyway) of topology spread constraints; see the module docstring."""

    name = "PodTopologySpread"

    def __init__(self, *, defaults: Sequence[tuple[str, int]] = SYSTEM_DEFAULTS, system: bool = True) -> None:
        self.defaults = tuple(defaults)
        """(topologyKey, maxSkew) of the ScheduleAnyway constraints a pod without its own gets."""
        self.system = system

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        parsed = PodTopologySpreadArgs.model_validate(args)
        if parsed.defaulting_type == "System":
            return cls()
        return cls(defaults=[(c.topology_key, c.max_skew) for c in parsed.default_constraints], system=False)

    def _defaulted(self, pod: PodView) -> tuple[SpreadConstraint, ...]:
        """The profile's default constraints for a pod without its own, with its default selector."""
        if pod.spread_constraints or pod.default_spread_selector is None or not self.defaults:
            return ()
        return tuple(SpreadConstraint(max_skew=skew, topology_key=key, hard=False,
                                      selector=pod.default_spread_selector) for key, skew in self.defaults)

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        hard = pod.hard_spread if pod.spread_constraints else ()
        if not hard:
            return FilterResult.from_reasons(rows, {})
        undecided = np.ones(rows, dtype=np.bool_)
        missing = np.zeros(rows, dtype=np.bool_)
        mismatch = np.zeros(rows, dtype=np.bool_)
        for check in _skews(pod, nodes, hard):
            lacking = undecided & ~check.has
            missing |= lacking
            undecided &= check.has
            over = undecided & (check.skew > check.constraint.max_skew)
            mismatch |= over
            undecided &= ~over
        reasons: dict[str, BoolArray] = {}
        if missing.any():
            reasons[MISSING_LABEL] = missing
        if mismatch.any():
            reasons[CONSTRAINTS_NOT_MATCH] = mismatch
        return FilterResult.from_reasons(rows, reasons)

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """Per node, the first DoNotSchedule constraint it fails: the label it lacks, or its domain's skew."""
        checks = _skews(pod, nodes, pod.hard_spread)
        found = []
        for row in rows:
            for check in checks:
                constraint = check.constraint
                key = constraint.topology_key
                if not check.has[row]:
                    text = f"{key} (maxSkew {constraint.max_skew}): node has no label {key}"
                    found.append(Figures(text=text, group=text, values={"topologyKey": key, "missing": True}))
                    break
                skew = int(check.skew[row])
                if skew > constraint.max_skew:
                    domain = f"{key}={nodes.labels[row][key]}"
                    own = int(check.own[row])
                    text = (f"{domain}: {own} matching pod(s)" + (" + this pod" if check.itself else "")
                            + f" - global minimum {check.minimum} = skew {skew} > maxSkew {constraint.max_skew}")
                    found.append(Figures(text=text, group=text, values={
                        "topologyKey": key, "domain": nodes.labels[row][key], "matching": own,
                        "self": bool(check.itself), "minimum": check.minimum, "skew": skew,
                        "maxSkew": constraint.max_skew}))
                    break
            else:
                found.append(Figures(text="", group=""))
        return found

    def skips(self, pod: PodView, nodes: NodeTable) -> bool:
        """No ScheduleAnyway constraint, own or defaulted: nothing to score (every node would get 0)."""
        return all(c.hard for c in pod.spread_constraints) and not self._defaulted(pod)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        rows = len(nodes)
        soft: Sequence[SpreadConstraint] = [c for c in pod.spread_constraints if not c.hard]
        # kube-scheduler's requireAllTopologies: only System defaults score nodes lacking one of the keys
        require_all = bool(pod.spread_constraints) or not self.system
        if not pod.spread_constraints:
            soft = self._defaulted(pod)
        if not soft:
            return np.full(rows, IGNORED, dtype=np.float64)  # nothing to score: every node normalises to 0
        with_all_keys = _has_keys(nodes, soft) if require_all else np.ones(rows, dtype=np.bool_)
        scored = feasible & with_all_keys
        inclusion = _Inclusion(pod, nodes)
        total = np.zeros(rows, dtype=np.float64)
        for constraint in soft:
            per_node = pods_per_node(nodes, constraint, pod.namespace)
            codes = nodes.label_codes(constraint.topology_key)
            has = codes >= 0
            if constraint.topology_key == HOSTNAME:
                count = per_node
                size = int(np.count_nonzero(scored))
            else:
                values = len(nodes.label_values(constraint.topology_key))
                # the distinct values among the scored nodes (a node lacking the key counts as the value "")
                size = int(np.count_nonzero(np.bincount(codes[scored & has], minlength=values))) \
                    + int(bool((scored & ~has).any()))
                counts, _present = domain_counts(nodes, constraint.topology_key,
                                                 with_all_keys & inclusion.mask(constraint), per_node)
                count = np.where(has, counts[np.where(has, codes, 0)] if counts.size else 0, 0)
            term = count * math.log(size + 2) + (constraint.max_skew - 1)
            total += np.where(has, term, 0.0)  # a node lacking the key gets nothing for this constraint
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
