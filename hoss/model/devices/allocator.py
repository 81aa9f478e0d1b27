"""Allocating a pod's ResourceClaims on one node, with kube-scheduler v1.36's meaning: a port of the structured
allocator's search (k8s.io/dynamic-resource-allocation/structured, "incubating", the one kube-scheduler's default
feature gates pick), checked against the Go allocator itself by tests/golden/dra. Pure, no I/O.

Claims are allocated one after the other, a claim's requests in order, a request's devices one by one from the
node's pools in inventory order (pools by driver and name, slices by name, devices as listed), each next device of
a request after the previous one (combinations, not permutations), backtracking when a later choice fails; the
first full solution wins. A device is taken when it is not allocated (to another claim, or earlier in this search;
admin access only skips devices this claim already has), its class's and request's selectors hold, it is on the
node (per-device node selection), it has the capacity the request asks, its pool's shared counters are not
overdrawn (counting devices allocated elsewhere), its NoSchedule/NoExecute taints are tolerated, and the claim's
constraints still hold. ``All`` takes every matching device of the node and fails if one cannot be taken.

`allocate` returns the allocation, or None where kube-scheduler finds none on the node (`node_failure_reason`
gives its text), and raises `AllocationError` where kube-scheduler aborts the scheduling attempt (a CEL runtime
error, "all" devices from a pool being updated, a constraint that can never hold for "all" devices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from fractions import Fraction

from hoss.errors import HossError
from hoss.model.devices.cel import CelError, device_matches
from hoss.model.devices.claims import ALLOCATION_RESULTS_MAX_SIZE, ClaimNeed, Constraint, Request
from hoss.model.devices.inventory import (
    TAINT_EFFECTS_THAT_BLOCK,
    CounterId,
    Device,
    DeviceId,
    Inventory,
    Pool,
    Slice,
)
from hoss.model.objects import Json

CANNOT_ALLOCATE = "cannot allocate all claims"
INVALID_POOLS = "invalid resource pools were encountered"


class AllocationError(HossError):
    """kube-scheduler aborts the scheduling attempt with this (statusError): `message` is its text."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True)
class DeviceResult:
    """One allocated device: for `request` (``request`` or ``request/subrequest``)."""

    request: str
    device: DeviceId
    admin_access: bool
    tolerations: tuple[Json, ...]


@dataclass(frozen=True)
class ClaimAllocation:
    claim: ClaimNeed
    results: tuple[DeviceResult, ...]
    config: tuple[Json, ...]
    """``status.allocation.devices.config`` entries"""
    node_selector: Json | None


@dataclass(frozen=True)
class Allocation:
    """The devices of every claim given to `allocate`, in the same order, on `node`."""

    node: str
    claims: tuple[ClaimAllocation, ...]
    counters: Mapping[CounterId, Fraction]
    """the shared counters the allocated devices (admin access aside) consume"""


@dataclass
class _Candidate:
    device: Device
    slice: Slice
    pool: Pool


@dataclass
class _RequestState:
    request: Request
    num_devices: int
    all_devices: list[_Candidate] = field(default_factory=list)


class _MaxSizeExceeded(Exception):
    """errAllocationResultMaxSizeExceeded: more than 32 devices for one claim down this path."""


@dataclass
class _ConstraintState:
    """A claim constraint while devices are added and removed (matchAttributeConstraint and
    distinctAttributeConstraint, with their bookkeeping: a distinct constraint keeps one value per request)."""

    constraint: Constraint
    count: int = 0
    first: tuple[str, str] | None = None
    by_request: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add(self, request: Request, device: Device) -> bool:
        if not self.constraint.applies_to(request):
            return True
        value = device.attribute(self.constraint.qualified(device.id[0]))
        if value is None:
            return False
        typed = (type(value).__name__, str(value))
        base = request.parent or request.name
        if self.count == 0:
            self.first = typed
        elif self.constraint.distinct:
            if typed in self.by_request.values():
                return False
        elif typed != self.first:
            return False
        self.by_request[base] = typed
        self.count += 1
        return True

    def remove(self, request: Request) -> None:
        if self.constraint.applies_to(request):
            self.by_request.pop(request.parent or request.name, None)
            self.count -= 1


class _Search:
    def __init__(self, claims: Sequence[ClaimNeed], *, node: str, labels: Mapping[str, str], pools: list[Pool],
                 allocated: Set[DeviceId], counters_used: Mapping[CounterId, Fraction] | None) -> None:
        self.claims, self.node, self.labels, self.pools = claims, node, labels, pools
        self.allocated, self.counters_used = allocated, counters_used
        self.requests: dict[tuple[int, int, int], _RequestState] = {}
        self.selected: dict[tuple[int, int], int] = {}
        self.constraints = [[_ConstraintState(c) for c in claim.constraints] for claim in claims]
        self.results: list[list[tuple[Request, _Candidate]]] = [[] for _ in claims]
        self.allocating: dict[DeviceId, set[int]] = {}
        self.available: dict[tuple[str, str], dict[tuple[str, str], Fraction]] = {}
        self.consumed: dict[tuple[str, str], dict[tuple[str, str], Fraction]] = {}
        self.matches: dict[tuple[DeviceId, int, int, int], bool] = {}

    # --- preparation (validateDeviceRequest) ---

    def prepare(self) -> None:
        for c, claim in enumerate(self.claims):
            minimum = 0
            for r, need in enumerate(claim.requests):
                least = None
                for s, request in enumerate(need.alternatives):
                    state = self._request_state((c, r, s), request)
                    self.requests[(c, r, s)] = state
                    least = state.num_devices if least is None else min(least, state.num_devices)
                minimum += least or 0
            if minimum > ALLOCATION_RESULTS_MAX_SIZE:
                raise AllocationError(f"claim {claim.key}: number of requested devices {minimum} exceeds the claim "
                                      f"limit of {ALLOCATION_RESULTS_MAX_SIZE}")

    def _request_state(self, key: tuple[int, int, int], request: Request) -> _RequestState:
        if not request.all_devices:
            return _RequestState(request, request.count)
        state = _RequestState(request, 0)
        claim = self.claims[key[0]]
        for pool in self.pools:
            if pool.incomplete:
                raise AllocationError(f"claim {claim.key}, request {request.name}: asks for all devices, but "
                                      f"resource pool {pool.id} is currently being updated")
            if pool.invalid_reason is not None:
                raise AllocationError(f"claim {claim.key}, request {request.name}: asks for all devices, but "
                                      f"resource pool {pool.id} is currently invalid")
            for slice_ in pool.slices:
                for device in slice_.devices:
                    if self._selectable(key, request, slice_, device) and self._capacity_fits(request, device):
                        state.all_devices.append(_Candidate(device, slice_, pool))
        state.num_devices = len(state.all_devices)
        return state

    # --- the search (allocateOne) ---

    def allocate_one(self, c: int, r: int, s: int, d: int, *, in_subrequest: bool,
                     start: tuple[int, int, int] = (0, 0, 0)) -> bool:
        if c >= len(self.claims):
            return True
        claim = self.claims[c]
        if r >= len(claim.requests):
            try:
                return self.allocate_one(c + 1, 0, 0, 0, in_subrequest=False)
            except _MaxSizeExceeded:
                return False
        need = claim.requests[r]
        if not in_subrequest and need.first_available:
            all_exceeded = True
            for sub in range(len(need.alternatives)):
                try:
                    done = self.allocate_one(c, r, sub, 0, in_subrequest=True)
                except _MaxSizeExceeded:
                    continue
                all_exceeded = False
                if done:
                    self.selected[(c, r)] = sub
                    return True
            if all_exceeded:
                raise _MaxSizeExceeded
            return False
        state = self.requests[(c, r, s)]
        request = state.request
        if request.all_devices and not state.all_devices:
            return False
        if d >= state.num_devices:
            return self.allocate_one(c, r + 1, 0, 0, in_subrequest=False)
        if len(self.results[c]) + state.num_devices - d > ALLOCATION_RESULTS_MAX_SIZE:
            raise _MaxSizeExceeded
        if request.all_devices:
            candidate = state.all_devices[d]
            undo = self._take(c, request, candidate, must=True)
            if undo is None:
                return False
            try:
                done = self.allocate_one(c, r, s, d + 1, in_subrequest=in_subrequest)
            except BaseException:
                undo()
                raise
            if not done:
                undo()
            return done
        for location, candidate in self._candidates(start):
            device = candidate.device
            if request.admin_access and c in self.allocating.get(device.id, ()):
                continue
            if not request.admin_access and self._in_use(device.id):
                continue
            if not self._selectable((c, r, s), request, candidate.slice, device):
                continue
            if not self._capacity_fits(request, device):
                continue
            undo = self._take(c, request, candidate, must=False)
            if undo is None:
                continue
            pool_index, slice_index, device_index = location
            try:
                done = self.allocate_one(c, r, s, d + 1, in_subrequest=in_subrequest,
                                         start=(pool_index, slice_index, device_index + 1))
            except BaseException:
                undo()
                raise
            if done:
                return True
            undo()
        return False

    def _candidates(self, start: tuple[int, int, int]) -> Iterator[tuple[tuple[int, int, int], _Candidate]]:
        for p in range(start[0], len(self.pools)):
            pool = self.pools[p]
            if not pool.usable:
                continue
            for s in range(start[1] if p == start[0] else 0, len(pool.slices)):
                slice_ = pool.slices[s]
                first = start[2] if (p, s) == start[:2] else 0
                for d in range(first, len(slice_.devices)):
                    yield (p, s, d), _Candidate(slice_.devices[d], slice_, pool)

    def _in_use(self, device_id: DeviceId) -> bool:
        return device_id in self.allocated or bool(self.allocating.get(device_id))

    def _selectable(self, key: tuple[int, int, int], request: Request, slice_: Slice, device: Device) -> bool:
        cache_key = (device.id, *key)
        cached = self.matches.get(cache_key)
        if cached is not None:
            return cached
        claim = self.claims[key[0]]
        matches = (self._selectors_hold(f"class {request.device_class.name}", request.device_class.selectors, device)
                   and self._selectors_hold(f"claim {claim.key}", request.selectors, device)
                   and (not slice_.per_device or device.node_matches(node=self.node, labels=self.labels)))
        self.matches[cache_key] = matches
        return matches

    @staticmethod
    def _selectors_hold(owner: str, selectors: tuple[str, ...], device: Device) -> bool:
        for i, expression in enumerate(selectors):
            try:
                if not device_matches(expression, device.cel):
                    return False
            except CelError as error:
                kind = "compile" if error.message.startswith("compilation failed") else "runtime"
                raise AllocationError(f"{owner}: selector #{i}: CEL {kind} error: {error.message}") from error
        return True

    @staticmethod
    def _capacity_fits(request: Request, device: Device) -> bool:
        """CmpRequestOverCapacity for a device not shared between claims: every capacity asked exists and holds."""
        if request.capacity is None:
            return True
        if any(name not in device.capacity for name in request.capacity):
            return False
        return all(request.capacity.get(name, value) <= value for name, value in device.capacity.items())

    # --- taking one device (allocateDevice) ---

    def _take(self, c: int, request: Request, candidate: _Candidate, *, must: bool) -> Callable[[], None] | None:
        device = candidate.device
        if request.admin_access and c in self.allocating.get(device.id, ()):
            return None
        if not request.admin_access and self._in_use(device.id):
            return None
        counters_taken = False
        if device.consumes:
            if not self._reserve_counters(candidate):
                return None
            counters_taken = True
        if any(taint.effect in TAINT_EFFECTS_THAT_BLOCK and not request.tolerates(taint) for taint in device.taints):
            if counters_taken:
                self._release_counters(candidate)
            return None
        added: list[_ConstraintState] = []
        for constraint in self.constraints[c]:
            if not constraint.add(request, device):
                for done in reversed(added):
                    done.remove(request)
                if counters_taken:
                    self._release_counters(candidate)
                if must:
                    raise AllocationError(
                        f"claim {self.claims[c].key}, request {request.name}: cannot add device "
                        f"{'/'.join(device.id)} because a claim constraint would not be satisfied")
                return None
            added.append(constraint)
        self.allocating.setdefault(device.id, set()).add(c)
        self.results[c].append((request, candidate))

        def undo() -> None:
            self.results[c].pop()
            self.allocating[device.id].discard(c)
            for done in reversed(added):
                done.remove(request)
            if counters_taken:
                self._release_counters(candidate)
        return undo

    def _available(self, pool: Pool) -> dict[tuple[str, str], Fraction]:
        key = (pool.driver, pool.name)
        if key not in self.available:
            available = {(set_name, counter): amount for set_name, counters in pool.counter_sets.items()
                         for counter, amount in counters.items()}
            if self.counters_used is not None:
                for (driver, pool_name, set_name, counter), amount in self.counters_used.items():
                    if (driver, pool_name) == key and (set_name, counter) in available:
                        available[(set_name, counter)] -= amount
            else:
                for device in pool.all_devices():
                    if device.id in self.allocated:
                        for set_name, counters in device.consumes:
                            for counter, amount in counters.items():
                                if (set_name, counter) in available:
                                    available[(set_name, counter)] -= amount
            self.available[key] = available
        return self.available[key]

    def _reserve_counters(self, candidate: _Candidate) -> bool:
        available = self._available(candidate.pool)
        consumed = self.consumed.setdefault((candidate.pool.driver, candidate.pool.name), {})
        for set_name, counters in candidate.device.consumes:
            for counter, amount in counters.items():
                consumed[(set_name, counter)] = consumed.get((set_name, counter), Fraction(0)) + amount
        if any(amount < consumed.get(key, 0) for key, amount in available.items()):
            self._release_counters(candidate)
            return False
        return True

    def _release_counters(self, candidate: _Candidate) -> None:
        consumed = self.consumed[(candidate.pool.driver, candidate.pool.name)]
        for set_name, counters in candidate.device.consumes:
            for counter, amount in counters.items():
                consumed[(set_name, counter)] -= amount


def allocate(needs: Sequence[ClaimNeed], *, node: str, node_labels: Mapping[str, str], inventory: Inventory,
             allocated: Set[DeviceId], counters_used: Mapping[CounterId, Fraction] | None = None) -> Allocation | None:
    """Devices on `node` for every claim of `needs` (a pod's claims still to allocate), or None when there are
    none. `allocated`: devices allocated to other claims (admin access aside) or held for them. `counters_used`:
    the shared counters those hold, when the caller keeps them (the ledger); None reckons them from `allocated`
    and the inventory, as kube-scheduler does. Raises AllocationError where kube-scheduler aborts the attempt."""
    search = _Search(needs, node=node, labels=node_labels, pools=inventory.pools_for(node=node, labels=node_labels),
                     allocated=allocated, counters_used=counters_used)
    search.prepare()
    if not search.allocate_one(0, 0, 0, 0, in_subrequest=False):
        return None
    claims = []
    counters: dict[CounterId, Fraction] = {}
    for c, claim in enumerate(needs):
        chosen = search.results[c]
        results = tuple(DeviceResult(request=request.full_name, device=candidate.device.id,
                                     admin_access=request.admin_access, tolerations=request.raw_tolerations)
                        for request, candidate in chosen)
        for request, candidate in chosen:
            if request.admin_access:
                continue
            driver, pool, _ = candidate.device.id
            for set_name, amounts in candidate.device.consumes:
                for counter, amount in amounts.items():
                    key = (driver, pool, set_name, counter)
                    counters[key] = counters.get(key, Fraction(0)) + amount
        claims.append(ClaimAllocation(claim=claim, results=results, config=_config(search, c),
                                      node_selector=_node_selector(chosen, node)))
    return Allocation(node=node, claims=tuple(claims), counters=counters)


def allocate_aligned(needs: Sequence[ClaimNeed], *, align: Sequence[str], node: str, node_labels: Mapping[str, str],
                     inventory: Inventory, allocated: Set[DeviceId]) -> Allocation | None:
    """`allocate`, preferring for each claim that asks two devices or more devices that share an attribute: the
    first of `align` (a bare name is looked up under each device's driver, a ``domain/name`` as it is) for which
    every such claim can be allocated that way, else none (kube-scheduler's first fit). Which devices, not whether:
    it allocates exactly when `allocate` does."""
    for attribute in align:
        aligned = tuple(_aligned(claim, attribute) for claim in needs)
        if aligned == tuple(needs):
            break  # no claim asks two devices
        found = allocate(aligned, node=node, node_labels=node_labels, inventory=inventory, allocated=allocated)
        if found is not None:
            return found
    return allocate(needs, node=node, node_labels=node_labels, inventory=inventory, allocated=allocated)


def _aligned(claim: ClaimNeed, attribute: str) -> ClaimNeed:
    """The claim with one more constraint: all its devices share `attribute` (unchanged when it asks fewer than two
    devices or all of some kind, which a constraint could only make fail)."""
    asked = 0
    for need in claim.requests:
        if any(request.all_devices for request in need.alternatives):
            return claim
        asked += max(request.count for request in need.alternatives)
    if asked < 2:
        return claim
    return dataclasses.replace(claim, constraints=(*claim.constraints, Constraint(
        attribute=attribute, requests=frozenset(), per_driver="/" not in attribute)))


def node_failure_reason(needs: Sequence[ClaimNeed], *, node: str, node_labels: Mapping[str, str],
                        inventory: Inventory) -> str:
    """kube-scheduler's reason for a node where `allocate` found nothing: the pools the node could use include an
    invalid one, or the claims cannot all be allocated."""
    del needs  # the reason does not depend on what was asked
    pools = inventory.pools_for(node=node, labels=node_labels)
    return INVALID_POOLS if any(pool.invalid_reason is not None for pool in pools) else CANNOT_ALLOCATE


def _config(search: _Search, c: int) -> tuple[Json, ...]:
    """The claim's devices.config: each class's config once (naming every request of that class), then the claim's
    own entries that name no request or an allocated one (once per such request, as kube-scheduler repeats them)."""
    claim = search.claims[c]
    config: list[Json] = []
    class_entries: dict[str, list[Json]] = {}
    for r, need in enumerate(claim.requests):
        request = search.requests[(c, r, search.selected.get((c, r), 0))].request
        device_class = request.device_class
        if device_class.name in class_entries:
            for entry in class_entries[device_class.name]:
                entry["requests"].append(request.full_name)
            continue
        entries = [{"source": "FromClass", "requests": [request.full_name], **item} for item in device_class.config]
        class_entries[device_class.name] = entries
        config.extend(entries)
        del need
    for entry in claim.config:
        names = [str(n) for n in entry.get("requests") or []]
        body = {key: value for key, value in entry.items() if key != "requests"}
        claimed: Json = {"source": "FromClaim", **({"requests": names} if names else {}), **body}
        if not names:
            config.append(claimed)
            continue
        for r, need in enumerate(claim.requests):
            if need.name in names:
                config.append(dict(claimed))
                continue
            if need.first_available:
                chosen = need.alternatives[search.selected.get((c, r), 0)]
                if chosen.full_name in names:
                    config.append(dict(claimed))
    return tuple(config)


def _node_selector(chosen: list[tuple[Request, _Candidate]], node: str) -> Json | None:
    """createNodeSelector: a node-local device pins the claim to the node; network-attached devices' selectors are
    merged into one term; devices available everywhere add nothing."""
    fields: list[Json] = []
    expressions: list[Json] = []
    for _, candidate in chosen:
        owner = candidate.device if candidate.slice.per_device else candidate.slice
        if owner.node_name:
            return {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        if owner.node_selector is not None:
            terms = owner.node_selector.raw.get("nodeSelectorTerms") or []
            if len(terms) == 1:
                _merge(terms[0].get("matchFields") or [], fields)
                _merge(terms[0].get("matchExpressions") or [], expressions)
            elif len(terms) > 1:
                raise AllocationError(f"unsupported ResourceSlice.NodeSelector with {len(terms)} terms")
    if not fields and not expressions:
        return None
    term: Json = {}
    if expressions:
        term["matchExpressions"] = expressions
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}


def _merge(requirements: list[Json], into: list[Json]) -> None:
    for requirement in requirements:
        if not any(have.get("key") == requirement.get("key") and have.get("operator") == requirement.get("operator")
                   and set(have.get("values") or []) == set(requirement.get("values") or []) for have in into):
            into.append(dict(requirement))
