"""What an allocation writes and holds: the ResourceClaim's ``status.allocation`` body as kube-scheduler writes it,
and the devices and shared counters the ledger must hold for it. Pure, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from hoss.model.devices.allocator import Allocation
from hoss.model.devices.inventory import CounterId, DeviceId, Inventory
from hoss.model.objects import Json, section


def allocation_status(allocation: Allocation, claim_index: int) -> Json:
    """``status.allocation`` for the claim at `claim_index` of the claims given to `allocate`: devices.results
    (request, driver, pool, device, adminAccess when granted, the request's tolerations), devices.config (the
    classes' then the claim's), and the nodeSelector (the node for node-local devices, the merged selector of
    network-attached ones, none for devices available everywhere)."""
    claim = allocation.claims[claim_index]
    results = []
    for result in claim.results:
        driver, pool, device = result.device
        entry: Json = {"request": result.request, "driver": driver, "pool": pool, "device": device}
        if result.admin_access:
            entry["adminAccess"] = True
        if result.tolerations:
            entry["tolerations"] = [dict(t) for t in result.tolerations]
        results.append(entry)
    devices: Json = {}
    if results:
        devices["results"] = results
    if claim.config:
        devices["config"] = [dict(entry) for entry in claim.config]
    body: Json = {"devices": devices}
    if claim.node_selector is not None:
        body["nodeSelector"] = claim.node_selector
    return body


def devices_of(allocation: Allocation) -> frozenset[DeviceId]:
    """The devices the allocation takes for its claims alone: every allocated device but those given with admin
    access (which kube-scheduler does not count as allocated)."""
    return frozenset(result.device for claim in allocation.claims for result in claim.results
                     if not result.admin_access)


def counters_consumed(allocation: Allocation) -> dict[CounterId, Fraction]:
    """The shared counters (driver, pool, counter set, counter) the devices of `devices_of` draw, summed."""
    return dict(allocation.counters)


def allocated_devices(claim: Mapping[str, Any]) -> frozenset[DeviceId]:
    """The devices a ResourceClaim's ``status.allocation`` holds, whoever wrote it (hoss, kube-scheduler, another
    scheduler): every result but those with admin access, as kube-scheduler gathers the allocated devices."""
    allocation = section(section(claim, "status"), "allocation")
    results = section(allocation, "devices").get("results") or []
    return frozenset((str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                     for r in results if isinstance(r, dict) and r.get("adminAccess") is not True)


def counters_of(devices: Iterable[DeviceId], inventory: Inventory) -> dict[CounterId, Fraction]:
    """The shared counters `devices` draw as the inventory publishes them (a device no longer published draws
    none): what a foreign allocation holds."""
    counters: dict[CounterId, Fraction] = {}
    for device_id in devices:
        device = inventory.device(device_id)
        if device is None:
            continue
        driver, pool, _ = device_id
        for set_name, amounts in device.consumes:
            for counter, amount in amounts.items():
                key = (driver, pool, set_name, counter)
                counters[key] = counters.get(key, Fraction(0)) + amount
    return counters
