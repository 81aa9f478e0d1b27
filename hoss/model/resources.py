"""Resource arithmetic: Kubernetes quantities, a pod's effective request, a node's allocatable. Pure, no I/O.

Everything leaves this module as a `ResourceVector`: resource name -> non-negative integer in base units
(milli-CPU for ``cpu``; bytes for memory, ephemeral-storage and hugepages; counts for everything else).
Conversions round up, as Kubernetes does, so a request is never under-counted. Every value is at most
`MAX_UNITS` (2**53), the largest integer the ledger's Lua scripts (which compute in doubles) handle exactly.
Raw payloads are the JSON dicts the apiserver returns (camelCase keys); bad input raises `QuantityError`,
`PodSpecError` or `NodeSpecError` naming the field by its JSON path.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import orjson

from hoss.errors import NodeSpecError, PodSpecError, QuantityError, SpecError

ResourceVector = dict[str, int]
"""Resource name -> amount in base units (milli-CPU, bytes, counts)."""

_Amount = TypeVar("_Amount", int, Fraction)
_Quantities = dict[str, Fraction]

MAX_UNITS = 2**53
"""Largest amount of one resource, in base units, the ledger stores exactly."""

_MAX_QUANTITY_LENGTH = 64
_MAX_EXPONENT = 64

_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"(?P<sign>[+-]?)(?P<integer>[0-9]*)(?:\.(?P<fraction>[0-9]*))?(?P<suffix>.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE](?P<exponent>[+-]?[0-9]+)")

_SIDECAR_RESTART_POLICY = "Always"
_BYTE_RESOURCES = frozenset({"memory", "ephemeral-storage", "storage"})
_HUGEPAGES_PREFIX = "hugepages-"


# Quantity strings already parsed (valid ones only): a cluster's pods repeat a few dozen of them ("100m", "128Mi"),
# and the sync and the webhook parse every new pod's. Bounded: cleared when full.
_PARSED: dict[str, Fraction] = {}
_PARSED_MAX = 4096


def parse_quantity(value: str | int | float, *, field: str) -> Fraction:
    """Parse a Kubernetes quantity (``500m``, ``1.5Gi``, ``12.5e2``, ``+3``, or a JSON number) exactly.

    Negative quantities are rejected: nothing the scheduler counts can be below zero.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(field=field, value=value, reason="expected a string or a number")
    if isinstance(value, int):
        amount = Fraction(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(field=field, value=value, reason="not a finite number")
        # The shortest repr is what the JSON said; Fraction(value) would keep the binary rounding error.
        amount = Fraction(repr(value))
    else:
        cached = _PARSED.get(value)
        if cached is not None:
            return cached
        amount = _parse_quantity_string(value, field=field)
        if amount >= 0:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[value] = amount
    if amount < 0:
        raise QuantityError(field=field, value=value, reason="must not be negative")
    return amount


def _parse_quantity_string(text: str, *, field: str) -> Fraction:
    if not text:
        raise QuantityError(field=field, value=text, reason="empty")
    if len(text) > _MAX_QUANTITY_LENGTH:
        raise QuantityError(field=field, value=text, reason=f"longer than {_MAX_QUANTITY_LENGTH} characters")
    match = _QUANTITY.fullmatch(text)
    if match is None or not (match["integer"] or match["fraction"]):
        raise QuantityError(
            field=field,
            value=text,
            reason="expected a number with an optional suffix (n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei) "
            "or exponent (e3, E-3)",
        )
    integer, fraction = match["integer"], match["fraction"] or ""
    mantissa = Fraction(int(integer + fraction), 10 ** len(fraction))
    if match["sign"] == "-":
        mantissa = -mantissa
    return mantissa * _multiplier(match["suffix"], text=text, field=field)


def _multiplier(suffix: str, *, text: str, field: str) -> Fraction:
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    exponent_match = _EXPONENT.fullmatch(suffix)
    if exponent_match is None:
        raise QuantityError(field=field, value=text, reason=f"unknown suffix {suffix!r}")
    exponent = int(exponent_match["exponent"])
    if abs(exponent) > _MAX_EXPONENT:
        raise QuantityError(field=field, value=text, reason=f"exponent {exponent} is out of range")
    return Fraction(10) ** exponent


def to_base_units(resource: str, q: Fraction) -> int:
    """Whole base units of `q`, rounded up: milli-CPU for ``cpu`` (0.0001 cpu -> 1), plain units otherwise."""
    if resource == "cpu":
        return math.ceil(q * 1000)
    return math.ceil(q)


def add(a: Mapping[str, _Amount], b: Mapping[str, _Amount]) -> dict[str, _Amount]:
    """Per-resource sum; a resource missing from one side counts as 0."""
    total = dict(a)
    for resource, amount in b.items():
        total[resource] = total.get(resource, 0) + amount
    return total


def subtract(a: Mapping[str, int], b: Mapping[str, int]) -> ResourceVector:
    """Per-resource difference ``a - b`` (e.g. free = allocatable - used); may be negative when overcommitted."""
    return add(a, {resource: -amount for resource, amount in b.items()})


def fits(requested: Mapping[str, int], free: Mapping[str, int]) -> str | None:
    """The first requested resource (in `requested`'s order) that exceeds `free`, or None when all fit.

    A resource requested at 0 always fits; a resource missing from `free` has no room (so a GPU pod never fits
    a node without GPUs). This is the same rule the ledger's scripts apply.
    """
    for resource, amount in requested.items():
        if amount > 0 and amount > free.get(resource, 0):
            return resource
    return None


def format_quantity(resource: str, units: int) -> str:
    """`units` of `resource` as a Kubernetes quantity for messages: ``1500m`` / ``2`` cpu, ``512Mi``, ``3``."""
    if resource == "cpu":
        return str(units // 1000) if units % 1000 == 0 else f"{units}m"
    if resource in _BYTE_RESOURCES or resource.startswith(_HUGEPAGES_PREFIX):
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if units and units % _SUFFIXES[suffix] == 0:
                return f"{units // _SUFFIXES[suffix]}{suffix}"
    return str(units)


def _maximum(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> _Quantities:
    peak = dict(a)
    for resource, amount in b.items():
        peak[resource] = max(peak.get(resource, Fraction(0)), amount)
    return peak


def pod_requests(pod: Mapping[str, Any]) -> ResourceVector:
    """The pod's effective request, as kube-scheduler computes it for the fit check.

    App containers run together, so their requests add up. Init containers run one after another: a sidecar
    (``restartPolicy: Always``) keeps running from its start for the pod's lifetime, so it adds to the app
    containers and to every later init step; a normal init step needs its own request plus the sidecars
    started before it. Per resource, the pod needs the larger of the two phases. Pod-level
    ``spec.resources.requests`` replace the aggregate for the resources they name, then ``spec.overhead`` is
    added. ``pods`` is always 1; resources requested at 0 are left out.

    In-place resize, as kube-scheduler counts it (``UseStatusResources``): a container (or sidecar) whose status
    reports resources needs the larger of its spec requests, its ``allocatedResources`` and its actuated
    ``resources.requests``; while the pod's ``PodResizePending`` condition says ``Infeasible``, the spec's
    requests are left out (the kubelet will not grant them). A pod without such status counts its spec.
    """
    spec = _mapping(pod.get("spec"), field="spec", error=PodSpecError)
    containers = _list(spec.get("containers"), field="spec.containers")
    if not containers:
        raise PodSpecError(field="spec.containers", reason="must list at least one container")
    statuses = _status_requests(pod.get("status"))
    key = None if statuses else _spec_key(spec)
    if key is not None:
        known = _COMPUTED.get(key)
        if known is not None:
            return dict(known)
    vector = _pod_requests(spec, containers, statuses, pod.get("status"))
    if key is not None:
        if len(_COMPUTED) >= _COMPUTED_MAX:
            _COMPUTED.clear()
        _COMPUTED[key] = dict(vector)
    return vector


# Requests already computed, by the spec fields a request depends on (for pods whose status reports no container
# resources): the pods of one Job or ReplicaSet share a template, and the sync, the workers and the reservations
# compute every new pod's. Bounded: cleared when full. Only successes are kept, so a bad spec raises every time.
_COMPUTED: dict[bytes, ResourceVector] = {}
_COMPUTED_MAX = 4096


def _spec_key(spec: Mapping[str, Any]) -> bytes | None:
    """Every spec field `_pod_requests` reads, serialised (orjson keeps types apart: "1" and 1, 1 and 1.0, true and
    1); None when the spec holds something JSON cannot say (then the request is computed each time)."""
    try:
        return orjson.dumps(
            (spec.get("containers"), spec.get("initContainers"), spec.get("resources"), spec.get("overhead"))
        )
    except TypeError:
        return None


def _pod_requests(
    spec: Mapping[str, Any], containers: list[Any], statuses: dict[str, _Quantities], status: object
) -> ResourceVector:
    infeasible = bool(statuses) and _resize_infeasible(status)

    def effective(container: object, field: str) -> _Quantities:
        request = _container_requests(container, field=field)
        name = container.get("name") if isinstance(container, Mapping) else None
        status = statuses.get(name) if isinstance(name, str) else None
        if status is None:
            return request
        return _maximum({} if infeasible else request, status)

    # Sums and maxima are taken on exact quantities and rounded once, as kube-scheduler does.
    running: _Quantities = {}
    for index, container in enumerate(containers):
        running = add(running, effective(container, f"spec.containers[{index}]"))

    sidecars: _Quantities = {}
    init_peak: _Quantities = {}
    for index, container in enumerate(_list(spec.get("initContainers"), field="spec.initContainers")):
        field = f"spec.initContainers[{index}]"
        request = _container_requests(container, field=field)
        if _restart_policy(container, field=field) == _SIDECAR_RESTART_POLICY:
            request = effective(container, field)
            running = add(running, request)
            sidecars = add(sidecars, request)
            step = sidecars
        else:
            step = add(request, sidecars)
        init_peak = _maximum(init_peak, step)

    total = _maximum(running, init_peak)
    total.update(_requests_of(spec.get("resources"), field="spec.resources"))
    total = add(total, _quantities(spec.get("overhead"), field="spec.overhead", error=PodSpecError))
    vector: ResourceVector = {}
    for resource, amount in total.items():
        units = to_base_units(resource, amount)
        if units > MAX_UNITS:
            raise PodSpecError(field="spec", reason=f"the pod's {resource} request is more than {MAX_UNITS} base units")
        if units > 0:
            vector[resource] = units
    vector["pods"] = 1
    return vector


NODE_RESERVATION_ANNOTATION = "node.koordinator.sh/reservation"
"""Koordinator's node annotation for resources kept back from pods (system daemons, headroom): JSON
``{"resources": {"cpu": "5", "memory": "4Gi"}}``; ``reservedCPUs`` (a cpuset such as ``"0-3,8"``) counts as that
many CPUs and wins over ``resources.cpu``, as in Koordinator."""
_CPUSET = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


def node_allocatable(node: Mapping[str, Any]) -> ResourceVector:
    """The room pods may use on the node: ``status.allocatable`` (or ``status.capacity`` when allocatable is not
    reported yet) less what its `NODE_RESERVATION_ANNOTATION` keeps back (never below zero). A malformed
    annotation is ignored here; `node_reservation` names the problem."""
    status = _mapping(node.get("status"), field="status", error=NodeSpecError)
    for field in ("allocatable", "capacity"):
        if status.get(field):
            quantities = _quantities(status[field], field=f"status.{field}", error=NodeSpecError)
            allocatable = {resource: to_base_units(resource, amount) for resource, amount in quantities.items()}
            try:
                reserved = node_reservation(node)
            except NodeSpecError:
                return allocatable
            return {resource: max(0, amount - reserved.get(resource, 0)) for resource, amount in allocatable.items()}
    raise NodeSpecError(field="status.allocatable", reason="missing, and so is status.capacity")


def node_reservation(node: Mapping[str, Any]) -> ResourceVector:
    """What the node's `NODE_RESERVATION_ANNOTATION` keeps back from pods ({} without the annotation); raises
    NodeSpecError naming the annotation and its value when it is not the JSON Koordinator defines."""
    metadata = node.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    raw = annotations.get(NODE_RESERVATION_ANNOTATION) if isinstance(annotations, Mapping) else None
    if raw is None:
        return {}
    field = f"metadata.annotations[{NODE_RESERVATION_ANNOTATION}]"

    def bad(reason: str) -> NodeSpecError:
        return NodeSpecError(field=field, reason=f"{reason} (value {str(raw)[:200]!r}); the annotation is ignored")

    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError as error:
        raise bad(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise bad('expected a JSON object like {"resources": {"cpu": "5"}}')
    try:
        quantities = _quantities(value.get("resources"), field=f"{field}.resources", error=NodeSpecError)
    except (QuantityError, NodeSpecError) as error:
        amount = f" {error.value!r}" if isinstance(error, QuantityError) else ""
        raise bad(f"{error.field.removeprefix(field + '.')}: invalid{amount}: {error.reason}") from None
    reserved = {resource: to_base_units(resource, amount) for resource, amount in quantities.items()}
    cpus = value.get("reservedCPUs")
    if cpus not in (None, ""):
        if not isinstance(cpus, str) or not _CPUSET.fullmatch(cpus.replace(" ", "")):
            raise bad(f"reservedCPUs {cpus!r} is not a cpuset such as \"0-3,8\"")
        ids: set[int] = set()
        for part in cpus.replace(" ", "").split(","):
            first, _, last = part.partition("-")
            ids.update(range(int(first), int(last or first) + 1))
        reserved["cpu"] = len(ids) * 1000
    return reserved


def _container_requests(container: object, *, field: str) -> _Quantities:
    resources = _mapping(container, field=field, error=PodSpecError).get("resources")
    return _requests_of(resources, field=f"{field}.resources")


def _status_requests(status: object) -> dict[str, _Quantities]:
    """Container name -> the larger of its ``allocatedResources`` and actuated ``resources.requests``, for the
    containers and init containers whose status reports ``resources`` (kube-scheduler reads a status only then)."""
    if not isinstance(status, Mapping):
        return {}
    found: dict[str, _Quantities] = {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for index, item in enumerate(_list(status.get(key), field=f"status.{key}")):
            field = f"status.{key}[{index}]"
            entry = _mapping(item, field=field, error=PodSpecError)
            name = entry.get("name")
            resources = entry.get("resources")
            if not isinstance(name, str) or resources is None:
                continue
            actuated = _quantities(_mapping(resources, field=f"{field}.resources", error=PodSpecError)
                                   .get("requests"), field=f"{field}.resources.requests", error=PodSpecError)
            allocated = _quantities(entry.get("allocatedResources"), field=f"{field}.allocatedResources",
                                    error=PodSpecError)
            found[name] = _maximum(actuated, allocated)
    return found


def _resize_infeasible(status: object) -> bool:
    """The pod's PodResizePending condition says Infeasible (kube-scheduler then ignores the spec's requests)."""
    if not isinstance(status, Mapping):
        return False
    for condition in _list(status.get("conditions"), field="status.conditions"):
        if isinstance(condition, Mapping) and condition.get("type") == "PodResizePending":
            return condition.get("reason") == "Infeasible"
    return False


def status_resources_key(pod: Mapping[str, Any]) -> str:
    """A cheap fingerprint of what `pod_requests` reads from the status (container resources and allocated
    resources, the resize condition): the sync recomputes a pod's request when it changes."""
    status = pod.get("status")
    if not isinstance(status, Mapping):
        return ""
    parts: list[str] = []
    for key in ("containerStatuses", "initContainerStatuses"):
        items = status.get(key)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping) and (item.get("resources") is not None or item.get("allocatedResources")):
                parts.append(f"{item.get('name')}:{item.get('resources')}:{item.get('allocatedResources')}")
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, Mapping) and condition.get("type") == "PodResizePending":
            parts.append(f"resize:{condition.get('reason')}")
    return "|".join(parts)


def _requests_of(resources: object, *, field: str) -> _Quantities:
    """Requests of a ``resources`` block; a resource with a limit but no request is requested at its limit.

    The apiserver defaults requests to limits this way, but pods built by tests or read from other sources may
    not have been defaulted.
    """
    if resources is None:
        return {}
    block = _mapping(resources, field=field, error=PodSpecError)
    requests = _quantities(block.get("requests"), field=f"{field}.requests", error=PodSpecError)
    limits = _quantities(block.get("limits"), field=f"{field}.limits", error=PodSpecError)
    return {**limits, **requests}


def _quantities(block: object, *, field: str, error: type[SpecError]) -> _Quantities:
    """A resource list (``requests``, ``limits``, ``overhead``, ``allocatable``) parsed exactly."""
    if block is None:
        return {}
    quantities: _Quantities = {}
    for resource, value in _mapping(block, field=field, error=error).items():
        amount = parse_quantity(value, field=f"{field}.{resource}")
        if to_base_units(resource, amount) > MAX_UNITS:
            raise QuantityError(field=f"{field}.{resource}", value=value, reason=f"more than {MAX_UNITS} base units")
        quantities[resource] = amount
    return quantities


def _restart_policy(container: Mapping[str, Any], *, field: str) -> str | None:
    policy = container.get("restartPolicy")
    if policy is not None and not isinstance(policy, str):
        raise PodSpecError(field=f"{field}.restartPolicy", reason=f"expected a string, got {type(policy).__name__}")
    return policy


def _mapping(value: object, *, field: str, error: type[SpecError]) -> Mapping[str, Any]:
    if value is None:
        raise error(field=field, reason="missing")
    if not isinstance(value, Mapping):
        raise error(field=field, reason=f"expected an object, got {type(value).__name__}")
    return value


def _list(value: object, *, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodSpecError(field=field, reason=f"expected a list, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class GpuSpread:
    """How the GPUs of a set of nodes are spread (GPU nodes only: those with allocatable GPUs)."""

    gpu_nodes: int
    fully_free_nodes: int
    partly_used_nodes: int
    full_nodes: int
    gpus: int
    used_gpus: int
    stranded_gpus: int
    """Free GPUs on partly used nodes: too few together for a job that needs a whole node."""


def gpu_spread(nodes: Iterable[tuple[int, int]]) -> GpuSpread:
    """The spread of (allocatable, used) GPUs per node; an overcommitted node counts as full."""
    free_nodes = partly_used = full = stranded = gpus = used_gpus = 0
    for alloc, used in nodes:
        if alloc <= 0:
            continue
        gpus += alloc
        used_gpus += used
        if used <= 0:
            free_nodes += 1
        elif used >= alloc:
            full += 1
        else:
            partly_used += 1
            stranded += alloc - used
    return GpuSpread(gpu_nodes=free_nodes + partly_used + full, fully_free_nodes=free_nodes,
                     partly_used_nodes=partly_used, full_nodes=full, gpus=gpus, used_gpus=used_gpus,
                     stranded_gpus=stranded)
