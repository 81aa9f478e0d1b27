"""LeastAllocated: prefer the node with the most room left, spreading pods across nodes. Pure, vectorised.

kube-scheduler's LeastAllocated strategy: per resource ``(allocatable - used - request) * 100 / allocatable``
(0 when the pod would not fit), weighted-averaged as `workers.plugins.allocation` describes. Default weights:
cpu 1, memory 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from workers.framework import MAX_NODE_SCORE, BoolArray, FloatArray
from workers.nodes import NodeTable
from workers.plugins.allocation import ResourceWeights, allocation_score, clip_normalize
from workers.pod import PodView


def least_allocated(requested: FloatArray, allocatable: FloatArray) -> FloatArray:
    """Share of the resource left free after placing the pod, 0..100."""
    left = np.where(requested > allocatable, 0.0, allocatable - requested)
    score: FloatArray = left * MAX_NODE_SCORE / allocatable
    return score


class LeastAllocated:
    """Score: higher for nodes that keep more of the weighted resources free."""

    name = "LeastAllocated"

    def __init__(self, weights: Mapping[str, int]) -> None:
        self.weights = dict(weights)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        return cls(ResourceWeights.model_validate(args).resources)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        return allocation_score(pod, nodes, weights=self.weights, resource_score=least_allocated)

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return clip_normalize(scores, feasible)
