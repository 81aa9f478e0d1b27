"""Resource-allocation scoring shared by LeastAllocated (spread) and MostAllocated (bin-pack). Pure, vectorised.

Both follow kube-scheduler's resource allocation scorer: per configured resource a 0..100 score from the node's
allocatable and its usage after placing the pod (ledger usage + the pod's request), then the weighted average over
the resources that count on that node. A resource counts where the node reports it (allocatable > 0); an extended
resource (GPUs, hugepages, ...) that the pod does not request does not count, so a CPU pod is not ranked by GPU
usage. A node where no resource counts scores 0. Scores are already on the 0..100 scale, so the plugins normalise
by clipping instead of min-max (which would exaggerate small differences).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from hoss.framework.cycle import MAX_NODE_SCORE, BoolArray, FloatArray
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView

MAX_RESOURCE_WEIGHT = 100

# Resources kube-scheduler scores even when the pod does not request them; all others are "scalar" resources.
_ALWAYS_SCORED = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})

ResourceWeight = Annotated[StrictInt, Field(ge=1, le=MAX_RESOURCE_WEIGHT)]

ResourceScore = Callable[[FloatArray, FloatArray], FloatArray]
"""(requested after placement, allocatable > 0) -> 0..100 per node."""


class ResourceWeights(BaseModel):
    """Args of an allocation scorer: the resources it looks at and how much each counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resources: dict[str, ResourceWeight] = Field(default_factory=lambda: {"cpu": 1, "memory": 1}, min_length=1)
    """Resource name -> weight (1..100), e.g. ``{cpu: 1, memory: 1, nvidia.com/gpu: 3}``."""


def allocation_score(
    pod: PodView, nodes: NodeTable, *, weights: Mapping[str, int], resource_score: ResourceScore
) -> FloatArray:
    """The weighted average of `resource_score` over the resources that count on each node."""
    rows = len(nodes)
    total = np.zeros(rows, dtype=np.float64)
    weight_sum = np.zeros(rows, dtype=np.float64)
    for resource, weight in weights.items():
        requested = pod.request.get(resource, 0)
        if requested == 0 and resource not in _ALWAYS_SCORED:
            continue
        allocatable = nodes.alloc_column(resource).astype(np.float64)
        counted = allocatable > 0
        after = nodes.used_column(resource).astype(np.float64) + requested
        score = resource_score(after, np.where(counted, allocatable, 1.0))
        total += np.where(counted, score * weight, 0.0)
        weight_sum += np.where(counted, float(weight), 0.0)
    result = np.zeros(rows, dtype=np.float64)
    np.divide(total, weight_sum, out=result, where=weight_sum > 0)
    return result


def clip_normalize(scores: FloatArray, feasible: BoolArray) -> FloatArray:
    """Scores that already are 0..100, kept as they are on feasible nodes; others become 0."""
    return np.where(feasible, np.clip(scores, 0.0, MAX_NODE_SCORE), 0.0)


class AllocationScore:
    """Base of the weighted allocation scorers: a subclass names itself and its per-resource score."""

    name: str

    @staticmethod
    def per_resource(requested: FloatArray, allocatable: FloatArray) -> FloatArray:
        """The 0..100 score of one resource column, given the request and allocatable per node."""
        raise NotImplementedError

    def __init__(self, weights: Mapping[str, int]) -> None:
        self.weights = dict(weights)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        return cls(ResourceWeights.model_validate(args).resources)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        return allocation_score(pod, nodes, weights=self.weights, resource_score=self.per_resource)

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return clip_normalize(scores, feasible)
