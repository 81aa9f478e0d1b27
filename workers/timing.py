"""Timing a worker's plugins and bindings for its metrics, without touching the framework's hot path.

- A sampled evaluation runs a *timed* copy of its profile (`Sampler.profile`): each plugin wrapped so that its
  filter, score and normalize calls (one vectorised call over every node each) are timed into
  ``hoss_plugin_execution_duration_seconds``. The other evaluations run the profile itself and pay nothing; the
  wrappers delegate every call, so a timed evaluation decides exactly as an untimed one.
- `TimedBinder` times each binding post (kube-scheduler's Bind extension point).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar

from hoss.framework.cycle import (
    BoolArray,
    FilterPlugin,
    FilterResult,
    FloatArray,
    NormalizingScorePlugin,
    Profile,
    ScorePlugin,
)
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView
from workers.metrics import ERROR_STATUS, PLUGIN_SAMPLE_PERCENT, SUCCESS_STATUS, SchedulerMetrics

P = ParamSpec("P")
R = TypeVar("R")

FILTER = "Filter"
SCORE = "Score"
NORMALIZE = "ScoreExtensionNormalize"
PRE_SCORE = "PreScore"
BIND = "Bind"
"""kube-scheduler's extension point names."""


def _timed(metrics: SchedulerMetrics, plugin: str, point: str, call: Callable[P, R], *args: P.args,
           **kwargs: P.kwargs) -> R:
    started = time.perf_counter()
    try:
        result = call(*args, **kwargs)
    except Exception:
        metrics.plugin(plugin, point, ERROR_STATUS, time.perf_counter() - started)
        raise
    metrics.plugin(plugin, point, SUCCESS_STATUS, time.perf_counter() - started)
    return result


class TimedFilter:
    """A filter plugin whose calls are timed."""

    def __init__(self, inner: FilterPlugin, metrics: SchedulerMetrics) -> None:
        self.inner = inner
        self.name = inner.name
        self.metrics = metrics

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        return _timed(self.metrics, self.name, FILTER, self.inner.filter, pod, nodes)

    def prefilter(self, pod: PodView) -> str | None:
        """The inner plugin's optional PreFilter (untimed: it reads the pod alone)."""
        prefilter: Callable[[PodView], str | None] | None = getattr(self.inner, "prefilter", None)
        return prefilter(pod) if prefilter is not None else None


class TimedScore:
    """A score plugin whose calls are timed (and its PreScore ``skips``, when it has one)."""

    def __init__(self, inner: ScorePlugin, metrics: SchedulerMetrics) -> None:
        self.inner = inner
        self.name = inner.name
        self.metrics = metrics

    def skips(self, pod: PodView, nodes: NodeTable) -> bool:
        skips: Callable[[PodView, NodeTable], bool] | None = getattr(self.inner, "skips", None)
        return False if skips is None else _timed(self.metrics, self.name, PRE_SCORE, skips, pod, nodes)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        return _timed(self.metrics, self.name, SCORE, self.inner.score, pod, nodes, feasible)


class TimedNormalizingScore(TimedScore):
    """A score plugin with its own ``normalize``, timed too (a class of its own: the framework tells normalizing
    plugins by their type)."""

    def __init__(self, inner: NormalizingScorePlugin, metrics: SchedulerMetrics) -> None:
        super().__init__(inner, metrics)
        self.normalizing = inner

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return _timed(self.metrics, self.name, NORMALIZE, self.normalizing.normalize, scores, feasible)


def timed_profile(profile: Profile, metrics: SchedulerMetrics) -> Profile:
    """`profile` with every plugin timed into `metrics`."""
    return dataclasses.replace(
        profile,
        filters=[TimedFilter(plugin, metrics) for plugin in profile.filters],
        scores=[(TimedNormalizingScore(plugin, metrics) if isinstance(plugin, NormalizingScorePlugin)
                 else TimedScore(plugin, metrics), weight) for plugin, weight in profile.scores],
    )


class Sampler:
    """Chooses the evaluations whose plugins are timed (`PLUGIN_SAMPLE_PERCENT` of them, at random, as
    kube-scheduler samples its scheduling cycles) and keeps one timed copy of each profile. Its generator is its
    own: the decisions' tie-breaking draws stay those of the worker's seed."""

    def __init__(self, metrics: SchedulerMetrics, *, seed: int | None = None,
                 percent: int = PLUGIN_SAMPLE_PERCENT) -> None:
        self.metrics = metrics
        self.share = percent / 100
        self.random = random.Random(seed)
        self._timed: dict[str, tuple[Profile, Profile]] = {}

    def profile(self, profile: Profile) -> Profile:
        """The profile to evaluate with: its timed copy for a sampled evaluation, else itself."""
        if self.random.random() >= self.share:
            return profile
        cached = self._timed.get(profile.name)
        if cached is None or cached[0] is not profile:
            cached = self._timed[profile.name] = (profile, timed_profile(profile, self.metrics))
        return cached[1]


class _Binder(Protocol):
    """`workers.binding.Binder`, which this module cannot import (it sits below the binding's layer)."""

    async def bind(self, pod: PodView, node: str) -> None: ...


class TimedBinder:
    """A binder whose posts are timed into scheduler_framework_extension_point_duration_seconds{extension_point=
    "Bind"}, under the profile `profile_of` names for the pod."""

    def __init__(self, inner: _Binder, metrics: SchedulerMetrics, *, profile_of: Callable[[PodView], str]) -> None:
        self.inner = inner
        self.metrics = metrics
        self.profile_of = profile_of

    async def bind(self, pod: PodView, node: str) -> None:
        started = time.perf_counter()
        status = ERROR_STATUS
        try:
            await self.inner.bind(pod, node)
            status = SUCCESS_STATUS
        finally:
            self.metrics.point(BIND, status, self.profile_of(pod), time.perf_counter() - started)
