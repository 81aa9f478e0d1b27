"""The scheduling framework: filter and score plugins, profiles, and the decision for one pod. Pure, no I/O.

A plugin sees the whole `NodeTable` and answers with one numpy array over all rows, so deciding for a pod costs a
handful of vectorised passes, not a Python loop over 20,000 nodes.

Decision rules, as kube-scheduler's framework applies them:
- Filters run in profile order; a node is feasible when every filter passes it. A node is reported under the
  reasons of the first filter that rejects it (that filter may give several, e.g. two insufficient resources),
  so the counts in the message are those kube-scheduler would print for the same profile order.
- Each score plugin's raw scores are normalised to 0..100 over the feasible nodes (by the plugin's own
  `normalize`, or min-max), multiplied by the plugin's weight and summed. A plugin with a ``skips(pod, nodes)``
  method that answers True adds nothing for that pod (kube-scheduler's PreScore Skip), at no cost.
- A tiny random jitter from the worker's own generator breaks ties, so workers that agree on the scores still
  spread their picks instead of all racing for the same node. It is far below one score point, so it never
  reorders nodes whose scores differ by more than `tie_break`.
- The result lists the best `top` feasible nodes, best first, so the worker can fall back to the next one when
  the ledger reports a conflict without deciding again.

Deciding is two steps, so that other deciders can work between them: `evaluate` (filters, then scores: the
feasible mask, the rejection reasons and the total score per node) and `choose` (jitter, then the best `top`).
`decide` is their composition. HTTP extenders (`workers.extender`) narrow the feasible mask and add their
priorities between the two; gangs (`workers.gang`) restrict the mask to a leaf switch and choose one node per
member.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, cast, runtime_checkable

import numpy as np
from numpy.typing import NDArray
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from hoss.framework.errors import PluginError
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView

MAX_NODE_SCORE = 100.0
NO_NODES_MESSAGE = "no nodes available to schedule pods"

BoolArray = NDArray[np.bool_]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class FilterResult:
    """A filter's verdict over all rows: `mask` passes a node; `reasons[text]` marks the nodes rejected for `text`."""

    mask: BoolArray
    reasons: Mapping[str, BoolArray] = field(default_factory=dict)

    @classmethod
    def from_reasons(cls, rows: int, reasons: Mapping[str, BoolArray]) -> FilterResult:
        """Pass exactly the nodes that no reason marks."""
        rejected = np.zeros(rows, dtype=np.bool_)
        for marked in reasons.values():
            rejected |= marked
        return cls(mask=~rejected, reasons=reasons)


class FilterPlugin(Protocol):
    """Decides which nodes can run the pod."""

    name: str

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult: ...


class ScorePlugin(Protocol):
    """Ranks nodes for the pod; only the entries of feasible nodes are read."""

    name: str

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray: ...


@runtime_checkable
class NormalizingScorePlugin(ScorePlugin, Protocol):
    """A score plugin that maps its own raw scores to 0..100 (e.g. scores that already are percentages)."""

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray: ...


class NoArgs(BaseModel):
    """The args of a plugin that takes none: any key is a mistake in the policy file."""

    model_config = ConfigDict(extra="forbid")


class TakesNoArgs:
    """Base of plugins without args: ``from_args`` only checks that the policy file gave none."""

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        NoArgs.model_validate(args)
        return cls()


MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's extender priorities run 0..10; they are scaled to the plugins' 0..100."""


class ExtenderConfig(BaseModel):
    """One HTTP scheduler extender of a profile, in kube-scheduler's ``extenders`` spelling.

    Plain configuration, no I/O: `workers.extender` does the calls. Binding, preemption, TLS and managed resources
    are not supported; naming them in the policy file is an error rather than a silently ignored key.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    url_prefix: AnyHttpUrl = Field(alias="urlPrefix")
    """Base URL of the extender; a verb is appended as ``<urlPrefix>/<verb>``."""
    filter_verb: str = Field(default="", alias="filterVerb")
    """Verb of the filter call; empty: the extender does not filter."""
    prioritize_verb: str = Field(default="", alias="prioritizeVerb")
    """Verb of the prioritize call; empty: the extender does not score."""
    weight: StrictInt = Field(default=1, ge=1, le=100)
    """Multiplies the extender's 0..10 priority (scaled to 0..100) in the node's total."""
    node_cache_capable: StrictBool = Field(default=False, alias="nodeCacheCapable")
    """True: the extender keeps its own node cache and gets node names; false: it gets a minimal node list."""
    ignorable: StrictBool = False
    """True: a failing or slow extender is skipped (and logged); false: its failure makes the pod unschedulable."""
    timeout_seconds: float = Field(default=30.0, gt=0, le=300, alias="timeoutSeconds")
    """Deadline of one call; kube-scheduler's default httpTimeout is 30s."""

    @model_validator(mode="after")
    def _has_a_verb(self) -> ExtenderConfig:
        if not self.filter_verb and not self.prioritize_verb:
            raise ValueError("an extender needs a filterVerb or a prioritizeVerb")
        return self

    @property
    def name(self) -> str:
        """How messages and logs name the extender: its URL prefix."""
        return str(self.url_prefix).rstrip("/")

    def url(self, verb: str) -> str:
        """The URL of one call, as kube-scheduler builds it."""
        return f"{self.name}/{verb}"


@dataclass(frozen=True)
class Profile:
    """A named scheduling policy: filters in order, score plugins with their integer weights, and extenders."""

    name: str
    filters: Sequence[FilterPlugin]
    scores: Sequence[tuple[ScorePlugin, int]]
    extenders: Sequence[ExtenderConfig] = ()
    """HTTP extenders consulted after the in-process plugins (see `workers.extender`), in order."""
    topology_key: str | None = None
    """The node label that names a node's leaf switch, for gangs; None: gangs ignore the network topology."""


@dataclass(frozen=True)
class Placement:
    """The pod can run: the best feasible nodes, best first, with their total scores."""

    candidates: list[str]
    scores: list[float]
    feasible: int
    """How many nodes passed every filter (the candidates are the best of these)."""


@dataclass(frozen=True)
class Unschedulable:
    """No node can run the pod: kube-scheduler's message, and per reason the number of nodes rejected for it."""

    message: str
    reasons: dict[str, int]


Decision = Placement | Unschedulable


@dataclass(frozen=True)
class Evaluation:
    """The first step of a decision: which nodes can run the pod, why the others cannot, and how each ranks."""

    rows: int
    """How many nodes were evaluated (the ``N`` of ``0/N nodes are available``)."""
    feasible: BoolArray
    """Nodes that passed every filter."""
    reasons: dict[str, int]
    """Per rejection reason, how many nodes it rejected (each node counted under one reason)."""
    scores: FloatArray
    """The weighted sum of the normalised scores per node; meaningful only on feasible nodes (0 elsewhere)."""
    rejected: str = ""
    """A PreFilter's message when it rejected the pod on every node (kube-scheduler's PreFilterMsg); '' when the
    filters ran."""

    def restricted(self, allowed: BoolArray, reasons: Mapping[str, int] | None = None) -> Evaluation:
        """The same evaluation with only the `allowed` feasible nodes left, and `reasons` added for the others."""
        merged = dict(self.reasons)
        for reason, count in (reasons or {}).items():
            _count(merged, reason, count)
        return Evaluation(rows=self.rows, feasible=self.feasible & allowed, reasons=merged, scores=self.scores,
                          rejected=self.rejected)

    def unschedulable(self) -> Unschedulable:
        """The verdict when no node is feasible, in kube-scheduler's words."""
        if self.rows == 0:
            return Unschedulable(message=NO_NODES_MESSAGE, reasons={})
        if self.rejected:
            return Unschedulable(message=f"0/{self.rows} nodes are available: {self.rejected}.",
                                 reasons={self.rejected: self.rows})
        return Unschedulable(message=unschedulable_message(self.rows, self.reasons), reasons=dict(self.reasons))


def evaluate(profile: Profile, pod: PodView, nodes: NodeTable) -> Evaluation:
    """Run the profile's filters, then (when any node is feasible) its scores over the feasible nodes."""
    rows = len(nodes)
    if rows == 0:
        empty = np.zeros(0, dtype=np.bool_)
        return Evaluation(rows=0, feasible=empty, reasons={}, scores=np.zeros(0, dtype=np.float64))
    rejected = run_prefilters(profile, pod)
    if rejected:
        return Evaluation(rows=rows, feasible=np.zeros(rows, dtype=np.bool_), reasons={rejected: rows},
                          scores=np.zeros(rows, dtype=np.float64), rejected=rejected)
    feasible, reasons = run_filters(profile.filters, pod, nodes)
    total = np.zeros(rows, dtype=np.float64)
    if feasible.any():
        # Scoring a pod that fits nowhere would be wasted work.
        for plugin, weight in profile.scores:
            if skips_pod(plugin, pod, nodes):
                continue  # kube-scheduler's PreScore Skip: the plugin adds 0 to every node
            total += weight * normalized_score(plugin, pod, nodes, feasible)
    return Evaluation(rows=rows, feasible=feasible, reasons=reasons, scores=total)


VOLUME_BINDING = "VolumeBinding"
DYNAMIC_RESOURCES = "DynamicResources"


def run_prefilters(profile: Profile, pod: PodView) -> str:
    """The message of the first filter whose optional ``prefilter(pod)`` rejects the pod on every node, or ''.
    A pod with volume claims under a profile without VolumeBinding (ResourceClaims without DynamicResources) is
    rejected so, naming the profile: placing it as if it had no claims would ignore where its volumes (devices)
    can be."""
    if pod.storage is not None and not any(plugin.name == VOLUME_BINDING for plugin in profile.filters):
        return (f"hoss profile {profile.name!r} does not list the {VOLUME_BINDING} filter, which the pod's volume "
                f"claims need")
    if pod.devices is not None and not any(plugin.name == DYNAMIC_RESOURCES for plugin in profile.filters):
        return (f"hoss profile {profile.name!r} does not list the {DYNAMIC_RESOURCES} filter, which the pod's "
                f"ResourceClaims need")
    for plugin in profile.filters:
        prefilter = getattr(plugin, "prefilter", None)
        if prefilter is not None:
            message = prefilter(pod)
            if message:
                return str(message)
    return ""


def skips_pod(plugin: ScorePlugin, pod: PodView, nodes: NodeTable) -> bool:
    """Whether a score plugin adds nothing for this pod (its optional ``skips``)."""
    skips = getattr(plugin, "skips", None)
    return skips is not None and bool(skips(pod, nodes))


def choose(
    evaluation: Evaluation,
    nodes: NodeTable,
    *,
    rng: np.random.Generator,
    tie_break: float = 1e-6,
    top: int = 8,
) -> Decision:
    """The best `top` feasible nodes after the tie-breaking jitter, or why no node is feasible."""
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    if not evaluation.feasible.any():
        return evaluation.unschedulable()
    total = evaluation.scores + rng.random(evaluation.rows) * tie_break
    feasible_rows = np.flatnonzero(evaluation.feasible)
    best = _best(total[feasible_rows], top)
    chosen = feasible_rows[best]
    return Placement(
        candidates=[nodes.names[row] for row in chosen],
        scores=[float(score) for score in total[chosen]],
        feasible=len(feasible_rows),
    )


def decide(
    profile: Profile,
    pod: PodView,
    nodes: NodeTable,
    *,
    rng: np.random.Generator,
    tie_break: float = 1e-6,
    top: int = 8,
) -> Decision:
    """Filter and score every node for `pod` under `profile`; see the module docstring for the rules."""
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    return choose(evaluate(profile, pod, nodes), nodes, rng=rng, tie_break=tie_break, top=top)


def run_filters(filters: Sequence[FilterPlugin], pod: PodView, nodes: NodeTable) -> tuple[BoolArray, dict[str, int]]:
    """The feasible mask, and per reason the number of nodes rejected for it by the first filter that rejected them
    (`hoss.framework.explain.explain_filters` keeps the same rule per node)."""
    rows = len(nodes)
    feasible = np.ones(rows, dtype=np.bool_)
    counts: dict[str, int] = {}
    for plugin in filters:
        result = plugin.filter(pod, nodes)
        check_shape(plugin.name, result.mask, rows=rows)
        newly_rejected = feasible & ~result.mask
        if newly_rejected.any():
            explained = np.zeros(rows, dtype=np.bool_)
            for reason, marked in result.reasons.items():
                check_shape(plugin.name, marked, rows=rows)
                explained |= marked
                _count(counts, reason, int(np.count_nonzero(marked & newly_rejected)))
            # A plugin that rejects without saying why still owes the user a count.
            _count(counts, unexplained_reason(plugin.name), int(np.count_nonzero(newly_rejected & ~explained)))
        feasible &= result.mask
    return feasible, counts


def unexplained_reason(plugin: str) -> str:
    """The reason of a node a filter rejects without naming one."""
    return f"node(s) didn't pass {plugin}"


def unschedulable_message(rows: int, reasons: Mapping[str, int]) -> str:
    """kube-scheduler's FitError text: ``0/50 nodes are available: 20 <reason>, 30 <reason>.``"""
    histogram = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{rows} nodes are available: {', '.join(histogram)}."


def min_max_normalize(scores: FloatArray, feasible: BoolArray) -> FloatArray:
    """Map the feasible entries linearly onto 0..100 (all 100 when they are equal); other entries become 0."""
    normalized = np.zeros(scores.shape, dtype=np.float64)
    values = scores[feasible]
    if values.size == 0:
        return normalized
    low, high = float(values.min()), float(values.max())
    if high > low:
        normalized[feasible] = (values - low) * (MAX_NODE_SCORE / (high - low))
    else:
        normalized[feasible] = MAX_NODE_SCORE
    return normalized


def default_normalize(scores: FloatArray, feasible: BoolArray, *, reverse: bool = False) -> FloatArray:
    """kube-scheduler's ``helper.DefaultNormalizeScore(MaxNodeScore, reverse)`` over the feasible nodes: each score
    becomes ``100 * score // max`` (integer division, as in Go), ``100 -`` that when `reverse`; when the highest
    score is 0 every feasible node gets 0, or 100 when `reverse`. Other entries become 0."""
    if not scores.any():  # the common case (no preference, no soft taint): no need to look at the feasible ones
        return np.where(feasible, MAX_NODE_SCORE, 0.0) if reverse else np.zeros(scores.shape, dtype=np.float64)
    normalized = np.zeros(scores.shape, dtype=np.float64)
    values = scores[feasible]
    if values.size == 0:
        return normalized
    high = float(values.max())
    if high <= 0:
        normalized[feasible] = MAX_NODE_SCORE if reverse else 0.0
        return normalized
    scaled = np.floor(MAX_NODE_SCORE * values / high)
    normalized[feasible] = MAX_NODE_SCORE - scaled if reverse else scaled
    return normalized


_NORMALIZING: dict[type, bool] = {}


def normalized_score(plugin: ScorePlugin, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
    """The plugin's scores normalised to 0..100 over the `feasible` nodes (its own `normalize`, else min-max)."""
    rows = len(nodes)
    raw = np.asarray(plugin.score(pod, nodes, feasible), dtype=np.float64)
    check_shape(plugin.name, raw, rows=rows)
    normalizing = _NORMALIZING.get(type(plugin))
    if normalizing is None:
        # A runtime-checkable protocol's isinstance is slow (tens of microseconds): once per plugin class.
        normalizing = _NORMALIZING[type(plugin)] = isinstance(plugin, NormalizingScorePlugin)
    if normalizing:
        normalized = np.asarray(cast("NormalizingScorePlugin", plugin).normalize(raw, feasible), dtype=np.float64)
        check_shape(plugin.name, normalized, rows=rows)
        return normalized
    return min_max_normalize(raw, feasible)


def _best(scores: FloatArray, top: int) -> NDArray[np.intp]:
    """Positions of the `top` highest scores, highest first."""
    count = min(top, scores.size)
    chosen = np.argpartition(-scores, count - 1)[:count] if count < scores.size else np.arange(scores.size)
    return chosen[np.argsort(-scores[chosen], kind="stable")]


def _count(counts: dict[str, int], reason: str, count: int) -> None:
    if count:
        counts[reason] = counts.get(reason, 0) + count


def check_shape(plugin: str, array: NDArray[np.generic], *, rows: int) -> None:
    """Raise `PluginError` unless a plugin's array has one entry per node row."""
    if array.shape != (rows,):
        # A plugin bug; failing loudly beats scoring the wrong nodes.
        raise PluginError(f"plugin {plugin} returned an array of shape {array.shape}, expected ({rows},)")
