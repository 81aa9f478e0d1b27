"""DynamicResources: the nodes a pod's ResourceClaims (resource.k8s.io/v1) allow, as kube-scheduler's plugin of that
name reads them. Pure; what the claims need comes from the dispatcher in the pod's compact form
(`hoss.model.resourceclaims`, `PodView.devices`), never from the apiserver.

- PreFilter (`prefilter`): a claim not created yet, missing, being deleted, not the pod's, or asking a DeviceClass
  that does not exist leaves the pod unschedulable on every node with kube-scheduler's message. The dispatcher
  sends the pod again when the claim or class changes.
- Filter, per node: an allocated claim's allocation must allow the node by its node selector (``resourceclaim not
  available on the node``); the claims to allocate must all find devices there (``cannot allocate all claims``),
  by the structured allocator (`hoss.model.devices`) over the ResourceSlices, leaving out the devices other
  claims hold. Only nodes some slice offers devices to are tried.
- Extended resources a DeviceClass serves (`PodView.dra_resources`): on a node without them in allocatable, their
  device requests form one more claim (`extended_claim`, after the pod's own, as kube-scheduler appends its special
  claim), allocated with the others.
- Args: ``alignBy``, attribute names (a bare name under each device's driver, or ``domain/name``): a claim that
  asks several devices gets devices sharing the first of them that allows it on the node (one NVLink domain, one
  PCIe root), else kube-scheduler's first fit (`hoss.model.devices.allocate_aligned`). Which devices, never
  whether: the nodes the filter passes are kube-scheduler's. Empty (kube-scheduler's choice) unless a profile sets it.
- `allocation_on` is a node's allocation (kept per node for the version of the pod the worker holds), which the
  worker writes into the claims of the chosen node before the pod's binding (`workers.devices`); `free_devices`
  counts what a node has left, which GpuPacking reads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hoss.framework.cycle import BoolArray, FilterResult
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.volumes import terms_match
from hoss.framework.pod import DeviceNeeds, PodView
from hoss.model import devices as dra
from hoss.model.devices.inventory import Slice
from hoss.model.objects import Json

log = logging.getLogger(__name__)

NOT_AVAILABLE = "resourceclaim not available on the node"


@dataclass(frozen=True)
class Prepared:
    """A pod's claims to allocate, parsed once: the allocator's inputs, or why none can be allocated."""

    needs: tuple[dra.ClaimNeed, ...]
    inventory: dra.Inventory | None
    refusal: str = ""
    local: frozenset[str] = frozenset()
    """The nodes node-local slices name."""
    shared: bool = False
    """Some slice serves nodes by a selector or all nodes (or shares counters): every node must be asked."""
    refused: tuple[tuple[str | None, str], ...] = ()
    """Slices hoss cannot read or does not honour, left out: (the node a node-local one names, or None; why)."""

    def may_offer(self, node: str) -> bool:
        """Whether any slice could offer the node devices (a cheap test before the allocator's)."""
        return self.shared or node in self.local


EXTENDED_CLAIM = "<extended-resources>"
"""The name of the claim for a pod's extended resources until it is made (kube-scheduler's, not a valid name)."""


def extended_claim(devices: DeviceNeeds, left: frozenset[str]) -> Json | None:
    """The claim for the extended resources `left` to DRA on a node (None when none is): the requests of each,
    sorted by name, as kube-scheduler builds it per node."""
    requests = [request for e in devices.extended if e.resource in left for request in e.requests]
    if not requests:
        return None
    return {"metadata": {"namespace": devices.namespace, "name": EXTENDED_CLAIM},
            "spec": {"devices": {"requests": sorted(requests, key=lambda r: str(r.get("name")))}}}


def extended_mappings(devices: DeviceNeeds, left: frozenset[str]) -> list[Json]:
    """The pod status's requestMappings for the extended resources `left` to DRA on a node."""
    return [dict(mapping) for e in devices.extended if e.resource in left for mapping in e.mappings]


def prepare(devices: DeviceNeeds, left: frozenset[str] = frozenset()) -> Prepared:
    """The allocator's inputs for `devices`, with the extended resources `left` to DRA on a node, parsed once per
    version of the pod the worker holds."""
    cache: dict[frozenset[str], Prepared] = devices.parsed.setdefault("prepared", {})
    if left in cache:
        return cache[left]
    classes: Mapping[str, Json] = {name: {"metadata": {"name": name}, "spec": spec}
                                   for name, spec in devices.classes}
    kept: list[Slice] = []
    refused: list[tuple[str | None, str]] = []
    for raw in devices.slices:
        spec = raw.get("spec") if isinstance(raw.get("spec"), dict) else {}
        try:
            kept.append(dra.parse_slice({"metadata": {"name": raw.get("name")}, "spec": spec}))
        except dra.DeviceError as error:
            # one driver's slice hoss cannot honour must not stop every other device: it is left out, and a node
            # it serves says why it offers nothing
            node = spec.get("nodeName") if isinstance(spec, dict) else None
            refused.append((str(node) if node else None, f"hoss leaves out a ResourceSlice: {error}"))
    inventory = dra.Inventory(tuple(kept))
    claims = [{"metadata": {"namespace": devices.namespace, "name": claim.claim, "uid": claim.uid},
               "spec": {"devices": claim.devices or {}}} for claim in devices.to_allocate]
    if (extended := extended_claim(devices, left)) is not None:
        claims.append(extended)
    try:
        needs = tuple(dra.claim_needs(claim, classes) for claim in claims)
        prepared = Prepared(needs=needs, inventory=inventory,
                            local=frozenset(s.node_name for s in inventory.slices if s.node_name),
                            shared=any(not s.node_name or s.counter_sets for s in inventory.slices),
                            refused=tuple(refused))
    except dra.ClaimError as error:
        prepared = Prepared(needs=(), inventory=None, refusal=error.message)
    except dra.DeviceError as error:
        prepared = Prepared(needs=(), inventory=None, refusal=f"hoss cannot allocate this: {error}")
    cache[left] = prepared
    return prepared


def left_on(devices: DeviceNeeds, nodes: NodeTable, row: int) -> frozenset[str]:
    """The extended resources the node at `row` leaves to DRA (`DeviceNeeds.left_to_dra`)."""
    if not devices.extended:
        return frozenset()
    return frozenset(e.resource for e in devices.extended
                     if (column := nodes.column_of(e.resource)) is None or nodes.alloc[row, column] <= 0)


def allocation_on(devices: DeviceNeeds, node: str, labels: Mapping[str, str], *,
                  taken: frozenset[tuple[str, str, str]] = frozenset(),
                  left: frozenset[str] = frozenset()) -> dra.Allocation | None:
    """The allocation of the claims to allocate on `node` (None: they cannot all be allocated there), with the
    claim for the extended resources `left` to DRA there last, leaving out the devices `taken` besides those other
    claims hold (a gang's earlier members). Raises `dra.AllocationError` where kube-scheduler aborts the attempt (a
    CEL expression failing at runtime)."""
    prepared = prepare(devices, left)
    if prepared.inventory is None or not prepared.may_offer(node):
        return None
    align: tuple[str, ...] = devices.parsed.get("align", ())
    found: dict[tuple[str, frozenset[tuple[str, str, str]], frozenset[str], tuple[str, ...]],
                dra.Allocation | None] = devices.parsed.setdefault("on", {})
    key = (node, taken, left, align)
    if key not in found:
        found[key] = dra.allocate_aligned(prepared.needs, align=align, node=node, node_labels=labels,
                                          inventory=prepared.inventory,
                                          allocated=devices.allocated | taken if taken else devices.allocated)
    return found[key]


def allocation_at(devices: DeviceNeeds, nodes: NodeTable, row: int, *,
                  taken: frozenset[tuple[str, str, str]] = frozenset()) -> dra.Allocation | None:
    """`allocation_on` the node at `row` of `nodes`, with the extended resources it leaves to DRA."""
    return allocation_on(devices, nodes.names[row], nodes.labels[row], taken=taken, left=left_on(devices, nodes, row))


def free_devices(devices: DeviceNeeds, node: str, labels: Mapping[str, str], *, drivers: frozenset[str]) -> int:
    """How many devices of `drivers` the node's pools offer that no other claim holds."""
    prepared = prepare(devices)
    if prepared.inventory is None or not prepared.may_offer(node):
        return 0
    return sum(1 for pool in prepared.inventory.pools_for(node=node, labels=labels) if pool.driver in drivers
               for slice_ in pool.slices for device in slice_.devices
               if device.id not in devices.allocated
               and (not slice_.per_device or device.node_matches(node=node, labels=labels)))


class DynamicResourcesArgs(BaseModel):
    """Args of DynamicResources."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    align_by: tuple[Annotated[str, Field(min_length=1)], ...] = Field(default=(), alias="alignBy")
    """Attributes a claim's devices should share, tried in order (e.g. ``[nvlinkDomain, pcieRoot]``)."""


class DynamicResources:
    """PreFilter and filter: the pod's ResourceClaims (see the module docstring)."""

    name = "DynamicResources"

    def __init__(self, align_by: tuple[str, ...] = ()) -> None:
        self.align_by = align_by

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        return cls(DynamicResourcesArgs.model_validate(args).align_by)

    def prefilter(self, pod: PodView) -> str | None:
        """kube-scheduler's PreFilter rejection of the pod on every node, or None."""
        if pod.devices is None:
            return None
        if pod.devices.problem:
            return pod.devices.problem
        if pod.devices.to_allocate and (refusal := prepare(pod.devices).refusal):
            return refusal
        return None

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        if pod.devices is None:
            return FilterResult.from_reasons(rows, {})
        if (problem := self.prefilter(pod)) is not None:
            return FilterResult.from_reasons(rows, {problem: np.ones(rows, dtype=np.bool_)})
        reasons: dict[str, BoolArray] = {}
        available = np.ones(rows, dtype=np.bool_)
        for claim in pod.devices.claims:
            if claim.allocation is not None:
                available &= terms_match(nodes, claim.selector)
        if not available.all():
            reasons[NOT_AVAILABLE] = ~available
        if not pod.devices.to_allocate and not pod.devices.extended:
            return FilterResult.from_reasons(rows, reasons)
        # the worker's later steps (the gang's plan, GpuPacking, PreBind) allocate this version of the pod as its
        # profile's filter did
        pod.devices.parsed["align"] = self.align_by
        for row, name in enumerate(nodes.names):
            left = left_on(pod.devices, nodes, row)
            if not available[row] or (not pod.devices.to_allocate and not left):
                continue
            labels = nodes.labels[row]
            try:
                allocation = allocation_on(pod.devices, name, labels, taken=nodes.devices_taken, left=left)
            except dra.AllocationError as error:
                # kube-scheduler aborts the attempt: no node takes the pod, and it is tried again later
                return FilterResult.from_reasons(rows, {error.message: np.ones(rows, dtype=np.bool_)})
            if allocation is None:
                prepared = prepare(pod.devices, left)
                if prepared.inventory is None:
                    reason = prepared.refusal
                else:
                    reason = next((why for where, why in prepared.refused if where in (None, name)), None) \
                        or dra.node_failure_reason(prepared.needs, node=name, node_labels=labels,
                                                   inventory=prepared.inventory)
                reasons.setdefault(reason, np.zeros(rows, dtype=np.bool_))[row] = True
        return FilterResult.from_reasons(rows, reasons)
