"""Scheduler plugins by the name a profile in policies.yaml uses for them: the built-ins, and your own.

Built-in filters: NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, NodePool,
PodTopologySpread (DoNotSchedule constraints), InterPodAffinity (required terms), VolumeRestrictions (in-tree
disks, ReadWriteOncePod claims), NodeVolumeLimits (CSI attach limits), VolumeBinding (volume claims; it also has
a ``prefilter(pod)``, which rejects a pod on every node at once), VolumeZone and DynamicResources (ResourceClaims,
with a ``prefilter(pod)`` too).
Built-in scores: LeastAllocated (spread), MostAllocated (bin-pack), GpuPacking, CpuOffGpuNodes, NodeAffinity
(preferred terms), TaintToleration (PreferNoSchedule taints), PodTopologySpread (ScheduleAnyway constraints)
and InterPodAffinity (preferred terms, the pod's and the placed pods'). Each module of this package documents its plugin
and args. A factory takes the plugin's ``args`` mapping from the profile and returns the plugin; it validates
the args (with a pydantic model) and lets its `ValidationError` out, which `hoss.framework.profiles` turns into a
`ProfileError` naming the profile, plugin and field. Filter and score plugins have separate registries: a
profile lists each under its own key.

Writing your own plugin
=======================

A plugin is a Python class in any installed distribution, announced through an entry point in the group
``hoss.plugins``. The entry point's name is the plugin's name in policies.yaml. In the distribution's
``pyproject.toml``::

    [project.entry-points."hoss.plugins"]
    prefer-label = "hoss_example_plugin:PreferLabel"

The object the entry point loads (usually the class itself) must have:

- ``name: str`` -- equal to the entry point's name.
- ``from_args(args: Mapping[str, Any]) -> plugin`` -- builds the plugin from the profile's ``args`` mapping
  (``{}`` when the profile gives none). Validate the args here, e.g. with a pydantic model with
  ``extra="forbid"``; a pydantic ``ValidationError``, ``ValueError`` or ``TypeError`` stops the worker at start-up
  with a message naming the profile, the plugin and the arg.
- ``filter(pod, nodes) -> FilterResult`` for a filter plugin, and/or ``score(pod, nodes, feasible) -> array`` for
  a score plugin (an object with both is registered as both, and a profile may list it under either key).
- optional ``normalize(scores, feasible) -> array``, for a score plugin whose raw scores already have a meaning
  on the 0..100 scale; without it, raw scores are min-max scaled to 0..100 over the feasible nodes.
- optional ``prefilter(pod) -> str | None`` for a filter plugin: a message when the pod can go on no node at all
  (kube-scheduler's PreFilter rejection; the pod's message is then ``0/N nodes are available: <message>.``).
- optional ``figures(pod, nodes, rows) -> list[Figures]`` for a filter plugin: what it measured on each of the
  nodes `rows` it rejected (`hoss.framework.explain.Figures`), which ``hoss why`` prints; without it, ``hoss why``
  shows the plugin's reasons alone. The worker never calls it.

The arguments are `hoss.framework.pod.PodView` (the parsed pod: ``request``, ``labels``, ``namespace``, ...) and
`hoss.framework.nodes.NodeTable` (every node as numpy rows: ``alloc``/``used`` matrices, ``free_column(resource)``,
``label_codes(key)`` + ``label_code(key, value)`` for label lookups, ``names``). ``feasible`` is a bool array of
the nodes that passed every filter. Every array a plugin returns has exactly one entry per node row
(``len(nodes)``): ``FilterResult.mask`` is True where the node passes, ``FilterResult.from_reasons(rows,
{reason: marked})`` builds it from the kube-scheduler-style reasons (``"node(s) didn't have ..."``) that appear
in the pod's FailedScheduling message; a score array holds floats, only its feasible entries are read.

Rules of the road: compute over whole columns (a Python loop per node costs ~10 ms per pod on 20,000 nodes); do
no I/O (the decision runs on the worker's event loop -- call out to a service through an HTTP extender
instead, see `workers.extender`); never modify the pod or the node table. In the profile, a score plugin gets an
integer ``weight`` (1..100) that multiplies its 0..100 score.

Names are one namespace: an entry point whose name is a built-in plugin's, or the same name from two
distributions, is a `ProfileError` that names both when profiles load -- the built-in plugin is never
replaced behind the operator's back. Entry points are read each time a policy file loads (worker start-up),
never at import, so a broken third-party plugin cannot break ``import workers``. A complete example lives in
the repository under ``tests/plugins_example/``.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hoss.framework.cycle import FilterPlugin, ScorePlugin
from hoss.framework.errors import ProfileError
from hoss.framework.plugins.affinity import NodeAffinity
from hoss.framework.plugins.binpack import MostAllocated
from hoss.framework.plugins.devices import DynamicResources
from hoss.framework.plugins.fit import NodeResourcesFit
from hoss.framework.plugins.gpu import CpuOffGpuNodes, GpuPacking
from hoss.framework.plugins.interpod import InterPodAffinity
from hoss.framework.plugins.pools import NodePool
from hoss.framework.plugins.ports import NodePorts
from hoss.framework.plugins.spread import LeastAllocated
from hoss.framework.plugins.taints import NodeUnschedulable, TaintToleration
from hoss.framework.plugins.topology import PodTopologySpread
from hoss.framework.plugins.volumes import NodeVolumeLimits, VolumeBinding, VolumeRestrictions, VolumeZone

ENTRY_POINT_GROUP = "hoss.plugins"
BUILT_IN = "built-in"

FilterFactory = Callable[[Mapping[str, Any]], FilterPlugin]
ScoreFactory = Callable[[Mapping[str, Any]], ScorePlugin]

FILTERS: Mapping[str, FilterFactory] = {
    NodeResourcesFit.name: NodeResourcesFit.from_args,
    NodeAffinity.name: NodeAffinity.from_args,
    TaintToleration.name: TaintToleration.from_args,
    NodeUnschedulable.name: NodeUnschedulable.from_args,
    NodePool.name: NodePool.from_args,
    NodePorts.name: NodePorts.from_args,
    InterPodAffinity.name: InterPodAffinity.from_args,
    PodTopologySpread.name: PodTopologySpread.from_args,
    VolumeRestrictions.name: VolumeRestrictions.from_args,
    NodeVolumeLimits.name: NodeVolumeLimits.from_args,
    VolumeBinding.name: VolumeBinding.from_args,
    VolumeZone.name: VolumeZone.from_args,
    DynamicResources.name: DynamicResources.from_args,
}
"""Built-in filter plugin name -> factory."""

SCORES: Mapping[str, ScoreFactory] = {
    LeastAllocated.name: LeastAllocated.from_args,
    MostAllocated.name: MostAllocated.from_args,
    GpuPacking.name: GpuPacking.from_args,
    CpuOffGpuNodes.name: CpuOffGpuNodes.from_args,
    NodeAffinity.name: NodeAffinity.from_args,
    TaintToleration.name: TaintToleration.from_args,
    PodTopologySpread.name: PodTopologySpread.from_args,
    InterPodAffinity.name: InterPodAffinity.from_args,
}
"""Built-in score plugin name -> factory."""


@dataclass(frozen=True)
class Registry:
    """Every plugin a profile may name: the built-ins merged with the entry-point plugins."""

    filters: Mapping[str, FilterFactory]
    scores: Mapping[str, ScoreFactory]
    origins: Mapping[str, str]
    """Plugin name -> where it comes from (``built-in``, or the entry point and its distribution)."""


def load_registry(*, source: str = "policies") -> Registry:
    """The built-in plugins plus those of the installed ``hoss.plugins`` entry points; see the module docstring."""
    filters: dict[str, FilterFactory] = dict(FILTERS)
    scores: dict[str, ScoreFactory] = dict(SCORES)
    origins = dict.fromkeys([*FILTERS, *SCORES], BUILT_IN)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = describe(entry)
        taken = origins.get(entry.name)
        if taken is not None:
            theirs = f"the built-in plugin {entry.name}" if taken == BUILT_IN else taken
            raise ProfileError(
                plugin=entry.name,
                reason=f"{origin} clashes with {theirs}; rename the entry point",
                source=source,
            )
        loaded = _load(entry, origin=origin, source=source)
        if callable(getattr(loaded, "filter", None)):
            filters[entry.name] = _checked_factory(loaded, method="filter", origin=origin)
        if callable(getattr(loaded, "score", None)):
            scores[entry.name] = _checked_factory(loaded, method="score", origin=origin)
        origins[entry.name] = origin
    return Registry(filters=filters, scores=scores, origins=origins)


def describe(entry: importlib.metadata.EntryPoint) -> str:
    """How errors name an entry point: ``entry point prefer-label = pkg:Class (hoss-example-plugin 0.1.0)``."""
    distribution = entry.dist
    where = f" ({distribution.name} {distribution.version})" if distribution is not None else ""
    return f"entry point {entry.name} = {entry.value}{where}"


def _load(entry: importlib.metadata.EntryPoint, *, origin: str, source: str) -> Any:
    try:
        loaded = entry.load()
    except Exception as error:  # third-party import code may raise anything; the operator needs the cause
        raise ProfileError(plugin=entry.name, reason=f"{origin} fails to load: {error!r}", source=source) from error
    name = getattr(loaded, "name", None)
    problems = []
    if name != entry.name:
        problems.append(f"its name attribute is {name!r}, not the entry point's name {entry.name!r}")
    if not callable(getattr(loaded, "from_args", None)):
        problems.append("it has no from_args(args)")
    if not callable(getattr(loaded, "filter", None)) and not callable(getattr(loaded, "score", None)):
        problems.append("it has neither filter(pod, nodes) nor score(pod, nodes, feasible)")
    if problems:
        raise ProfileError(plugin=entry.name, reason=f"{origin} is not a plugin: {'; '.join(problems)}", source=source)
    return loaded


def _checked_factory(loaded: Any, *, method: str, origin: str) -> Callable[[Mapping[str, Any]], Any]:
    """`loaded.from_args`, checking that what it builds has the method the registry promises."""

    def build(args: Mapping[str, Any]) -> Any:
        plugin = loaded.from_args(args)
        if not callable(getattr(plugin, method, None)) or getattr(plugin, "name", None) != loaded.name:
            raise TypeError(f"{origin}: from_args returned {plugin!r}, which lacks {method}() or the plugin's name")
        return plugin

    return build
