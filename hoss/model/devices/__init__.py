"""Devices for pods through Dynamic Resource Allocation (resource.k8s.io/v1): the inventory DRA drivers publish in
ResourceSlices, what ResourceClaims ask, and allocating them on one node with kube-scheduler v1.36's meaning. Pure:
the dispatcher, the workers and the ledger call it with the objects they watch.

- `Inventory.from_slices(slices)`: the ResourceSlices, parsed (`DeviceError` names a field hoss cannot read or does
  not honour); `parse_slice` reads one, for a caller that keeps the good ones and reports the others.
- `claim_needs(claim, classes)`: one claim's needs with its DeviceClasses (`ClaimError` carries kube-scheduler's
  reason for a claim no node can take).
- `allocate(needs, node=, node_labels=, inventory=, allocated=, counters_used=)`: the devices on one node, or None
  (`node_failure_reason` says why as kube-scheduler does); `AllocationError` where kube-scheduler aborts.
  `allocate_aligned(needs, align=, ...)` allocates exactly when `allocate` does, preferring devices that share an
  attribute (an NVLink domain, a PCIe root) for a claim that asks several.
- `allocation_status(allocation, i)`, `devices_of(allocation)`, `counters_consumed(allocation)`: what the claim's
  status says and what the ledger holds; `allocated_devices(claim)` and `counters_of(devices, inventory)` the same
  for an allocation found written in a claim.
"""

from hoss.model.devices.allocator import (
    CANNOT_ALLOCATE,
    INVALID_POOLS,
    Allocation,
    AllocationError,
    ClaimAllocation,
    DeviceResult,
    allocate,
    allocate_aligned,
    node_failure_reason,
)
from hoss.model.devices.cel import CelError
from hoss.model.devices.claims import ClaimError, ClaimNeed, claim_needs
from hoss.model.devices.inventory import (
    CounterId,
    DeviceError,
    DeviceId,
    Inventory,
    NodeSelector,
    parse_node_selector,
    parse_slice,
)
from hoss.model.devices.status import (
    allocated_devices,
    allocation_status,
    counters_consumed,
    counters_of,
    devices_of,
)

__all__ = [
    "CANNOT_ALLOCATE",
    "INVALID_POOLS",
    "Allocation",
    "AllocationError",
    "CelError",
    "ClaimAllocation",
    "ClaimError",
    "ClaimNeed",
    "CounterId",
    "DeviceError",
    "DeviceId",
    "DeviceResult",
    "Inventory",
    "NodeSelector",
    "allocate",
    "allocate_aligned",
    "allocated_devices",
    "allocation_status",
    "claim_needs",
    "counters_consumed",
    "counters_of",
    "devices_of",
    "node_failure_reason",
    "parse_node_selector",
    "parse_slice",
]
