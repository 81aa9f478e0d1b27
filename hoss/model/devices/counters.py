"""What an allocation draws on shared counters, as the ledger's promise of them takes it (``promise_counters.lua``).
Pure.

Partitions of one GPU (or any devices of a pool) draw on the pool's counter sets. Two workers deciding at the same
instant each see the counters as the allocations before them left them; each alone fits, together they may overdraw.
The ledger decides that atomically: per counter set the allocation draws on, it is given the set's capacity, what the
allocations the decision saw draw (`seen`, with those devices), and what this allocation draws, device by device
(`mine`); the promises of other pods through devices the decision did not see count on top.

Amounts are whole thousandths of the counter's unit (the ledger compares integers): capacities rounded down, draws
rounded up, so the ledger never lets through what exact arithmetic would refuse.

Invariant: `CounterDraw.mine` totals `mine_devices`' draws, counter by counter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from hoss.model.devices.inventory import DeviceId, Inventory

SCALE = 1000
"""Ledger amounts are thousandths of the counter's unit."""


@dataclass(frozen=True)
class CounterDraw:
    """One counter set an allocation draws on, as ``promise_counters.lua`` takes it."""

    key: str
    """'<driver>/<pool>/<counter set>'"""
    counters: tuple[tuple[str, int, int, int], ...]
    """(counter, capacity, seen, mine) per counter the allocation draws on"""
    seen_devices: tuple[str, ...]
    """'<driver>/<pool>/<device>' of the devices the decision saw allocated that draw on the set"""
    mine_devices: tuple[tuple[str, str], ...]
    """('<driver>/<pool>/<device>', 'counter=amount,...') of the allocation's devices that draw on the set"""


def _up(amount: Fraction) -> int:
    return math.ceil(amount * SCALE)


def _down(amount: Fraction) -> int:
    return math.floor(amount * SCALE)


def _name(device: DeviceId) -> str:
    return "/".join(device)


def _capacity(inventory: Inventory, driver: str, pool: str, set_name: str) -> Mapping[str, Fraction]:
    """The counter set's counters as the newest generation of its pool publishes them (empty when it does not)."""
    newest = max((s.generation for s in inventory.slices if (s.driver, s.pool) == (driver, pool)), default=None)
    for slice_ in inventory.slices:
        if (slice_.driver, slice_.pool, slice_.generation) == (driver, pool, newest):
            for name, counters in slice_.counter_sets:
                if name == set_name:
                    return counters
    return {}


def counter_draws(devices: Iterable[DeviceId], *, allocated: Iterable[DeviceId],
                  inventory: Inventory) -> list[CounterDraw]:
    """The counter sets `devices` (an allocation's) draw on, with what the devices the decision saw `allocated` draw
    there; empty when they draw on none."""
    draws: dict[tuple[str, str, str], dict[DeviceId, dict[str, Fraction]]] = {}
    for device_id in sorted(set(devices)):
        device = inventory.device(device_id)
        for set_name, amounts in device.consumes if device is not None else ():
            draws.setdefault((device_id[0], device_id[1], set_name), {})[device_id] = dict(amounts)
    if not draws:
        return []
    seen: dict[tuple[str, str, str], dict[DeviceId, dict[str, Fraction]]] = {}
    for device_id in sorted(set(allocated) - {d for mine in draws.values() for d in mine}):
        device = inventory.device(device_id)
        for set_name, amounts in device.consumes if device is not None else ():
            if (device_id[0], device_id[1], set_name) in draws:
                seen.setdefault((device_id[0], device_id[1], set_name), {})[device_id] = dict(amounts)
    found = []
    for (driver, pool_name, set_name), mine in sorted(draws.items()):
        capacity = _capacity(inventory, driver, pool_name, set_name)
        others = seen.get((driver, pool_name, set_name), {})
        names = sorted({name for amounts in mine.values() for name in amounts})
        found.append(CounterDraw(
            key=f"{driver}/{pool_name}/{set_name}",
            counters=tuple((name, _down(capacity.get(name, Fraction(0))),
                            sum(_up(amounts.get(name, Fraction(0))) for amounts in others.values()),
                            sum(_up(amounts.get(name, Fraction(0))) for amounts in mine.values()))
                           for name in names),
            seen_devices=tuple(_name(device) for device in others),
            mine_devices=tuple((_name(device), ",".join(f"{name}={_up(amount)}" for name, amount in sorted(
                amounts.items()))) for device, amounts in mine.items())))
    return found
