"""LeastAllocated: prefer the node with the most room left, spreading pods across nodes. Pure, vectorised.

kube-scheduler's LeastAllocated strategy: per resource ``(allocatable - used - request) * 100 / allocatable``
(0 when the pod would not fit), weighted-averaged as `hoss.framework.plugins.allocation` describes. Default weights:
cpu 1, memory 1.
"""

from __future__ import annotations

import numpy as np

from hoss.framework.cycle import MAX_NODE_SCORE, FloatArray
from hoss.framework.plugins.allocation import AllocationScore


def least_allocated(requested: FloatArray, allocatable: FloatArray) -> FloatArray:
    """Share of the resource left free after placing the pod, 0..100."""
    left = np.where(requested > allocatable, 0.0, allocatable - requested)
    score: FloatArray = left * MAX_NODE_SCORE / allocatable
    return score


class LeastAllocated(AllocationScore):
    """Score: higher for nodes that keep more of the weighted resources free."""

    name = "LeastAllocated"
    per_resource = staticmethod(least_allocated)
