"""GPU packing: keep whole GPU nodes free for large GPU pods, and CPU-only pods off GPU nodes. Pure, vectorised.

GpuPacking (score) sends a GPU pod to the feasible node where ``free GPUs - requested GPUs`` is smallest, so small
GPU pods fill up partly used nodes before they break into an empty one. Its 0..100 scale is absolute, not
min-max: ``100 * (1 - leftover / most)``, where ``most`` is the largest allocatable GPU count among the feasible
nodes. A node left with 0 free GPUs therefore always scores 100, and the ranking follows the leftover count
exactly, also across nodes with different GPU counts. A pod that requests no GPU gets 100 everywhere: neutral. A
pod whose ResourceClaims are allocated devices (DRA) is packed by the same rule over devices: on each node, the free
devices of the drivers its allocation there uses, less the devices it takes.

CpuOffGpuNodes (score) keeps pods that request no GPU off GPU nodes (allocatable GPUs > 0): such nodes score 0
for them, all others 100; GPU pods get 100 everywhere. It is a score rather than a filter on purpose: "only when
nothing else fits" depends on what the other filters left, which one filter cannot know, while a heavy score
penalty expresses it exactly -- give the plugin a weight above the sum of the profile's other score weights and
a GPU node wins only when no CPU node is feasible. A CPU pod then still runs when the CPU nodes are full,
instead of waiting beside idle GPU nodes.

`gpu_fragmentation` summarises how GPUs are spread over nodes, for the status page and the benchmark:
stranded GPUs are the free GPUs on partly used nodes, which a pod that needs a whole node cannot use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hoss.framework.cycle import MAX_NODE_SCORE, BoolArray, FloatArray
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.allocation import clip_normalize
from hoss.framework.plugins.devices import allocation_at, free_devices
from hoss.framework.pod import PodView
from hoss.model import devices as dra

GPU_RESOURCE = "nvidia.com/gpu"


class GpuArgs(BaseModel):
    """Args of the GPU plugins: which extended resource counts as a GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resource: str = Field(default=GPU_RESOURCE, min_length=1)
    """The GPU resource name, e.g. ``nvidia.com/gpu`` or ``amd.com/gpu``."""


class GpuPacking:
    """Score: higher where fewer GPUs stay free after placing the pod; neutral for pods without GPUs."""

    name = "GpuPacking"

    def __init__(self, resource: str = GPU_RESOURCE) -> None:
        self.resource = resource

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        return cls(GpuArgs.model_validate(args).resource)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        requested = pod.request.get(self.resource, 0)
        if pod.devices is not None and ((requested <= 0 and (pod.devices.to_allocate or pod.devices.extended))
                                        or self.resource in pod.dra_resources):
            return _device_packing(pod, nodes, feasible)
        if requested <= 0:
            return np.full(len(nodes), MAX_NODE_SCORE, dtype=np.float64)
        leftover = (nodes.free_column(self.resource) - requested).astype(np.float64)
        allocatable = nodes.alloc_column(self.resource)[feasible]
        most = float(allocatable.max()) if allocatable.size else 0.0
        if most <= 0:
            return np.zeros(len(nodes), dtype=np.float64)
        # Leftover is >= 0 on feasible nodes (fit ran first); clipping only guards a profile without fit.
        score: FloatArray = MAX_NODE_SCORE * (1.0 - np.clip(leftover, 0.0, most) / most)
        return score

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return clip_normalize(scores, feasible)


def _device_packing(pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
    """GpuPacking for a pod whose ResourceClaims are allocated devices (DRA): the same rule over devices, the
    node's free devices of the drivers its allocation there uses, less those it takes."""
    assert pod.devices is not None
    leftover = np.zeros(len(nodes), dtype=np.float64)
    free = np.zeros(len(nodes), dtype=np.float64)
    for row in np.flatnonzero(feasible):
        name, labels = nodes.names[row], nodes.labels[row]
        allocation = allocation_at(pod.devices, nodes, int(row))
        if allocation is None:
            continue
        taken = dra.devices_of(allocation)
        free[row] = free_devices(pod.devices, name, labels, drivers=frozenset(driver for driver, _p, _d in taken))
        leftover[row] = free[row] - len(taken)
    most = float(free[feasible].max()) if feasible.any() else 0.0
    if most <= 0:
        return np.full(len(nodes), MAX_NODE_SCORE, dtype=np.float64)
    score: FloatArray = MAX_NODE_SCORE * (1.0 - np.clip(leftover, 0.0, most) / most)
    return score


class CpuOffGpuNodes:
    """Score: 0 on GPU nodes for pods that request no GPU, 100 elsewhere; see the module docstring for why."""

    name = "CpuOffGpuNodes"

    def __init__(self, resource: str = GPU_RESOURCE) -> None:
        self.resource = resource

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        return cls(GpuArgs.model_validate(args).resource)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        if pod.request.get(self.resource, 0) > 0:
            return np.full(len(nodes), MAX_NODE_SCORE, dtype=np.float64)
        return np.where(nodes.alloc_column(self.resource) > 0, 0.0, MAX_NODE_SCORE)

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return clip_normalize(scores, feasible)


class GpuFragmentation(TypedDict):
    """How the GPUs of the cluster are spread over its GPU nodes."""

    gpu_nodes: int
    """Nodes with allocatable GPUs."""
    fully_free_nodes: int
    """GPU nodes with no GPU in use."""
    partly_used_nodes: int
    """GPU nodes with some but not all GPUs in use."""
    full_nodes: int
    """GPU nodes with every GPU in use."""
    stranded_gpus: int
    """Free GPUs on partly used nodes: usable by small GPU pods only, never by a pod that needs a whole node."""


def gpu_fragmentation(nodes: NodeTable, resource: str = GPU_RESOURCE) -> GpuFragmentation:
    """The GPU fragmentation figures of `nodes` for GPU resource `resource`."""
    allocatable = nodes.alloc_column(resource)
    gpu_nodes = allocatable > 0
    used = np.clip(nodes.used_column(resource), 0, allocatable)
    free = allocatable - used
    fully_free = gpu_nodes & (used == 0)
    full = gpu_nodes & (free == 0)
    partly = gpu_nodes & ~fully_free & ~full
    return GpuFragmentation(
        gpu_nodes=int(np.count_nonzero(gpu_nodes)),
        fully_free_nodes=int(np.count_nonzero(fully_free)),
        partly_used_nodes=int(np.count_nonzero(partly)),
        full_nodes=int(np.count_nonzero(full)),
        stranded_gpus=int(free[partly].sum()),
    )
