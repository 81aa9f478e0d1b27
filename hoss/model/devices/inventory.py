"""The cluster's devices as DRA drivers publish them in ResourceSlices (resource.k8s.io/v1), and the pools a node
can allocate from, with kube-scheduler v1.36's meaning (k8s.io/dynamic-resource-allocation/structured, the
"incubating" allocator its default feature gates pick). Pure, no I/O.

A pool is a driver's (driver, pool name); its newest generation counts, and only once all
``pool.resourceSliceCount`` slices of that generation are there (an incomplete pool allocates nothing; a pool with
a newer generation elsewhere is skipped). For a node, a slice is relevant when it holds shared counters, names the
node (``nodeName``), selects it (``nodeSelector`` over its labels, ``matchFields`` over its name), serves
``allNodes``, or (``perDeviceNodeSelection``) one of its devices does. Pools are ordered by (driver, pool), a
pool's slices by name, a slice's devices as listed: the order in which the allocator tries devices.

A pool whose device names repeat, or whose devices consume a counter its counter sets lack, is invalid: nothing is
allocated from it, and a node that finds no allocation because of it is told so.

A field hoss does not honour (binding conditions, devices shared by several claims, capacity request policies,
list-valued attributes, node-allocatable mappings, or a field v1 does not have) raises `DeviceError` naming it.

Invariant: every `Device` of an `Inventory` has a unique (driver, pool, device) within its pool's slice set of one
generation, or its pool is invalid.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import semver

from hoss.errors import SpecError
from hoss.model.devices.cel import AttributeValue, CelDevice
from hoss.model.objects import section
from hoss.model.resources import parse_quantity

DeviceId = tuple[str, str, str]
"""A device: (driver, pool, device name)."""

CounterId = tuple[str, str, str, str]
"""One shared counter: (driver, pool, counter set, counter)."""

TAINT_EFFECTS_THAT_BLOCK = frozenset({"NoSchedule", "NoExecute"})


class DeviceError(SpecError):
    """A ResourceSlice, DeviceClass or ResourceClaim field hoss cannot read or does not honour; `field` is its JSON
    path, e.g. ``ResourceSlice gpu-node-1: spec.devices[0].bindingConditions``."""


_SLICE_SPEC_FIELDS = frozenset({"driver", "pool", "nodeName", "nodeSelector", "allNodes", "devices",
                                "perDeviceNodeSelection", "sharedCounters"})
_DEVICE_FIELDS = frozenset({"name", "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector",
                            "allNodes", "taints"})
_ATTRIBUTE_KINDS = {"int": int, "bool": bool, "string": str, "version": str}


@dataclass(frozen=True)
class Requirement:
    """One node selector requirement: a label (``matchExpressions``) or ``metadata.name`` (``matchFields``)."""

    key: str
    operator: str
    values: tuple[str, ...]
    on_field: bool = False

    def holds(self, *, node: str, labels: Mapping[str, str]) -> bool:
        value = node if self.on_field else labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        # Gt / Lt: both sides integers (checked when parsed for the selector's side)
        try:
            number = int(value) if value is not None else None
        except ValueError:
            return False
        if number is None:
            return False
        bound = int(self.values[0])
        return number > bound if self.operator == "Gt" else number < bound


@dataclass(frozen=True)
class NodeSelector:
    """A core/v1 NodeSelector: its terms are ORed, a term's requirements ANDed; an empty term matches no node."""

    terms: tuple[tuple[Requirement, ...], ...]
    raw: Mapping[str, Any]

    def matches(self, *, node: str, labels: Mapping[str, str]) -> bool:
        return any(term and all(r.holds(node=node, labels=labels) for r in term) for term in self.terms)


def parse_node_selector(value: object, *, field: str) -> NodeSelector:
    """A NodeSelector as the apiserver validates it; raises DeviceError naming the bad part."""
    if not isinstance(value, dict):
        raise DeviceError(field=field, reason="expected an object")
    raw_terms = value.get("nodeSelectorTerms")
    if not isinstance(raw_terms, list):
        raise DeviceError(field=f"{field}.nodeSelectorTerms", reason="expected a list")
    terms = []
    for t, term in enumerate(raw_terms):
        where = f"{field}.nodeSelectorTerms[{t}]"
        if not isinstance(term, dict):
            raise DeviceError(field=where, reason="expected an object")
        requirements = []
        for part, on_field in (("matchExpressions", False), ("matchFields", True)):
            for r, item in enumerate(term.get(part) or []):
                requirements.append(_requirement(item, field=f"{where}.{part}[{r}]", on_field=on_field))
        terms.append(tuple(requirements))
    return NodeSelector(terms=tuple(terms), raw=value)


def _requirement(item: object, *, field: str, on_field: bool) -> Requirement:
    if not isinstance(item, dict) or not isinstance(item.get("key"), str):
        raise DeviceError(field=field, reason="expected an object with a key")
    operator, values = str(item.get("operator")), item.get("values") or []
    allowed = ("In", "NotIn") if on_field else ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
    if operator not in allowed:
        raise DeviceError(field=f"{field}.operator", reason=f"{operator!r} is not one of {', '.join(allowed)}")
    if on_field and item["key"] != "metadata.name":
        raise DeviceError(field=f"{field}.key", reason=f"{item['key']!r}: only metadata.name is a node field")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise DeviceError(field=f"{field}.values", reason="expected a list of strings")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        raise DeviceError(field=f"{field}.values", reason=f"{operator} needs one integer value")
    return Requirement(key=item["key"], operator=operator, values=tuple(values), on_field=on_field)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Device:
    """One published device. `attributes` keeps the names as published (``model`` or ``gpu.example.com/model``)."""

    id: DeviceId
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, Fraction]
    consumes: tuple[tuple[str, Mapping[str, Fraction]], ...]
    """(counter set, {counter: amount}) per ``consumesCounters`` entry"""
    taints: tuple[Taint, ...] = ()
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False

    @functools.cached_property
    def cel(self) -> CelDevice:
        """The device as a selector sees it: names qualified by their domain, the driver's by default."""
        driver = self.id[0]
        return CelDevice(driver=driver,
                         attributes={_qualified(name, driver): v for name, v in self.attributes.items()},
                         capacity={_qualified(name, driver): v for name, v in self.capacity.items()})

    def attribute(self, qualified: str) -> AttributeValue | None:
        """The attribute a constraint names (``domain/name``): by its full name, or by its bare name when the domain
        is the driver's (lookupAttribute)."""
        if qualified in self.attributes:
            return self.attributes[qualified]
        domain, sep, name = qualified.partition("/")
        if not sep or domain != self.id[0]:
            return None
        return self.attributes.get(name)

    def node_matches(self, *, node: str, labels: Mapping[str, str]) -> bool:
        return _node_matches(self.node_name, self.all_nodes, self.node_selector, node=node, labels=labels)


def _qualified(name: str, driver: str) -> tuple[str, str]:
    domain, sep, rest = name.partition("/")
    return (domain, rest) if sep else (driver, name)


def _node_matches(node_name: str | None, all_nodes: bool, selector: NodeSelector | None, *, node: str,
                  labels: Mapping[str, str]) -> bool:
    if node_name:
        return node_name == node
    if all_nodes:
        return True
    if selector is not None:
        return selector.matches(node=node, labels=labels)
    return False


@dataclass(frozen=True)
class Slice:
    """One ResourceSlice."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[Device, ...]
    counter_sets: tuple[tuple[str, Mapping[str, Fraction]], ...] = ()
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False
    per_device: bool = False

    def relevant_to(self, *, node: str, labels: Mapping[str, str]) -> bool:
        """Whether the slice takes part in allocating for the node (GatherPools)."""
        if self.counter_sets:
            return True
        if self.node_name or self.all_nodes or self.node_selector is not None:
            return _node_matches(self.node_name, self.all_nodes, self.node_selector, node=node, labels=labels)
        if self.per_device:
            return any(device.node_matches(node=node, labels=labels) for device in self.devices)
        return False


@dataclass
class Pool:
    """A pool as one node sees it: the slices with devices it may allocate (sorted by name), the other slices of
    the pool (whose allocated devices still draw on the counters), and the counter sets."""

    driver: str
    name: str
    incomplete: bool = False
    invalid_reason: str | None = None
    slices: list[Slice] = field(default_factory=list)
    other_slices: list[Slice] = field(default_factory=list)
    counter_sets: dict[str, dict[str, Fraction]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"

    @property
    def usable(self) -> bool:
        return not self.incomplete and self.invalid_reason is None

    def all_devices(self) -> Iterable[Device]:
        for slice_ in (*self.slices, *self.other_slices):
            yield from slice_.devices


@dataclass(frozen=True)
class Inventory:
    """All ResourceSlices, parsed. `pools_for` gives what one node can allocate from."""

    slices: tuple[Slice, ...] = ()

    @classmethod
    def from_slices(cls, slices: Iterable[Mapping[str, Any]]) -> Inventory:
        return cls(tuple(parse_slice(item) for item in slices))

    def pools_for(self, *, node: str, labels: Mapping[str, str]) -> list[Pool]:
        """The pools the node can allocate from, in the allocator's order (GatherPools, incubating)."""
        on_node, shared = self._by_node.get(node, []), self._shared
        by_pool: dict[tuple[str, str], list[Slice]] = {}
        for slice_ in (*on_node, *shared):
            if not slice_.relevant_to(node=node, labels=labels):
                continue
            kept = by_pool.setdefault((slice_.driver, slice_.pool), [])
            if kept and slice_.generation < kept[0].generation:
                continue
            if kept and slice_.generation > kept[0].generation:
                kept.clear()
            kept.append(slice_)
        pools = []
        for (driver, pool_name), relevant in by_pool.items():
            generation, wanted = relevant[0].generation, relevant[0].slice_count
            if len(relevant) == wanted:
                pools.append(_build_pool(driver, pool_name, relevant, []))
                continue
            same_pool = [s for s in self.slices if s.driver == driver and s.pool == pool_name]
            if any(s.generation > generation for s in same_pool):
                continue  # the driver is replacing this generation: ignore the pool
            every = [s for s in same_pool if s.generation == generation]
            if len(every) != wanted:
                pools.append(Pool(driver=driver, name=pool_name, incomplete=True))
                continue
            names = {s.name for s in relevant}
            pools.append(_build_pool(driver, pool_name, relevant, [s for s in every if s.name not in names]))
        pools.sort(key=lambda p: (p.driver, p.name))
        return pools

    @functools.cached_property
    def _by_node(self) -> dict[str, list[Slice]]:
        """Slices of one node's own (nodeName, no shared counters), by node."""
        index: dict[str, list[Slice]] = {}
        for slice_ in self.slices:
            if slice_.node_name and not slice_.counter_sets:
                index.setdefault(slice_.node_name, []).append(slice_)
        return index

    @functools.cached_property
    def _shared(self) -> list[Slice]:
        """Slices any node may use: network-attached, for all nodes, per device, or holding counters."""
        return [s for s in self.slices if not s.node_name or s.counter_sets]

    def device(self, device_id: DeviceId) -> Device | None:
        """The device of that id in the newest generation of its pool that has it, if any."""
        found: tuple[int, Device] | None = None
        for slice_ in self.slices:
            if (slice_.driver, slice_.pool) != device_id[:2] or (found and found[0] >= slice_.generation):
                continue
            for device in slice_.devices:
                if device.id == device_id:
                    found = (slice_.generation, device)
        return found[1] if found else None


def _build_pool(driver: str, name: str, relevant: list[Slice], others: list[Slice]) -> Pool:
    relevant = sorted(relevant, key=lambda s: s.name)
    pool = Pool(driver=driver, name=name, slices=[s for s in relevant if not s.counter_sets], other_slices=others)
    seen: set[str] = set()
    for slice_ in pool.slices:
        for device in slice_.devices:
            if device.id[2] in seen:
                pool.invalid_reason = f"duplicate device name {device.id[2]}"
                return pool
            seen.add(device.id[2])
    for slice_ in relevant:
        for set_name, counters in slice_.counter_sets:
            if set_name in pool.counter_sets:
                pool.invalid_reason = f"duplicate counter set name {set_name}"
                return pool
            pool.counter_sets[set_name] = dict(counters)
    for slice_ in (*relevant, *others):
        for device in slice_.devices:
            for set_name, counters in device.consumes:
                if set_name not in pool.counter_sets:
                    pool.invalid_reason = f"counter set {set_name} not found"
                    return pool
                for counter in counters:
                    if counter not in pool.counter_sets[set_name]:
                        pool.invalid_reason = f"counter {counter} not found in counter set {set_name}"
                        return pool
    return pool


def parse_slice(item: Mapping[str, Any]) -> Slice:
    """One ResourceSlice (resource.k8s.io/v1); raises DeviceError naming a field it cannot read or hoss does not
    honour."""
    name = str(section(item, "metadata").get("name", ""))
    where = f"ResourceSlice {name}: spec"
    spec = item.get("spec")
    if not isinstance(spec, dict):
        raise DeviceError(field=where, reason="expected an object")
    _refuse_unknown(spec, _SLICE_SPEC_FIELDS, where=where)
    driver = _string(spec.get("driver"), field=f"{where}.driver")
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        raise DeviceError(field=f"{where}.pool", reason="expected an object")
    node_selector = spec.get("nodeSelector")
    counter_sets = tuple(_counter_set(entry, field=f"{where}.sharedCounters[{i}]")
                         for i, entry in enumerate(_list(spec.get("sharedCounters"), field=f"{where}.sharedCounters")))
    pool_name = _string(pool.get("name"), field=f"{where}.pool.name")
    return Slice(
        name=name, driver=driver, pool=pool_name,
        generation=_integer(pool.get("generation", 0), field=f"{where}.pool.generation"),
        slice_count=_integer(pool.get("resourceSliceCount"), field=f"{where}.pool.resourceSliceCount"),
        devices=tuple(_device(entry, driver=driver, pool=pool_name, field=f"{where}.devices[{i}]")
                      for i, entry in enumerate(_list(spec.get("devices"), field=f"{where}.devices"))),
        counter_sets=counter_sets,
        node_name=spec.get("nodeName") or None,
        node_selector=None if node_selector is None else parse_node_selector(node_selector,
                                                                               field=f"{where}.nodeSelector"),
        all_nodes=spec.get("allNodes") is True,
        per_device=spec.get("perDeviceNodeSelection") is True,
    )


def _device(item: object, *, driver: str, pool: str, field: str) -> Device:
    if not isinstance(item, dict):
        raise DeviceError(field=field, reason="expected an object")
    for flag in ("bindsToNode", "allowMultipleAllocations"):
        if item.get(flag) is True:
            raise DeviceError(field=f"{field}.{flag}", reason="not supported by hoss")
    present = {key for key, value in item.items() if value not in (None, False, [], {})}
    _refuse_unknown({key: item[key] for key in present}, _DEVICE_FIELDS, where=field)
    name = _string(item.get("name"), field=f"{field}.name")
    attributes = {str(key): _attribute(value, field=f"{field}.attributes[{key}]")
                  for key, value in _mapping(item.get("attributes"), field=f"{field}.attributes").items()}
    capacity = {}
    for key, value in _mapping(item.get("capacity"), field=f"{field}.capacity").items():
        where = f"{field}.capacity[{key}]"
        if not isinstance(value, dict):
            raise DeviceError(field=where, reason="expected an object")
        if value.get("requestPolicy") is not None:
            raise DeviceError(field=f"{where}.requestPolicy", reason="not supported by hoss")
        capacity[str(key)] = _quantity(value.get("value"), field=f"{where}.value")
    consumes = tuple(_counter_set(entry, field=f"{field}.consumesCounters[{i}]", name_key="counterSet")
                     for i, entry in enumerate(_list(item.get("consumesCounters"), field=f"{field}.consumesCounters")))
    taints = []
    for i, taint in enumerate(_list(item.get("taints"), field=f"{field}.taints")):
        if not isinstance(taint, dict):
            raise DeviceError(field=f"{field}.taints[{i}]", reason="expected an object")
        taints.append(Taint(key=str(taint.get("key", "")), value=str(taint.get("value", "")),
                            effect=str(taint.get("effect", ""))))
    selector = item.get("nodeSelector")
    return Device(id=(driver, pool, name), attributes=attributes, capacity=capacity, consumes=consumes,
                  taints=tuple(taints), node_name=item.get("nodeName") or None,
                  node_selector=None if selector is None else parse_node_selector(selector,
                                                                                  field=f"{field}.nodeSelector"),
                  all_nodes=item.get("allNodes") is True)


def _attribute(value: object, *, field: str) -> AttributeValue:
    if not isinstance(value, dict):
        raise DeviceError(field=field, reason="expected an object")
    set_kinds = [key for key, item in value.items() if item is not None]
    for key in set_kinds:
        if key not in _ATTRIBUTE_KINDS:
            raise DeviceError(field=f"{field}.{key}", reason="not supported by hoss (a single int, bool, string "
                              "or version is)")
    if len(set_kinds) != 1:
        raise DeviceError(field=field, reason="exactly one of int, bool, string, version must be set")
    kind = set_kinds[0]
    item = value[kind]
    expected = _ATTRIBUTE_KINDS[kind]
    if not isinstance(item, expected) or (expected is int and isinstance(item, bool)):
        raise DeviceError(field=f"{field}.{kind}", reason=f"expected a {kind}")
    if isinstance(item, str) and kind == "version":
        try:
            return semver.Version.parse(item)
        except ValueError as error:
            raise DeviceError(field=f"{field}.version", reason=str(error)) from error
    if isinstance(item, int | str):  # bool is an int
        return item
    raise DeviceError(field=f"{field}.{kind}", reason=f"expected a {kind}")


def _counter_set(item: object, *, field: str, name_key: str = "name") -> tuple[str, Mapping[str, Fraction]]:
    if not isinstance(item, dict):
        raise DeviceError(field=field, reason="expected an object")
    counters = {}
    for key, value in _mapping(item.get("counters"), field=f"{field}.counters").items():
        if not isinstance(value, dict):
            raise DeviceError(field=f"{field}.counters[{key}]", reason="expected an object")
        counters[str(key)] = _quantity(value.get("value"), field=f"{field}.counters[{key}].value")
    return _string(item.get(name_key), field=f"{field}.{name_key}"), counters


def _quantity(value: object, *, field: str) -> Fraction:
    if not isinstance(value, str | int | float):
        raise DeviceError(field=field, reason="expected a quantity")
    return parse_quantity(value, field=field)


def _refuse_unknown(item: Mapping[str, Any], known: frozenset[str], *, where: str) -> None:
    for key in item:
        if key not in known:
            raise DeviceError(field=f"{where}.{key}", reason="not supported by hoss")


def _string(value: object, *, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise DeviceError(field=field, reason="expected a non-empty string")
    return value


def _integer(value: object, *, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise DeviceError(field=field, reason="expected an integer")
    return value


def _list(value: object, *, field: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise DeviceError(field=field, reason="expected a list")
    return value


def _mapping(value: object, *, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DeviceError(field=field, reason="expected an object")
    return value
