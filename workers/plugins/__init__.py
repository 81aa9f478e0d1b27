"""The built-in plugins, by the name a profile in policies.yaml uses for them.

A factory takes the plugin's ``args`` mapping from the profile and returns the plugin; it validates the args with
a pydantic model and lets its `ValidationError` out, which `workers.profiles` turns into a `ProfileError` naming
the profile, plugin and field. Filter and score plugins have separate registries: a profile lists each under its
own key, and a name in the wrong list is a mistake the loader reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from workers.framework import FilterPlugin, ScorePlugin
from workers.plugins.affinity import NodeAffinity
from workers.plugins.binpack import MostAllocated
from workers.plugins.fit import NodeResourcesFit
from workers.plugins.spread import LeastAllocated
from workers.plugins.taints import NodeUnschedulable, TaintToleration

FilterFactory = Callable[[Mapping[str, Any]], FilterPlugin]
ScoreFactory = Callable[[Mapping[str, Any]], ScorePlugin]

FILTERS: Mapping[str, FilterFactory] = {
    NodeResourcesFit.name: NodeResourcesFit.from_args,
    NodeAffinity.name: NodeAffinity.from_args,
    TaintToleration.name: TaintToleration.from_args,
    NodeUnschedulable.name: NodeUnschedulable.from_args,
}
"""Filter plugin name -> factory."""

SCORES: Mapping[str, ScoreFactory] = {
    LeastAllocated.name: LeastAllocated.from_args,
    MostAllocated.name: MostAllocated.from_args,
}
"""Score plugin name -> factory."""
