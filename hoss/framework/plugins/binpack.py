"""MostAllocated: prefer the fullest node that still fits, packing pods onto few nodes. Pure, vectorised.

kube-scheduler's MostAllocated strategy: per resource ``(used + request) * 100 / allocatable`` (capped at 100),
weighted-averaged as `hoss.framework.plugins.allocation` describes. Weights are configurable, e.g. to make GPUs count:
``resources: {cpu: 1, memory: 1, nvidia.com/gpu: 1}``; default cpu 1, memory 1.
"""

from __future__ import annotations

import numpy as np

from hoss.framework.cycle import MAX_NODE_SCORE, FloatArray
from hoss.framework.plugins.allocation import AllocationScore


def most_allocated(requested: FloatArray, allocatable: FloatArray) -> FloatArray:
    """Share of the resource in use after placing the pod, 0..100."""
    score: FloatArray = np.minimum(requested, allocatable) * MAX_NODE_SCORE / allocatable
    return score


class MostAllocated(AllocationScore):
    """Score: higher for nodes whose weighted resources are fuller after placing the pod."""

    name = "MostAllocated"
    per_resource = staticmethod(most_allocated)
