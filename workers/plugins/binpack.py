"""MostAllocated: prefer the fullest node that still fits, packing pods onto few nodes. Pure, vectorised.

kube-scheduler's MostAllocated strategy: per resource ``(used + request) * 100 / allocatable`` (capped at 100),
weighted-averaged as `workers.plugins.allocation` describes. Weights are configurable, e.g. to make GPUs count:
``resources: {cpu: 1, memory: 1, nvidia.com/gpu: 1}``; default cpu 1, memory 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from workers.framework import MAX_NODE_SCORE, BoolArray, FloatArray
from workers.nodes import NodeTable
from workers.plugins.allocation import ResourceWeights, allocation_score, clip_normalize
from workers.pod import PodView


def most_allocated(requested: FloatArray, allocatable: FloatArray) -> FloatArray:
    """Share of the resource in use after placing the pod, 0..100."""
    score: FloatArray = np.minimum(requested, allocatable) * MAX_NODE_SCORE / allocatable
    return score


class MostAllocated:
    """Score: higher for nodes whose weighted resources are fuller after placing the pod."""

    name = "MostAllocated"

    def __init__(self, weights: Mapping[str, int]) -> None:
        self.weights = dict(weights)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        return cls(ResourceWeights.model_validate(args).resources)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        return allocation_score(pod, nodes, weights=self.weights, resource_score=most_allocated)

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return clip_normalize(scores, feasible)
